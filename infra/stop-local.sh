#!/usr/bin/env bash
# Stop what infra/run-local.sh started: the console, the service, the emulator, the local database.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
for name in console redrive relay service partner; do
  if [ -f "var/$name.pid" ]; then
    kill -TERM -- "-$(cat "var/$name.pid")" 2>/dev/null || kill -TERM "$(cat "var/$name.pid")" 2>/dev/null
    rm -f "var/$name.pid"
    echo "$name stopped"
  fi
done
./pubsub-emulator.sh stop
.venv/bin/python -m localdb stop
