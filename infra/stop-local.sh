#!/usr/bin/env bash
# Stop what infra/run-local.sh started from this checkout: the console, the sweepers, the
# service and the partner stub (this checkout's pid files in var/), then this checkout's use
# of the emulator and of the local database. Those two are shared by every checkout on the
# machine (one each per cache directory): each is stopped only when no other checkout or
# test run still uses it, and the script says which ones keep it running.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd -P)
for name in console redrive relay service partner; do
  [ -f "var/$name.pid" ] || continue
  pid=$(cat "var/$name.pid")
  # Only a process of this checkout (its working directory is this checkout's root): a pid
  # reused since by another program is never signalled.
  if [[ $pid =~ ^[0-9]+$ ]] && [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$ROOT" ]; then
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    echo "$name stopped (pid $pid)"
  else
    echo "$name was not running (removed the stale var/$name.pid)"
  fi
  rm -f "var/$name.pid"
done
PUBSUB_EMULATOR_OWNER=${PUBSUB_EMULATOR_OWNER:-$ROOT} ./pubsub-emulator.sh stop
.venv/bin/python -m localdb stop --dir "$ROOT"
