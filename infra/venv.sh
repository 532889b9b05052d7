#!/usr/bin/env bash
# Create or refresh .venv from requirements-dev.txt; a no-op when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv/.requirements.sha256
want=$(cat requirements.txt requirements-dev.txt pyproject.toml infra/localdb/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "venv: installing requirements into .venv (log: .venv/pip.log)"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
if ! .venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt >.venv/pip.log 2>&1; then
  echo "venv: pip install failed; see .venv/pip.log" >&2
  tail -5 .venv/pip.log >&2
  exit 1
fi
if ! .venv/bin/pip check >>.venv/pip.log 2>&1; then
  echo "venv: installed packages conflict (pins vs pyproject.toml?); see .venv/pip.log" >&2
  tail -5 .venv/pip.log >&2
  exit 1
fi
echo "$want" >"$stamp"
