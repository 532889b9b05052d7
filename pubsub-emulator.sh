#!/usr/bin/env bash
# The Pub/Sub emulator for local runs and tests, with the event-bus topic,
# its push subscription to the local service, its pull subscription for
# `eventbus worker` and a dead-letter queue.
#
#   ./pubsub-emulator.sh start    start the emulator (a no-op when it runs) and
#                                 create/update the resources; prints a table
#   ./pubsub-emulator.sh stop     stop the emulator this script started
#   ./pubsub-emulator.sh status   up/down, address, log, topics/subscriptions;
#                                 exit 0 when up, 3 when down
#
# Environment (defaults in brackets):
#   PUBSUB_EMULATOR_HOST         host:port to listen on [127.0.0.1:8085]
#   GOOGLE_CLOUD_PROJECT         project [local-project]
#   PUBSUB_EMULATOR_HOME         state directory [${XDG_CACHE_HOME:-~/.cache}/partner-eventbus/pubsub];
#                                per port: <home>/<port>/emulator.log, emulator.pid, data/
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
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
HOST_PORT=${PUBSUB_EMULATOR_HOST:-127.0.0.1:8085}
PORT=${HOST_PORT##*:}
PROJECT=${GOOGLE_CLOUD_PROJECT:-local-project}
EMULATOR_HOME=${PUBSUB_EMULATOR_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/partner-eventbus/pubsub}
STATE_DIR=$EMULATOR_HOME/$PORT
LOG=$STATE_DIR/emulator.log
PID_FILE=$STATE_DIR/emulator.pid
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
        say "emulator started on $HOST_PORT (process group $PGID; log: $LOG)"
        ;;
    esac
  fi
  if [ "${PUBSUB_CREATE_RESOURCES:-1}" != 0 ]; then
    py ensure || fail "could not create the resources on $HOST_PORT (see above); log: $LOG"
  fi
}

cmd_stop() {
  lock
  if ! read_pid_file; then
    say "no emulator started by this script on $HOST_PORT (no $PID_FILE); nothing to stop"
    return 0
  fi
  if ! group_alive; then
    rm -f "$PID_FILE"
    say "emulator on $HOST_PORT was not running; removed the stale $PID_FILE"
    return 0
  fi
  terminate || fail "process group $PGID survived SIGKILL; see: pgrep -a -g $PGID"
  rm -f "$PID_FILE"
  say "emulator on $HOST_PORT stopped (process group $PGID)"
}

cmd_status() {
  local owner="not started by this script" rc=0
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
  py list
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
