#!/usr/bin/env bash
# The test command: install, lint, type-check, start the local database, run every test.
# Extra arguments go to the main pytest run (e.g. infra/test.sh -k envelope).
#
# The main suite runs on pytest-xdist workers (pyproject.toml); beside it run ruff,
# mypy, the Pulumi program's tests and the localdb tool's checks, which need none of
# its servers (Pulumi's mocks; a gateway of their own on a free port), so they use the
# CPU the main suite leaves idle while its longest tests wait. Each phase prints
# its time; the budgets are in README.md (Tests).
set -euo pipefail
cd "$(dirname "$0")/.."
began=$SECONDS
phase() { echo "== $1 ($((SECONDS - began)) s)"; }

phase "venv"; bash infra/venv.sh
PY=.venv/bin/python

started_db="" side="" db_job=""
mkdir -p var
side_log=var/test-side.log db_log=var/test-localdb.log side_rc=var/test-side.rc
cleanup() {
  if [ -n "$db_job" ]; then
    # Never cut a provisioning short: the next run would start it over.
    echo "test: waiting for the local database to finish starting (log: $db_log)" >&2
    wait "$db_job" 2>/dev/null || true
  fi
  if [ -n "$side" ]; then kill -- "-$side" 2>/dev/null || true; wait "$side" 2>/dev/null || true; fi
  # Releases this run's claim; the database stops only if no other checkout or test run
  # uses it (localdb's claims), and only if this run started it.
  if [ -n "$started_db" ]; then $PY -m localdb stop --pid $$ || true; fi
}
trap cleanup EXIT
# The local database starts in the background while the sources are compiled: on a fresh
# machine its first start provisions it (minutes, mostly downloads). It is shared by every
# checkout on the machine: this run claims it for as long as this shell runs (--pid $$),
# so another checkout's `make stop` leaves it running meanwhile.
if [ -z "${MONGODB_URI:-}" ]; then
  if ! $PY -m localdb status >/dev/null 2>&1; then started_db=1; fi
  phase "localdb: starting (log: $db_log)"
  $PY -m localdb start --pid $$ >/dev/null 2>"$db_log" &
  db_job=$!
fi

# Bytecode caches are written during the run (Python's default; they are gitignored) even
# where the shell sets PYTHONDONTWRITEBYTECODE: without them each of pytest's xdist workers
# rewrote the asserts of every test module again (about 5 s of CPU each, before its first
# test), and every service and CLI process the tests start compiled the project again.
unset PYTHONDONTWRITEBYTECODE
# The project's own modules compiled once, up front (compileall skips what is up to date),
# rather than by the first few processes that import them at the same time.
phase "compile"; $PY -m compileall -q -j 0 src handlers main.py tests bench infra/pubsub infra/localdb/src >/dev/null

if [ -n "$db_job" ]; then
  phase "localdb: waiting for it"
  db_status=0
  wait "$db_job" || db_status=$?
  db_job=""
  cat "$db_log"
  [ "$db_status" -eq 0 ] || { echo "test: the local database did not start" >&2; exit 1; }
  MONGODB_URI=$($PY -m localdb uri)
  export MONGODB_URI
fi
# The console's browser tests drive Debian's Chromium (never a downloaded build).
command -v chromium >/dev/null 2>&1 || { phase "chromium"; apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } || echo "test: could not install chromium; the browser tests need it" >&2
# The clock-skew tests shift a service's wall clock with Debian's libfaketime (infra/faketime;
# gcc builds its shim into var/ when they start).
[ -n "$(ls /usr/lib/*/faketime/libfaketimeMT.so.1 2>/dev/null)" ] || { phase "faketime"; apt-get update -q >/dev/null && apt-get install -y -q faketime >/dev/null; } || echo "test: could not install faketime; the clock-skew tests need it" >&2

# In a process group of its own (setsid), so that an interrupted run stops all of it, and
# at a lower CPU priority (nice): they take what the main suite leaves idle, and never
# slow its longest test, which sets the run's time.
# ruff and mypy run there too, first: a lint or type error still fails the run (after the
# main suite), and the main suite starts about ten seconds sooner.
phase "ruff, mypy, deploy and localdb suites started beside the main suite (output: $side_log)"
rm -f "$side_rc"
setsid nice -n 10 bash -c '
  set -euo pipefail
  # The verdict goes to a file as well as the exit status: the wait builtin can answer 127 for a
  # child it has already reaped (it did in CI after 262 s, with every suite passed).
  trap "echo \$? > $0" EXIT
  start=$SECONDS
  echo "== ruff (0 s)"
  .venv/bin/ruff check .
  echo "== mypy ($((SECONDS - start)) s)"
  .venv/bin/mypy src handlers infra main.py
  echo "== deploy: the Pulumi stack'"'"'s offline tests ($((SECONDS - start)) s)"
  bash infra/deploy/test.sh
  echo "== localdb: ruff, mypy, its own tests ($((SECONDS - start)) s)"
  (cd infra/localdb && ../../.venv/bin/ruff check . && ../../.venv/bin/mypy src)
  .venv/bin/python -m pytest infra/localdb/tests
  echo "== ruff, mypy, deploy and localdb suites passed in $((SECONDS - start)) s"
' "$side_rc" >"$side_log" 2>&1 &
side=$!

phase "pytest on the xdist workers (MongoDB at $MONGODB_URI)"
main_status=0
$PY -m pytest -m "not alone" "$@" || main_status=$?
# Tests marked alone(reason=...) cannot share the machine (see each one's reason).
# When no test file names the marker, this second pytest run (seconds of collecting
# every test to select none) is skipped.
alone_status=0
if grep -rqs --include='*.py' 'mark\.alone' tests; then
  phase "pytest: the tests that run alone"
  $PY -m pytest -m alone -n 0 "$@" || alone_status=$?
  [ "$alone_status" -eq 5 ] && alone_status=0  # none selected (e.g. -k chose others)
else
  phase "pytest: no test is marked alone"
fi
[ "$main_status" -eq 0 ] && main_status=$alone_status
phase "main suite done (exit $main_status); waiting for ruff, mypy and the deploy and localdb suites"
wait "$side" 2>/dev/null || true
while kill -0 "$side" 2>/dev/null; do sleep 1; done
side=""
side_status=$(cat "$side_rc" 2>/dev/null || echo "no verdict")
cat "$side_log"
phase "all done (main suite exit $main_status; ruff, mypy, deploy and localdb suites exit $side_status)"
[ "$main_status" -eq 0 ] && [ "$side_status" -eq 0 ]
