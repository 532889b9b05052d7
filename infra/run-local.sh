#!/usr/bin/env bash
# The run command: MongoDB (infra), the Pub/Sub emulator and the service (gunicorn),
# then a sample batch of partner events published and watched until processed.
# Everything stays up afterwards; `make stop` (infra/stop-local.sh) stops it all.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/venv.sh
PY=.venv/bin/python
mkdir -p var
export PORT=${PORT:-8080}
export PUBSUB_EMULATOR_HOST=${PUBSUB_EMULATOR_HOST:-127.0.0.1:8085}
export GOOGLE_CLOUD_PROJECT=${GOOGLE_CLOUD_PROJECT:-local-project}
export PUSH_ENDPOINT=${PUSH_ENDPOINT:-http://127.0.0.1:$PORT/}
export PUSH_MIN_BACKOFF=${PUSH_MIN_BACKOFF:-1s}

echo "== MongoDB"; $PY -m infra.localdb start
MONGODB_URI=${MONGODB_URI:-$($PY -m infra.localdb uri)}
export MONGODB_URI
echo "== Pub/Sub emulator"; ./pubsub-emulator.sh start

echo "== service on :$PORT (log: var/service.log)"
if ! curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
  setsid .venv/bin/gunicorn -c gunicorn.conf.py main:app >var/service.log 2>&1 &
  echo $! >var/service.pid
fi
for _ in $(seq 1 60); do
  curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null || {
  echo "run: the service did not answer /health within 30 s; see var/service.log" >&2; exit 1; }

echo "== demo"
$PY -m eventbus demo
cat <<MSG

The service is still running on http://127.0.0.1:$PORT/ (log: var/service.log).
Publish more:  .venv/bin/python -m eventbus publish samples/partner_events.json
Statuses:      .venv/bin/python -m eventbus status
Stop it all:   make stop
MSG
