#!/usr/bin/env bash
# The GPU proof in one command, for a freshly started, bare GPU machine with no network.
#
#   bash scripts/gpu_proof.sh [--minutes 25] [--gpu H100|H200] [--fake] [tuner proof options...]
#
# Expects, beside the repository (made here by scripts/prepare_gpu_proof.sh and carried):
#   .whl/         Optuna and its dependencies as wheels (the machine's Python has no optuna)
#   .engine-src/  the engines' kernel files (`tuner engine-source extract`), one folder per engine
#   .baselines/   the engines' shipped tables (a copy of ../shared/baselines)
# Results go to bench/results/<gpu>-<date>/ and, when $OUT is set (the device tool), a tarball
# of them and the summary to $OUT. Exit status: tuner proof's (0 fine, 1 a step failed).
set -uo pipefail
cd "$(dirname "$0")/.."
gpu=""
out=""
fake=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --gpu) gpu=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --fake) fake=1; args+=("$1"); shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
if ! python3 -c "import optuna" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      || { echo "gpu_proof: installing the carried wheels failed" >&2; exit 2; }
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  else
    echo "gpu_proof: optuna is missing and no wheels are in .whl/ (run scripts/prepare_gpu_proof.sh and carry .whl)" >&2
    exit 2
  fi
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if [ -z "$gpu" ]; then
  # the device's name decides the --gpu key (H200 or an H100 variant)
  gpu=$(python3 -c "
import torch
name = torch.cuda.get_device_name() if torch.cuda.is_available() else ''
from tuner.gpus import GPUS
print(next((g.key for g in GPUS.values() if g.cuda_name == name), 'H100'))")
fi
# A fake run (no GPU, SYNTHETIC numbers) never writes under bench/results/.
[ -n "$out" ] || out=$([ -n "$fake" ] && echo "runs/proof-fake-$(date +%F)" || echo "bench/results/${gpu}-$(date +%F)")
python3 -m tuner proof --gpu "$gpu" --out "$out" "${args[@]}"
rc=$?
if [ -n "${OUT:-}" ] && [ -d "$out" ]; then
  tar czf "$OUT/proof-${gpu}-$(date +%F).tar.gz" -C "$(dirname "$out")" "$(basename "$out")"
  cp "$out/summary.md" "$OUT/summary.md" 2>/dev/null || true
fi
exit $rc
