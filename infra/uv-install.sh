#!/usr/bin/env bash
# Install a requirements file into an existing venv with uv, or with pip when uv cannot:
# the one install of infra/venv.sh (.venv) and infra/deploy/test.sh (the Pulumi venv).
#
#   infra/uv-install.sh NAME VENV REQUIREMENTS LOG [UV_OPTION ...]
#
# NAME prefixes the messages; the output goes to LOG. uv (the pin in requirements-dev.txt)
# installs the same pins as pip, from its own cache, in seconds instead of a minute; pip only
# bootstraps it. uv reads neither pip's configuration nor, by default, the system's
# certificates (a shell without SSL_CERT_FILE could not reach the index): it trusts the
# system's store (UV_SYSTEM_CERTS), and where it still fails pip installs as before.
set -euo pipefail
name=$1 venv=$2 requirements=$3 log=$4
shift 4
uv_pin=$(grep -E '^uv==' "$(dirname "$0")/../requirements-dev.txt")
export UV_SYSTEM_CERTS=1
if ! { "$venv/bin/pip" install -q --disable-pip-version-check "$uv_pin" &&
       "$venv/bin/uv" pip install "$@" --python "$venv/bin/python" -r "$requirements"; } >"$log" 2>&1; then
  echo "$name: uv could not install (see $log); installing with pip" >&2
  if ! "$venv/bin/pip" install -q --disable-pip-version-check -r "$requirements" >>"$log" 2>&1; then
    echo "$name: install failed; see $log" >&2
    tail -5 "$log" >&2
    exit 1
  fi
fi
