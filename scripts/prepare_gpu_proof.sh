#!/usr/bin/env bash
# Run here (with network, beside ../shared) before a GPU call: gathers what the bare GPU
# machine lacks into ignored folders of the repository, small enough to carry (< 64 MiB):
#   .whl/         Optuna and its dependencies (../shared/device/wheels.sh)
#   .engine-src/  the engines' kernel files, extracted from their wheels ($TUNER_ENGINE_WHEELS)
#   .baselines/   the engines' shipped tables (../shared/baselines)
# Then prints the device call to make.
set -euo pipefail
cd "$(dirname "$0")/.."
for d in /.whl/ /.engine-src/ /.baselines/; do
  grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude
done
bash ../shared/device/wheels.sh >/dev/null
wheels=${TUNER_ENGINE_WHEELS:-$HOME/.cache/tuner-engine-wheels}
rm -rf .engine-src
for engine in vllm sglang; do
  python3 -m tuner engine-source extract --engine "$engine" --from "$wheels" --out ".engine-src/$engine"
done
rm -rf .baselines && cp -r ../shared/baselines .baselines
du -sh .whl .engine-src .baselines
cat <<'MSG'
Device calls (one command may run 10 minutes; the session has 30 minutes of device time, so
three back-to-back calls, each sending the results of the one before with the working tree):
  run(command="bash scripts/gpu_proof.sh --minutes 9 --steps environment validate landscapes",
      carry=[".whl", ".engine-src", ".baselines"], timeout_s=600)
  (unpack $OUT/proof-*.tar.gz into the repository root: bench/results/<gpu>-<date>/)
  run(command="bash scripts/gpu_proof.sh --minutes 9 --steps tune", carry=[...same], timeout_s=600)
  (unpack again)
  run(command="bash scripts/gpu_proof.sh --minutes 8 --steps bench sampler", carry=[...same], timeout_s=600)
Then unpack, look at bench/results/<gpu>-<date>/summary.md, and commit the folder.
MSG
