#!/usr/bin/env bash
# Create or refresh .venv from requirements-dev.txt (with uv); a no-op when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
stamp=.venv/.requirements.sha256
# The install's own options are part of the stamp: a venv made before them is made again.
options="uv pip install --compile-bytecode"
want=$( (echo "$options"; cat requirements.txt requirements-dev.txt pyproject.toml infra/localdb/pyproject.toml) | sha256sum | cut -d' ' -f1)
if [ -x .venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
echo "venv: installing requirements into .venv (log: .venv/pip.log)"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# --compile-bytecode: uv writes no .pyc by default (pip does), and where PYTHONDONTWRITEBYTECODE
# is set (this machine's shells) nothing ever writes them, so every process that imports the
# service (each gunicorn worker, each CLI subprocess of the tests) compiled its libraries from
# source again: about 1.2 s of CPU per process, against seconds once here.
bash infra/uv-install.sh venv .venv requirements-dev.txt .venv/pip.log --compile-bytecode
if ! .venv/bin/uv pip check --python .venv/bin/python >>.venv/pip.log 2>&1; then
  echo "venv: installed packages conflict (pins vs pyproject.toml?); see .venv/pip.log" >&2
  tail -5 .venv/pip.log >&2
  exit 1
fi
echo "$want" >"$stamp"
