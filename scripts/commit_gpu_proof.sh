#!/usr/bin/env bash
# Here, after the GPU run: unpack what the device command returned and commit it.
#
#   bash scripts/commit_gpu_proof.sh <files_at>/proof-<gpu>-<date>.tar.gz [--no-commit]
#
# 1. unpacks the tarball in the repository root (-> bench/results/<gpu>-<date>/);
# 2. runs the local part there (tuner proof --call local: report, sampler study, summary);
# 3. puts the window's state folder (bench/results/<gpu>-<date>/tuned/<device>/: every window's tables,
#    manifest, studies journal) in place of tuned/<device>/, each table the window has not finished
#    marked partial in the manifest (scripts/mark_partial.py), and its landscape, if any, beside the
#    committed ones in landscapes/<device>/;
# 4. adds the run's passed validation cases to bench/validated.json (scripts/record_validation.py: the next
#    GPU run does not run them again while the GPU model, Triton, torch and code are the same);
# 5. commits those paths (git add + commit; --no-commit leaves them staged). $PYTHON: the Python to use.
set -euo pipefail
cd "$(dirname "$0")/.."
tarball=${1:?give the tarball the device command returned}
commit=1
py=${PYTHON:-python3}     # the Python with the project's requirements
[ "${2:-}" = "--no-commit" ] && commit=0
top=$(tar tzf "$tarball" | awk -F/ '!found && $1 == "bench" && $2 == "results" && $3 != "" {print $1 "/" $2 "/" $3; found = 1}')
case "$top" in
  bench/results/?*) ;;
  *) echo "commit_gpu_proof: $tarball does not unpack under bench/results/ ($top)" >&2; exit 2 ;;
esac
tar xzf "$tarball"
gpu=$(basename "$top" | cut -d- -f1)
"$py" -m tuner proof --call local --gpu "$gpu" --out "$top" || true
paths=("$top")
for state in "$top"/tuned/*/; do
  [ -f "$state/manifest.json" ] || continue
  device=$(basename "$state")
  [ "$device" = "CPU_DEVICE" ] && { echo "commit_gpu_proof: $state is a CPU-device rehearsal: not committed under tuned/" >&2; continue; }
  rm -rf "tuned/$device.new" && cp -r "$state" "tuned/$device.new"
  rm -rf "tuned/$device.new/report"
  "$py" scripts/mark_partial.py "tuned/$device.new"
  rm -rf "tuned/$device" && mv "tuned/$device.new" "tuned/$device"
  paths+=("tuned/$device")
  for land in "$top"/landscapes/*.jsonl.gz; do
    [ -f "$land" ] || continue
    mkdir -p "landscapes/$device"
    cp "$land" "landscapes/$device/fp8_gemm.vllm-deepseek-v3-tp8-$(basename "$top").jsonl.gz"
    paths+=("landscapes/$device")
  done
done
if [ -d "$top/validate" ] && "$py" scripts/record_validation.py "$top"; then
  paths+=("bench/validated.json")
fi
git add -- "${paths[@]}"
if [ "$commit" = 1 ]; then
  git commit -q -m "GPU run $(basename "$top") as it came back (bench/results/), its window's tables in tuned/ and landscape in landscapes/" -- "${paths[@]}"
  git log --oneline -1
fi
