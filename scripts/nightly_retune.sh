#!/usr/bin/env bash
# Nightly retune, ready for cron or a CI scheduler. A crontab line that works as written
# (cron gives a bare environment: name the Python of the environment tuner is installed in):
#   0 2 * * *  /srv/tuner/scripts/nightly_retune.sh --python /srv/tuner/.venv/bin/python configs/nightly.yaml
# - a lock (flock) so two nights never overlap: a second start exits 75 at once;
# - the night's folder is named by date, so a night that crashed resumes when started again;
# - a log per night under logs/;
# - exit status: 0 fine, 3 a table regressed, 1 a job failed (or no Python with tuner),
#   2 bad arguments, 75 another night is running.
set -uo pipefail

usage() {
  cat <<'EOF'
usage: scripts/nightly_retune.sh [--python PYTHON] [--minutes M] [CONFIG]

One night of `tuner nightly CONFIG` (default configs/nightly.yaml, relative to the
repository), under a lock, logged to logs/nightly-<date>.log.

  --python PYTHON  the Python of the environment tuner is installed in (default:
                   $TUNER_PYTHON, else the repository's .venv/bin/python, else python3
                   on PATH); cron runs with a bare environment, so give it there
  --minutes M      the night's slot: the jobs share M minutes, and what is left
                   goes on the next night (tuner nightly --minutes)
  -h, --help       this text

Exit status: 0 fine, 3 a table regressed, 1 a job failed or PYTHON cannot import tuner,
2 bad arguments, 75 another night is still running. $TUNER_NIGHT names the night
(default: today's date).
EOF
}

python=${TUNER_PYTHON:-}
config=""
minutes=()
while [ $# -gt 0 ]; do
  case $1 in
    -h|--help) usage; exit 0 ;;
    --python) [ $# -ge 2 ] || { echo "nightly: --python needs a path (see --help)" >&2; exit 2; }
              python=$2; shift 2 ;;
    --python=*) python=${1#--python=}; shift ;;
    --minutes) [ $# -ge 2 ] || { echo "nightly: --minutes needs a number of minutes (see --help)" >&2; exit 2; }
               minutes=(--minutes "$2"); shift 2 ;;
    --minutes=*) minutes=(--minutes "${1#--minutes=}"); shift ;;
    -*) echo "nightly: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) [ -z "$config" ] || { echo "nightly: one CONFIG only, got $config and $1 (see --help)" >&2; exit 2; }
       config=$1; shift ;;
  esac
done
if [ ${#minutes[@]} -gt 0 ] && ! [[ ${minutes[1]} =~ ^[0-9]+([.][0-9]+)?$|^[.][0-9]+$ ]]; then
  echo "nightly: --minutes must be a number of minutes, such as 30, not '${minutes[1]}' (see --help)" >&2; exit 2
fi
config=${config:-configs/nightly.yaml}
# a CONFIG that exists from here is taken from here, anything else from the repository
if [ -e "$config" ]; then config=$(cd "$(dirname "$config")" && pwd)/$(basename "$config"); fi
case $python in */*) [ -e "$python" ] && python=$(cd "$(dirname "$python")" && pwd)/$(basename "$python") ;; esac
cd "$(dirname "$0")/.."
if [ -z "$python" ]; then
  if [ -x .venv/bin/python ]; then python=.venv/bin/python; else python=python3; fi
fi
mkdir -p logs
night=${TUNER_NIGHT:-$(date +%F)}
log="logs/nightly-$night.log"
exec 9>"logs/.nightly.lock"
if ! flock -n 9; then
  echo "nightly: another night is still running (logs/.nightly.lock)" >&2
  exit 75
fi
if ! "$python" -c "import tuner" >/dev/null 2>&1; then
  msg="nightly: $python cannot import tuner; give --python with the Python of the environment tuner is installed in"
  echo "=== $(date -Is) $msg" >>"$log"
  echo "$msg" >&2
  exit 1
fi
echo "=== $(date -Is) night $night, config $config, python $python${minutes[*]:+, ${minutes[*]}}" >>"$log"
"$python" -m tuner nightly "$config" --night "$night" "${minutes[@]}" >>"$log" 2>&1
rc=$?
echo "=== $(date -Is) exit $rc" >>"$log"
case $rc in
  0) ;;
  3) echo "nightly: a table regressed; see $log and runs/nightly/$night/report.md" >&2 ;;
  *) echo "nightly: failed (exit $rc); see $log" >&2 ;;
esac
exit $rc
