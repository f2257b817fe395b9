#!/usr/bin/env bash
# Run here (with network, beside ../shared) before the GPU calls: gathers what the bare GPU
# machine lacks into ignored folders of the repository, small enough to carry (< 64 MiB):
#   .whl/         Optuna, threadpoolctl and the dependencies the device image lacks, exactly the versions
#                 pinned in scripts/gpu_wheels.txt (it has torch, triton, numpy, pandas, pyyaml,
#                 nvidia-ml-py, matplotlib, tqdm, packaging, markupsafe, typing-extensions)
#   .engine-src/  the engines' kernel files, extracted from their wheels ($TUNER_ENGINE_WHEELS)
#   .baselines/   the engines' shipped tables (../shared/baselines)
# Then checks every wheel the proof imports is there, and prints the device call to make
# (bench/README.md has them with their time plan).
set -euo pipefail
cd "$(dirname "$0")/.."
for d in /.whl/ /.engine-src/ /.baselines/; do
  grep -qx "$d" .git/info/exclude 2>/dev/null || echo "$d" >> .git/info/exclude
done
# made afresh: a wheel left from an earlier download would be a second version (pip refuses the install)
rm -rf .whl && mkdir .whl
pins=$(grep -v '^#' scripts/gpu_wheels.txt | grep -v '^[[:space:]]*$')
# shellcheck disable=SC2086 - one argument per pin
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl $pins
python3 -m tuner.jobs.proof_wheels .whl || { echo "prepare_gpu_proof: .whl/ is not the pinned set" >&2; exit 1; }
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
