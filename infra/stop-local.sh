#!/usr/bin/env bash
# Stop what infra/run-local.sh started: the service, the emulator, the local database.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
if [ -f var/service.pid ]; then
  kill -TERM -- "-$(cat var/service.pid)" 2>/dev/null || kill -TERM "$(cat var/service.pid)" 2>/dev/null
  rm -f var/service.pid
  echo "service stopped"
fi
./pubsub-emulator.sh stop
.venv/bin/python -m infra.localdb stop
