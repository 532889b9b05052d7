#!/usr/bin/env bash
# The run command: MongoDB (infra), the Pub/Sub emulator and the service (gunicorn),
# then a sample batch of partner events published and watched until processed, and the
# operators' web console. Everything stays up afterwards; `make stop` (infra/stop-local.sh)
# stops it all. The local settings go to .env at the repository root, which the `eventbus`
# console script loads, so every command printed at the end works in a fresh shell.
#
#   bash infra/run-local.sh             what `make run` does
#   bash infra/run-local.sh --dry-run   print the addresses and the service's command
#                                       line, start nothing
#
# Environment (defaults in brackets):
#   HOST   the service's listen address [127.0.0.1]: push auth is off locally, so the
#          service takes events from whoever reaches it; HOST=0.0.0.0 opens it to every
#          interface (the emulator still pushes to 127.0.0.1), another address to that one
#   PORT   the service's port [8080]
#   PUSH_ENDPOINT, PUBSUB_EMULATOR_HOST, GOOGLE_CLOUD_PROJECT, PUBSUB_TOPIC, ...: as in
#          pubsub-emulator.sh's header; PARTNER_PORT [9000], EVENTBUS_CONSOLE_PORT [8081],
#          MONGODB_DB [partner_events_demo]; MONGODB_URI: use that server, start none
#
# Shared with other checkouts on this machine: the local database and the emulator (one
# each per cache directory). This checkout records itself as one of their users (a
# claim, `python -m localdb start --dir`, `PUBSUB_EMULATOR_OWNER`), and `make stop` stops
# them only when no other checkout or test run still uses them. The service, sweepers,
# partner stub and console are this checkout's own (pid files in var/).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd -P)
DRY_RUN=0
case "${1:-}" in
  "") ;;
  --dry-run) DRY_RUN=1 ;;
  *) echo "usage: bash infra/run-local.sh [--dry-run]" >&2; exit 2 ;;
esac
PY=.venv/bin/python
export HOST=${HOST:-127.0.0.1}
export PORT=${PORT:-8080}
# Where this machine reaches the service: the listen address, or loopback for "every interface".
case $HOST in
  0.0.0.0) REACH=127.0.0.1 ;;
  *) REACH=$HOST ;;
esac
SERVICE_URL=http://$REACH:$PORT
SERVICE_CMD=(.venv/bin/gunicorn -c gunicorn.conf.py --bind "$HOST:$PORT" main:app)
export PUBSUB_EMULATOR_HOST=${PUBSUB_EMULATOR_HOST:-127.0.0.1:8085}
export GOOGLE_CLOUD_PROJECT=${GOOGLE_CLOUD_PROJECT:-local-project}
export PUSH_ENDPOINT=${PUSH_ENDPOINT:-$SERVICE_URL/}
export PUBSUB_EMULATOR_OWNER=${PUBSUB_EMULATOR_OWNER:-$ROOT}
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
if [ "$DRY_RUN" = 1 ]; then
  cat <<PLAN
service:       ${SERVICE_CMD[*]}
listen:        $HOST:$PORT
service url:   $SERVICE_URL/
push endpoint: $PUSH_ENDPOINT
emulator:      $PUBSUB_EMULATOR_HOST (project $GOOGLE_CLOUD_PROJECT, topic $PUBSUB_TOPIC; user $PUBSUB_EMULATOR_OWNER)
database:      ${MONGODB_URI:-the local database (python -m localdb start --dir $ROOT)}, db $MONGODB_DB
partner stub:  127.0.0.1:$PARTNER_PORT
console:       127.0.0.1:$EVENTBUS_CONSOLE_PORT
PLAN
  exit 0
fi
bash infra/venv.sh
mkdir -p var
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

# True when var/$1.pid names a live process of this checkout (its working directory is
# this checkout's root: a pid reused since by another program does not count).
ours() {
  local pid
  pid=$(cat "var/$1.pid" 2>/dev/null) || return 1
  [[ $pid =~ ^[0-9]+$ ]] && [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$ROOT" ]
}

# Start "$2..." in its own session unless var/$1.pid names a live process of ours.
background() {
  local name=$1; shift
  if ours "$name"; then return 0; fi
  setsid "$@" >"var/$name.log" 2>&1 &
  echo $! >"var/$name.pid"
}

echo "== MongoDB"; $PY -m localdb start --dir "$ROOT"
MONGODB_URI=${MONGODB_URI:-$($PY -m localdb uri)}
export MONGODB_URI
echo "== Pub/Sub emulator"; ./pubsub-emulator.sh start
write_env

echo "== partner stub on :$PARTNER_PORT (log: var/partner.log)"
background partner $PY -m infra.partner_stub --port "$PARTNER_PORT"
echo "== service on $HOST:$PORT (log: var/service.log)"
if ! curl -fsS "$SERVICE_URL/health" >/dev/null 2>&1; then
  background service "${SERVICE_CMD[@]}"
elif ! ours service; then
  echo "run: a service this checkout did not start already answers on :$PORT; the demo uses" \
    "it (another checkout's?). For this checkout's own, set PORT (e.g. PORT=8090 make run)" >&2
fi
echo "== relay sweeper (log: var/relay.log)"
background relay .venv/bin/eventbus relay --interval 5
echo "== redrive sweeper (log: var/redrive.log)"
background redrive .venv/bin/eventbus redrive --interval 60
for _ in $(seq 1 60); do
  curl -fsS "$SERVICE_URL/health" >/dev/null 2>&1 && break
  sleep 0.5
done
curl -fsS "$SERVICE_URL/health" >/dev/null || {
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
listening="on $SERVICE_URL/"
[ "$HOST" = 0.0.0.0 ] && listening="on every interface, port $PORT (HOST=0.0.0.0; push auth is off)"
cat <<MSG

The service is still running $listening (log: var/service.log),
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
