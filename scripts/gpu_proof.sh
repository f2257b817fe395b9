#!/usr/bin/env bash
# The GPU run on a freshly started, bare GPU machine with no network: ONE device command.
#
#   bash scripts/gpu_proof.sh [--minutes 9] [--gpu H100|H200] [--out DIR] [tuner proof options...]
#
# Expects, beside the repository (made here by scripts/prepare_gpu_proof.sh and carried):
#   .whl/         Optuna, threadpoolctl and their dependencies as wheels (the machine's Python lacks them)
#   .engine-src/  the engines' kernel files (`tuner engine-source extract`), one folder per engine
#   .baselines/   the engines' shipped tables (a copy of ../shared/baselines)
# Runs `tuner proof --call gpu`: environment, smoke, validation, then one window of tuning that
# continues the committed state tuned/<device>/ (carried with the working tree). Results go to
# bench/results/<gpu>-<date>/; when $OUT is set (the device tool), the folder as one tarball (top
# folder bench/results/<gpu>-<date>) and summary.md are rewritten there after every step and
# whenever a table lands. Here, afterwards: bash scripts/commit_gpu_proof.sh <the tarball>.
# Exit status: tuner proof's (0 fine, 1 a step failed, 2 bad input or no GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
gpu=""
out=""
call=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) gpu=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --call|--steps) call=$2; args+=("$1"); shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
if ! python3 -c "import optuna, threadpoolctl" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    # exactly the pinned versions (scripts/gpu_wheels.txt), checked before anything is installed
    python3 -m tuner.jobs.proof_wheels .whl || { echo "gpu_proof: .whl/ is not the pinned set of wheels" >&2; exit 2; }
    # a machine kept warm keeps what an earlier command installed: reused only when made from these very wheels
    stamp=$(cat .whl/*.whl | sha256sum | cut -d' ' -f1)
    if [ "$(cat /tmp/site/.tuner-wheels 2>/dev/null)" != "$stamp" ]; then
      rm -rf /tmp/site
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || { echo "gpu_proof: installing the carried wheels failed" >&2; exit 2; }
      echo "$stamp" > /tmp/site/.tuner-wheels
    fi
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "gpu_proof: optuna or threadpoolctl is missing and no wheels are in .whl/ (run scripts/prepare_gpu_proof.sh and carry .whl)" >&2
    exit 2
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -z "$gpu" ]; then
  # the device's name decides the --gpu key (H200 or an H100 variant)
  gpu=$(python3 -c "
import torch
name = torch.cuda.get_device_name() if torch.cuda.is_available() else ''
from tuner.plan.gpus import GPUS
print(next((g.key for g in GPUS.values() if g.cuda_name == name), 'H100'))")
fi
[ -n "$out" ] || out="bench/results/${gpu}-$(date +%F)"
[ -n "$call" ] || args+=(--call gpu)
echo "gpu_proof: GPU key $gpu, results in $out" >&2
exec python3 -m tuner proof --gpu "$gpu" --out "$out" ${OUT:+--bundle "$OUT"} "${args[@]}"
