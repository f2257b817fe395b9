#!/usr/bin/env bash
# Run here (with network, beside ../shared) before the GPU calls: gathers what the bare GPU
# machine lacks into ignored folders of the repository, small enough to carry (< 64 MiB):
#   .whl/         Optuna, threadpoolctl and the dependencies the device image lacks (alembic, colorlog,
#                 sqlalchemy, mako, greenlet; it has torch, triton, numpy, pandas, pyyaml,
#                 nvidia-ml-py, matplotlib, tqdm, packaging, markupsafe), via ../shared/device/wheels.sh
#   .engine-src/  the engines' kernel files, extracted from their wheels ($TUNER_ENGINE_WHEELS)
#   .baselines/   the engines' shipped tables (../shared/baselines)
# Then checks every wheel the proof imports is there, and prints the device call to make
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
The device call (one command of at most 10 minutes; bench/README.md has its time plan; first, here:
python3 -m tuner proof --plan --gpu H200 --call gpu):
  run(command="bash scripts/gpu_proof.sh --minutes 9",
      carry=[".whl", ".engine-src", ".baselines"], kind="nvidia-h200", timeout_s=595)
  then here: bash scripts/commit_gpu_proof.sh <files_at>/proof-H200-<date>.tar.gz
             (unpacks bench/results/H200-<date>/, runs the local part, puts the window's tables in
             tuned/NVIDIA_H200/ and its landscape in landscapes/NVIDIA_H200/, commits)
If no H200 can be had: the same call with kind="nvidia-h100-x1" (H100 in the names); the window
then starts empty (no committed H100 state).
MSG
