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
# The demo empties its database at each run, so it gets one of its own.
export MONGODB_DB=${MONGODB_DB:-partner_events_demo}
PARTNER_PORT=${PARTNER_PORT:-9000}
partner_url="http://127.0.0.1:$PARTNER_PORT/partners/{partnerId}/events"
export EVENTBUS_PARTNER_URL=${EVENTBUS_PARTNER_URL:-$partner_url}

# Start "$2..." in its own session unless var/$1.pid names a live process.
background() {
  local name=$1; shift
  if [ -f "var/$name.pid" ] && kill -0 "$(cat "var/$name.pid")" 2>/dev/null; then return 0; fi
  setsid "$@" >"var/$name.log" 2>&1 &
  echo $! >"var/$name.pid"
}

echo "== MongoDB"; $PY -m localdb start
MONGODB_URI=${MONGODB_URI:-$($PY -m localdb uri)}
export MONGODB_URI
echo "== Pub/Sub emulator"; ./pubsub-emulator.sh start

echo "== partner stub on :$PARTNER_PORT (log: var/partner.log)"
background partner $PY -m infra.partner_stub --port "$PARTNER_PORT"
echo "== service on :$PORT (log: var/service.log)"
if ! curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
  background service .venv/bin/gunicorn -c gunicorn.conf.py main:app
fi
echo "== relay sweeper (log: var/relay.log)"
background relay .venv/bin/eventbus relay --interval 5
for _ in $(seq 1 60); do
  curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null || {
  echo "run: the service did not answer /health within 30 s; see var/service.log" >&2; exit 1; }

echo "== demo"
$PY -m handlers.demo --reset
cat <<MSG

The service is still running on http://127.0.0.1:$PORT/ (log: var/service.log),
with the relay sweeper (var/relay.log) and the partner stub (var/partner.log:
one line per OUT notification the cascades delivered).
Follow a cascade: .venv/bin/eventbus trace <idempotency key>
Publish more:  .venv/bin/eventbus publish handlers/samples/partner_events.json
Statuses:      .venv/bin/eventbus status
Stop it all:   make stop
MSG
