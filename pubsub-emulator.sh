#!/usr/bin/env bash
# The Pub/Sub emulator for local runs and tests, with the event-bus topic,
# its push subscription to the local service, its pull subscription for
# `eventbus worker` and a dead-letter queue.
#
#   ./pubsub-emulator.sh start    start the emulator (a no-op when it runs) and
#                                 create/update the resources; prints a table
#   ./pubsub-emulator.sh stop     release this checkout's use of the emulator; stop it if
#                                 this script started it and no other checkout uses it
#   ./pubsub-emulator.sh stop --force  stop the emulator this script started, whoever uses it
#   ./pubsub-emulator.sh status   up/down, address, log, topics/subscriptions;
#                                 exit 0 when up, 3 when down
#
# Environment (defaults in brackets):
#   PUBSUB_EMULATOR_HOST         host:port to listen on [127.0.0.1:8085]
#   GOOGLE_CLOUD_PROJECT         project [local-project]
#   PUBSUB_EMULATOR_HOME         state directory [${XDG_CACHE_HOME:-~/.cache}/partner-eventbus/pubsub];
#                                per port: <home>/<port>/emulator.log, emulator.pid, data/,
#                                claims/ (who uses it)
#   PUBSUB_EMULATOR_OWNER        the directory using the emulator: `start` records it as a
#                                user (a claim, held while the directory exists, until
#                                the next reboot), `stop` releases it [this script's
#                                directory, i.e. the checkout]
#   PUBSUB_EMULATOR_START_TIMEOUT  seconds to wait for readiness [60]
#   PUBSUB_CREATE_RESOURCES      0 = start the bare emulator, create nothing [1]
#   PUBSUB_TOPIC                 event-bus topic [partner-events]
#   PUBSUB_DEAD_LETTER_TOPIC     [<topic>-dlq]
#   PUBSUB_SUBSCRIPTION          push subscription [<topic>-push]
#   EVENTBUS_PULL_SUBSCRIPTION   the worker's pull subscription, with the push
#                                subscription's ack deadline and policies [<topic>-pull]
#   EVENTBUS_PULL_ORDERED        1: that subscription delivers each ordering key's
#                                messages in order (message ordering) [0]
#   PUBSUB_DEAD_LETTER_SUBSCRIPTION  pull subscription on the DLQ [<dlq topic>-pull]
#   PUSH_ENDPOINT                where the emulator pushes [http://127.0.0.1:8080/]
#   PUSH_ACK_DEADLINE            push timeout = ack deadline, 10..600 [60s]
#   PUSH_MIN_BACKOFF             retry policy minimum, 0..600 [10s]
#   PUSH_MAX_BACKOFF             retry policy maximum, min..600 [600s]
#   PUSH_MAX_DELIVERY_ATTEMPTS   dead-letter after N deliveries, 5..100; 0 = no DLQ [100]
#   PYTHON                       interpreter with google-cloud-pubsub, relative
#                                to this script's directory [.venv/bin/python]
#   GCLOUD                       the gcloud command [gcloud]
#
# Re-running `start` with another PUSH_ENDPOINT or policy updates the existing
# push and pull subscriptions in place. The emulator keeps everything in memory: after a
# stop, the next start creates the resources again.
#
# The state directory is shared by every checkout on the machine (it is under the user's
# cache), so one emulator per port serves them all: `stop` from one checkout leaves it
# running while another checkout's claim is live, and says whose.
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
HOST_PORT=${PUBSUB_EMULATOR_HOST:-127.0.0.1:8085}
PORT=${HOST_PORT##*:}
PROJECT=${GOOGLE_CLOUD_PROJECT:-local-project}
EMULATOR_HOME=${PUBSUB_EMULATOR_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/partner-eventbus/pubsub}
STATE_DIR=$EMULATOR_HOME/$PORT
LOG=$STATE_DIR/emulator.log
PID_FILE=$STATE_DIR/emulator.pid
OWNER=${PUBSUB_EMULATOR_OWNER:-$SCRIPT_DIR}
CLAIMS_DIR=$STATE_DIR/claims
# A copy of the pid file of the emulator a claims-keeping start launched; an emulator whose
# pid file differs was launched by an older pubsub-emulator.sh, whose users are unknown.
MANAGED=$CLAIMS_DIR/.managed
START_TIMEOUT=${PUBSUB_EMULATOR_START_TIMEOUT:-60}
PYTHON=${PYTHON:-.venv/bin/python}
GCLOUD=${GCLOUD:-gcloud}
# Seconds `stop` waits after SIGTERM before SIGKILL.
STOP_GRACE=10

say() { printf '%s\n' "$*"; }
fail() {
  printf 'pubsub-emulator: %s\n' "$*" >&2
  exit 1
}

# Run the Python half from the script's directory so `-m infra.pubsub` and a
# relative PYTHON resolve the same wherever the script is called from.
py() {
  (cd "$SCRIPT_DIR" && PUBSUB_EMULATOR_HOST=$HOST_PORT GOOGLE_CLOUD_PROJECT=$PROJECT \
    "$PYTHON" -m infra.pubsub "$@")
}

# 0: an emulator answers on HOST_PORT, 1: nothing listens, 2: something else does.
probe() {
  local rc=0
  py ping "$HOST_PORT" || rc=$?
  [ "$rc" -le 2 ] || fail "cannot run '$PYTHON -m infra.pubsub' from $SCRIPT_DIR (exit $rc)"
  return "$rc"
}

# Start time (clock ticks since boot) of a live process, for telling it apart
# from a later process that got the same pid.
start_ticks() {
  local stat fields
  { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
  read -r -a fields <<<"${stat##*) }"
  [ "${fields[0]}" != Z ] || return 1
  printf '%s' "${fields[19]}"
}

# Reads the pid file ("<group id> <leader start ticks>") into PGID and TICKS.
read_pid_file() {
  PGID="" TICKS=""
  if [ -f "$PID_FILE" ]; then read -r PGID TICKS <"$PID_FILE" || true; fi
  [[ $PGID =~ ^[0-9]+$ ]]
}

# True while the recorded group still holds our emulator: its leader (gcloud)
# with the recorded start time, or a member (java) whose command line names
# our port. Either guards against a pid reused after a reboot.
group_alive() {
  [ -n "$TICKS" ] && [ "$(start_ticks "$PGID" || true)" = "$TICKS" ] && return 0
  pgrep -g "$PGID" -f "pubsub.*[=:]$PORT( |\$)" >/dev/null 2>&1
}

# --- who uses the emulator: one claim file per owner directory in $CLAIMS_DIR ---

boot_id() { cat /proc/sys/kernel/random/boot_id 2>/dev/null || true; }

claim_file() { printf '%s/%s.claim' "$CLAIMS_DIR" "$(printf '%s' "$1" | sha256sum | cut -c1-16)"; }

add_claim() {
  mkdir -p "$CLAIMS_DIR"
  printf '%s\n%s\n' "$(boot_id)" "$OWNER" >"$(claim_file "$OWNER")"
}

# True when OWNER's claim was recorded; removes it.
release_claim() {
  local file
  file=$(claim_file "$OWNER")
  [ -f "$file" ] || return 1
  rm -f "$file"
}

# The owners of the live claims (same boot, directory still there), one a line; the
# released ones are deleted, unless $1 is "keep" (status, which holds no lock).
live_claims() {
  local file boot owner now keep=${1:-}
  now=$(boot_id)
  for file in "$CLAIMS_DIR"/*.claim; do
    [ -f "$file" ] || continue
    boot="" owner=""
    { read -r boot; read -r owner; } <"$file" || true
    if [ "$boot" = "$now" ] && [ -n "$owner" ] && [ -d "$owner" ]; then
      printf '%s\n' "$owner"
    elif [ "$keep" != keep ]; then
      rm -f "$file"
    fi
  done
}

joined() { paste -sd, - | sed 's/,/, /g'; }

last_log_line() {
  local line
  line=$(grep -v '^[[:space:]]*$' "$LOG" 2>/dev/null | tail -n 1 || true)
  printf '%s' "${line#\[pubsub\] }"
}

launch() {
  mkdir -p "$STATE_DIR/data"
  [ -f "$LOG" ] && mv -f "$LOG" "$LOG.prev"
  # setsid: the emulator gets its own process group (gcloud's python plus its
  # java child), which `stop` signals as a whole. The inner shell records its
  # own pid, which setsid made the group id, then becomes gcloud. 9>&- keeps
  # the lock's descriptor out of the emulator, or it would hold the lock forever.
  # shellcheck disable=SC2016  # $$ and $1 belong to the inner shell
  CLOUDSDK_CORE_DISABLE_PROMPTS=1 setsid bash -c 'echo "$$" >"$1"; shift; exec "$@"' _ \
    "$PID_FILE" "$GCLOUD" beta emulators pubsub start \
    --host-port="$HOST_PORT" --data-dir="$STATE_DIR/data" --project="$PROJECT" \
    </dev/null >>"$LOG" 2>&1 9>&- &
  local waited=0
  until [ -s "$PID_FILE" ] || [ $waited -ge 50 ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  read_pid_file || return 0
  TICKS=$(start_ticks "$PGID" || true)
  printf '%s %s\n' "$PGID" "$TICKS" >"$PID_FILE"
}

wait_ready() {
  local deadline=$((SECONDS + START_TIMEOUT))
  until probe; do
    if ! group_alive; then
      rm -f "$PID_FILE"
      fail "the emulator exited before it was ready on $HOST_PORT ($(last_log_line)); log: $LOG"
    fi
    if [ $SECONDS -ge $deadline ]; then
      terminate || true
      rm -f "$PID_FILE"
      fail "the emulator was not ready on $HOST_PORT after ${START_TIMEOUT}s ($(last_log_line)); log: $LOG"
    fi
    sleep 0.25
  done
}

# SIGTERM the whole group, then SIGKILL what is left after STOP_GRACE seconds.
terminate() {
  local i
  kill -TERM -- "-$PGID" 2>/dev/null || true
  for ((i = 0; i < STOP_GRACE * 10; i++)); do
    group_alive || return 0
    sleep 0.1
  done
  kill -KILL -- "-$PGID" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    group_alive || return 0
    sleep 0.1
  done
  return 1
}

# Serialise start/stop per port so two callers never launch two emulators.
lock() {
  mkdir -p "$STATE_DIR"
  exec 9>"$STATE_DIR/lock"
  flock -w $((START_TIMEOUT + 30)) 9 || fail "another pubsub-emulator.sh holds $STATE_DIR/lock"
}

require() {
  command -v "$GCLOUD" >/dev/null 2>&1 ||
    fail "'$GCLOUD' not found: install the Google Cloud CLI with the pubsub-emulator component"
  command -v java >/dev/null 2>&1 || fail "java not found: the emulator needs Java 11+"
  (cd "$SCRIPT_DIR" && command -v "$PYTHON" >/dev/null 2>&1) ||
    fail "PYTHON=$PYTHON not found from $SCRIPT_DIR: create the venv (make venv) or set PYTHON"
  local tool
  for tool in pgrep setsid flock; do
    command -v "$tool" >/dev/null 2>&1 || fail "'$tool' not found (procps/util-linux)"
  done
}

cmd_start() {
  require
  py check || exit 2
  [ -d "$OWNER" ] || fail "PUBSUB_EMULATOR_OWNER=$OWNER is not a directory; name the checkout that uses the emulator"
  lock
  local rc=0
  if read_pid_file && group_alive; then
    wait_ready
    say "emulator already running on $HOST_PORT (process group $PGID; log: $LOG)"
  else
    rm -f "$PID_FILE"
    probe || rc=$?
    case $rc in
      0) say "an emulator not started by this script answers on $HOST_PORT; using it" ;;
      2) fail "$HOST_PORT is taken by something that is not a Pub/Sub emulator" ;;
      *)
        launch
        read_pid_file || fail "the emulator did not start; log: $LOG"
        wait_ready
        mkdir -p "$CLAIMS_DIR"
        cp "$PID_FILE" "$MANAGED"
        say "emulator started on $HOST_PORT (process group $PGID; log: $LOG)"
        ;;
    esac
  fi
  add_claim
  if [ "${PUBSUB_CREATE_RESOURCES:-1}" != 0 ]; then
    py ensure || fail "could not create the resources on $HOST_PORT (see above); log: $LOG"
  fi
}

cmd_stop() {
  local force=$1 held=0 others
  lock
  release_claim && held=1
  others=$(live_claims | joined)
  if ! read_pid_file; then
    say "no emulator started by this script on $HOST_PORT (no $PID_FILE); nothing to stop"
    return 0
  fi
  if ! group_alive; then
    rm -f "$PID_FILE" "$MANAGED"
    say "emulator on $HOST_PORT was not running; removed the stale $PID_FILE"
    return 0
  fi
  if [ -z "$force" ]; then
    if [ -n "$others" ]; then
      [ "$held" = 1 ] && say "released the claim of $OWNER on the emulator"
      say "emulator on $HOST_PORT left running: used by $others"
      return 0
    fi
    if [ "$held" = 0 ]; then
      say "emulator on $HOST_PORT left running: $OWNER holds no claim on it (its users' claims" \
        "are released); \`./pubsub-emulator.sh stop --force\` stops it"
      return 0
    fi
    if ! cmp -s "$PID_FILE" "$MANAGED"; then
      say "emulator on $HOST_PORT left running: started by a pubsub-emulator.sh that records no" \
        "claims (an older checkout?), so it may still be in use; \`./pubsub-emulator.sh stop" \
        "--force\` stops it"
      return 0
    fi
  fi
  terminate || fail "process group $PGID survived SIGKILL; see: pgrep -a -g $PGID"
  rm -f "$PID_FILE" "$MANAGED" "$CLAIMS_DIR"/*.claim
  say "emulator on $HOST_PORT stopped (process group $PGID)"
  if [ -n "$others" ]; then say "--force: stopped although used by $others"; fi
}

cmd_status() {
  local owner="not started by this script" rc=0 users
  if read_pid_file && group_alive; then
    owner="process group $PGID, started by this script"
  fi
  probe || rc=$?
  if [ "$rc" -ne 0 ]; then
    say "pubsub emulator: down"
    say "address: $HOST_PORT"
    say "log: $LOG"
    return 3
  fi
  say "pubsub emulator: up"
  say "address: $HOST_PORT (project $PROJECT; $owner)"
  say "log: $LOG"
  users=$(live_claims keep | joined)
  say "used by: ${users:-no claim}"
  py list
}

case "${1:-}" in
  start) cmd_start ;;
  stop)
    case "${2:-}" in
      "" | --force) cmd_stop "${2:-}" ;;
      *) fail "usage: ./pubsub-emulator.sh stop [--force]" ;;
    esac
    ;;
  status) cmd_status ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
