#!/usr/bin/env bash
# Run here (with network, beside ../shared) before the GPU calls: gathers what the bare GPU
# machine lacks into ignored folders of the repository, small enough to carry (< 64 MiB):
#   .whl/         Optuna, threadpoolctl and the dependencies the device image lacks (alembic, colorlog,
#                 sqlalchemy, mako, greenlet; it has torch, triton, numpy, pandas, pyyaml,
#                 nvidia-ml-py, matplotlib, tqdm, packaging, markupsafe), via ../shared/device/wheels.sh
#   .engine-src/  the engines' kernel files, extracted from their wheels ($TUNER_ENGINE_WHEELS)
#   .baselines/   the engines' shipped tables (../shared/baselines)
# Then checks every wheel the proof imports is there, and prints the device calls to make
# (bench/README.md has them with their time plan).
set -euo pipefail
cd "$(dirname "$0")/.."
for d in /.whl/ /.engine-src/ /.baselines/; do
  grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude
done
bash ../shared/device/wheels.sh "threadpoolctl" >/dev/null
missing=()
for dist in optuna threadpoolctl alembic colorlog sqlalchemy mako; do
  ls .whl | grep -qi "^${dist}-" || missing+=("$dist")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "prepare_gpu_proof: no wheel in .whl/ for: ${missing[*]} (the device image lacks them)" >&2
  exit 1
fi
wheels=${TUNER_ENGINE_WHEELS:-$HOME/.cache/tuner-engine-wheels}
rm -rf .engine-src
for engine in vllm sglang; do
  python3 -m tuner engine-source extract --engine "$engine" --from "$wheels" --out ".engine-src/$engine"
done
rm -rf .baselines && cp -r ../shared/baselines .baselines
du -sh .whl .engine-src .baselines
cat <<'MSG'
Device calls (15 minutes of device time in all; see bench/README.md for the time plan):
  run(command="bash scripts/gpu_proof.sh --call 1 --minutes 4.5",
      carry=[".whl", ".engine-src", ".baselines"], kind="nvidia-h200", timeout_s=325)
  then here: tar xzf <files_at>/proof-H200-<date>.tar.gz   (puts back bench/results/H200-<date>/;
             call 2 continues that folder only if it is unpacked BEFORE call 2: the working tree travels;
             make call 2 at once: within 30 s the machine is still warm and no start is paid)
  run(command="bash scripts/gpu_proof.sh --call 2 --minutes 3.5",
      carry=[".whl", ".engine-src", ".baselines"], kind="nvidia-h200", timeout_s=265)
  then here: tar xzf <files_at>/proof-H200-<date>.tar.gz
             python3 -m tuner proof --call local --gpu H200 --out bench/results/H200-<date>
If no H200 can be had: the same two calls with kind="nvidia-h100-x1" (H100 in the names);
neither engine ships a DeepSeek-V3 TP8 MoE table for the H100, so the MoE bench has no shipped
contender there. Keep both calls on one kind.
MSG
