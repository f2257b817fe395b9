#!/usr/bin/env bash
# Nightly retune, ready for cron or a CI scheduler:
#   0 2 * * *  cd /srv/tuner && scripts/nightly_retune.sh configs/nightly.yaml
# - a lock (flock) so two nights never overlap: a second start exits 75 at once;
# - the night's folder is named by date, so a night that crashed resumes when started again;
# - a log per night under logs/;
# - exit status: 0 fine, 3 a table regressed, 1 a job failed, 75 another night is running.
set -uo pipefail
config=${1:-configs/nightly.yaml}
cd "$(dirname "$0")/.."
mkdir -p logs
night=${TUNER_NIGHT:-$(date +%F)}
log="logs/nightly-$night.log"
exec 9>"logs/.nightly.lock"
if ! flock -n 9; then
  echo "nightly: another night is still running (logs/.nightly.lock)" >&2
  exit 75
fi
echo "=== $(date -Is) night $night, config $config" >>"$log"
python3 -m tuner nightly "$config" --night "$night" >>"$log" 2>&1
rc=$?
echo "=== $(date -Is) exit $rc" >>"$log"
case $rc in
  0) ;;
  3) echo "nightly: a table regressed; see $log and runs/nightly/$night/report.md" >&2 ;;
  *) echo "nightly: failed (exit $rc); see $log" >&2 ;;
esac
exit $rc
