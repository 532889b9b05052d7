#!/usr/bin/env bash
# The deployment stack's offline tests, in the Pulumi program's own venv
# (infra/deploy/pulumi/venv, the one `pulumi up` uses): Pulumi's SDK needs a
# protobuf that the service's pinned runtime does not allow.
set -euo pipefail
cd "$(dirname "$0")/pulumi"
PYTHON=${PYTHON:-python3}
stamp=venv/.requirements.sha256
want=$(sha256sum requirements.txt | cut -d' ' -f1)
if ! { [ -x venv/bin/python ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; }; then
  echo "deploy: installing requirements into infra/deploy/pulumi/venv (log: venv/pip.log)"
  [ -x venv/bin/python ] || "$PYTHON" -m venv venv
  # uv, as infra/venv.sh does (the same pin, the system's certificates, pip if uv fails).
  uv_pin=$(grep -E '^uv==' ../../../requirements-dev.txt)
  if ! { venv/bin/pip install -q --disable-pip-version-check "$uv_pin" &&
         UV_SYSTEM_CERTS=1 venv/bin/uv pip install --python venv/bin/python -r requirements.txt
       } >venv/pip.log 2>&1; then
    echo "deploy: uv could not install (see infra/deploy/pulumi/venv/pip.log); installing with pip" >&2
    if ! venv/bin/pip install -q --disable-pip-version-check -r requirements.txt >>venv/pip.log 2>&1; then
      echo "deploy: install failed; see infra/deploy/pulumi/venv/pip.log" >&2
      tail -5 venv/pip.log >&2
      exit 1
    fi
  fi
  echo "$want" >"$stamp"
fi
venv/bin/python -m pytest -q -p no:cacheprovider tests "$@"
