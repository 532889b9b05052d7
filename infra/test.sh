#!/usr/bin/env bash
# The test command: install, lint, type-check, start the local database, run every test.
# Extra arguments go to pytest (e.g. infra/test.sh -k envelope).
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/venv.sh
PY=.venv/bin/python

echo "== ruff"; .venv/bin/ruff check .
echo "== mypy"; .venv/bin/mypy src handlers infra main.py

started_db=""
cleanup() {
  if [ -n "$started_db" ]; then $PY -m localdb stop || true; fi
}
trap cleanup EXIT
if [ -z "${MONGODB_URI:-}" ]; then
  if ! $PY -m localdb status >/dev/null 2>&1; then started_db=1; fi
  echo "== localdb"; $PY -m localdb start
  MONGODB_URI=$($PY -m localdb uri)
  export MONGODB_URI
fi
# The console's browser tests drive Debian's Chromium (never a downloaded build).
command -v chromium >/dev/null 2>&1 || { echo "== chromium"; apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } || echo "test: could not install chromium; the browser tests need it" >&2
echo "== pytest (MongoDB at $MONGODB_URI)"
$PY -m pytest "$@"
echo "== deploy: the Pulumi stack's offline tests"
bash infra/deploy/test.sh
echo "== localdb: ruff, mypy, its own tests"
(cd infra/localdb && ../../.venv/bin/ruff check . && ../../.venv/bin/mypy src)
$PY -m pytest infra/localdb/tests
