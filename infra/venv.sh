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
# uv (pinned in requirements-dev.txt) installs the same pins as pip, from its own cache, in
# seconds instead of a minute; pip only bootstraps it. uv reads neither pip's configuration
# nor, by default, the system's certificates (a shell without SSL_CERT_FILE could not reach
# the index): it trusts the system's store, and where it still fails pip installs as before.
# Installs stay in .venv/pip.log.
# --compile-bytecode: uv writes no .pyc by default (pip does), and where PYTHONDONTWRITEBYTECODE
# is set (this machine's shells) nothing ever writes them, so every process that imports the
# service (each gunicorn worker, each CLI subprocess of the tests) compiled its libraries from
# source again: about 1.2 s of CPU per process, against seconds once here.
export UV_SYSTEM_CERTS=1
uv_pin=$(grep -E '^uv==' requirements-dev.txt)
if ! { .venv/bin/pip install -q --disable-pip-version-check "$uv_pin" &&
       .venv/bin/uv pip install --compile-bytecode --python .venv/bin/python -r requirements-dev.txt; } >.venv/pip.log 2>&1; then
  echo "venv: uv could not install (see .venv/pip.log); installing with pip" >&2
  if ! .venv/bin/pip install -q --disable-pip-version-check -r requirements-dev.txt >>.venv/pip.log 2>&1; then
    echo "venv: install failed; see .venv/pip.log" >&2
    tail -5 .venv/pip.log >&2
    exit 1
  fi
fi
if ! .venv/bin/uv pip check --python .venv/bin/python >>.venv/pip.log 2>&1; then
  echo "venv: installed packages conflict (pins vs pyproject.toml?); see .venv/pip.log" >&2
  tail -5 .venv/pip.log >&2
  exit 1
fi
echo "$want" >"$stamp"
