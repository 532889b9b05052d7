#!/usr/bin/env bash
# The run command: MongoDB (infra), the Pub/Sub emulator and the service (gunicorn),
# then a sample batch of partner events published and watched until processed, and the
# operators' web console. Everything stays up afterwards; `make stop` (infra/stop-local.sh)
# stops it all. The local settings go to .env at the repository root, which the `eventbus`
# console script loads, so every command printed at the end works in a fresh shell.
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
export PUBSUB_TOPIC=${PUBSUB_TOPIC:-partner-events}
# The worker's pull subscription: pubsub-emulator.sh creates it, `eventbus worker` pulls it.
export EVENTBUS_PULL_SUBSCRIPTION=${EVENTBUS_PULL_SUBSCRIPTION:-$PUBSUB_TOPIC-pull}
export EVENTBUS_CONSOLE_PORT=${EVENTBUS_CONSOLE_PORT:-8081}
# The console's token outlives a restart (kept in .env), so an open browser tab keeps working.
saved_token=""
[ -f .env ] && saved_token=$(sed -n 's/^EVENTBUS_CONSOLE_TOKEN=//p' .env | tail -1)
export EVENTBUS_CONSOLE_TOKEN=${EVENTBUS_CONSOLE_TOKEN:-${saved_token:-$($PY -c 'import secrets; print(secrets.token_urlsafe(24))')}}

# Write the local settings where the `eventbus` commands find them (see src/eventbus/ops/config.py).
write_env() {
  local tmp=.env.tmp.$$
  (umask 077; cat >"$tmp" <<ENV
# Written by \`make run\` (infra/run-local.sh): the local environment of the eventbus commands.
# The eventbus console script loads this file; variables set in the shell win over it.
MONGODB_URI=$MONGODB_URI
MONGODB_DB=$MONGODB_DB
PUBSUB_EMULATOR_HOST=$PUBSUB_EMULATOR_HOST
GOOGLE_CLOUD_PROJECT=$GOOGLE_CLOUD_PROJECT
PUBSUB_TOPIC=$PUBSUB_TOPIC
PUBSUB_SUBSCRIPTION=$PUBSUB_TOPIC-push
PUBSUB_DEAD_LETTER_SUBSCRIPTION=$PUBSUB_TOPIC-dlq-pull
EVENTBUS_PULL_SUBSCRIPTION=$EVENTBUS_PULL_SUBSCRIPTION
EVENTBUS_PARTNER_URL=$EVENTBUS_PARTNER_URL
EVENTBUS_APP=main:app
EVENTBUS_CONSOLE_PORT=$EVENTBUS_CONSOLE_PORT
EVENTBUS_CONSOLE_TOKEN=$EVENTBUS_CONSOLE_TOKEN
ENV
  )
  mv "$tmp" .env
}

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
write_env

echo "== partner stub on :$PARTNER_PORT (log: var/partner.log)"
background partner $PY -m infra.partner_stub --port "$PARTNER_PORT"
echo "== service on :$PORT (log: var/service.log)"
if ! curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
  background service .venv/bin/gunicorn -c gunicorn.conf.py main:app
fi
echo "== relay sweeper (log: var/relay.log)"
background relay .venv/bin/eventbus relay --interval 5
echo "== redrive sweeper (log: var/redrive.log)"
background redrive .venv/bin/eventbus redrive --interval 60
for _ in $(seq 1 60); do
  curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -fsS "http://127.0.0.1:$PORT/health" >/dev/null || {
  echo "run: the service did not answer /health within 30 s; see var/service.log" >&2; exit 1; }

echo "== demo"
if ! $PY -m handlers.demo --reset; then
  echo "run: the demo did not finish in time (see above); the console shows what is stored" >&2
fi
echo "== console on 127.0.0.1:$EVENTBUS_CONSOLE_PORT (log: var/console.log)"
background console .venv/bin/eventbus console
console_url="http://127.0.0.1:$EVENTBUS_CONSOLE_PORT/?token=$EVENTBUS_CONSOLE_TOKEN"
for _ in $(seq 1 40); do
  curl -fsS -o /dev/null "$console_url" 2>/dev/null && break
  sleep 0.5
done
# Real keys and a real partner for the examples below, quoted for the shell.
failed_key=$(.venv/bin/eventbus failed --final --list --json 2>/dev/null | $PY -c \
  'import json, shlex, sys; e = [x["key"] for x in json.load(sys.stdin)["events"] if not x["key"].startswith("invalid:")]; print(shlex.quote(e[0]) if e else "")' \
  2>/dev/null || true)
partner=6231cfc8800d284c981b3146
cat <<MSG

The service is still running on http://127.0.0.1:$PORT/ (log: var/service.log),
with the relay and redrive sweepers (var/relay.log, var/redrive.log) and the
partner stub (var/partner.log: one line per OUT notification the cascades
delivered). The local settings are
in .env, which every eventbus command below reads.
Console:         $console_url
Statuses:        .venv/bin/eventbus status
Failed, grouped: .venv/bin/eventbus failed
One event:       .venv/bin/eventbus show ${failed_key:-<idempotency key>}
Its cascade:     .venv/bin/eventbus trace ${failed_key:-<idempotency key>}
Replay (dry run): .venv/bin/eventbus replay --final --dry-run
Partner history: .venv/bin/eventbus history --partner $partner
Backoff:         .venv/bin/eventbus retries
Last 24 hours:   .venv/bin/eventbus stats
Dead letters:    .venv/bin/eventbus dlq drain
Publish more:    .venv/bin/eventbus publish handlers/samples/partner_events.json
Public topic:    .venv/bin/eventbus peek order-status
                 (what the app forwarded to its public topic, from order-status-local;
                 contracts in docs/contracts/, see docs/PUBLIC_TOPICS.md)
Pull worker:     .venv/bin/eventbus worker
                 (the same handlers over $EVENTBUS_PULL_SUBSCRIPTION, which holds every event
                 published since the emulator started; those push has finished are acked
                 as duplicates. Push or pull: docs/PUSH_OR_PULL.md)
Stop it all:     make stop
MSG
