#!/usr/bin/env bash
# Mutation testing of the fence and hold code (issue 39): mutmut over the files in
# pyproject.toml's [tool.mutmut], against the tests that cover them, on the memory store and
# the local MongoDB-compatible server. A measure for people, not a CI gate: it takes tens of
# minutes on 2 cores. Prints killed and surviving mutants; `.venv/bin/mutmut show NAME`
# shows one survivor's diff.
set -euo pipefail
cd "$(dirname "$0")/.."
bash infra/venv.sh
# mutmut is not a dependency of the suite: installed here, on demand, pinned.
.venv/bin/uv pip install --python .venv/bin/python -q mutmut==3.8.1
PY=.venv/bin/python
started_db=""
if ! $PY -m localdb status >/dev/null 2>&1; then started_db=1; $PY -m localdb start >/dev/null; fi
trap '[ -n "$started_db" ] && $PY -m localdb stop >/dev/null || true' EXIT
rm -rf mutants
# The mutation profile: CI's examples, fewer of them (tests/hypothesis_profiles.py).
HYPOTHESIS_PROFILE=mutation EVENTBUS_LEAK_CHECK=off MONGODB_URI=$($PY -m localdb uri) \
  .venv/bin/mutmut run --max-children "${MUTATION_CHILDREN:-2}" | tr '\r' '\n' | tail -3
.venv/bin/mutmut results --all true | awk '{print $NF}' | sort | uniq -c
echo "survivors: .venv/bin/mutmut results; one: .venv/bin/mutmut show NAME"
