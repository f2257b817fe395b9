#!/usr/bin/env bash
# A throw-away PostgreSQL server on loopback for the distributed-worker tests.
#   scripts/ci_postgres.sh start DIR   -> prints the storage URL on stdout
#   scripts/ci_postgres.sh stop DIR
# Installs Debian's postgresql when it is missing. The server runs as the postgres user
# (it refuses root), listens on 127.0.0.1 only, and keeps everything under DIR.
set -euo pipefail
cmd=$1 dir=$2 port=${TUNER_PG_PORT:-54329}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
case $cmd in
start)
  if [ -z "$bin" ]; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql) >&2
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
  id postgres >/dev/null 2>&1 || useradd --system --home "$dir" postgres
  mkdir -p "$dir" && chown postgres "$dir"
  as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
  as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust >/dev/null
  # the first free port from TUNER_PG_PORT on: a second .ci/run on the same machine (a fresh clone
  # checked beside a run still going) found 54329 taken, could not start its server and stopped
  for _ in $(seq 20); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || break; port=$((port + 1)); done
  as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200" start >/dev/null
  as_pg "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -qc "CREATE DATABASE tuner" >/dev/null
  echo "postgresql://postgres@127.0.0.1:$port/tuner"
  ;;
stop)
  if [ -n "$bin" ] && [ -d "$dir/data" ]; then
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$bin/pg_ctl" -D "$dir/data" -m fast stop >/dev/null || true
    else "$bin/pg_ctl" -D "$dir/data" -m fast stop >/dev/null || true; fi
  fi
  rm -rf "$dir"
  ;;
esac
