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
  bash ../../uv-install.sh deploy venv requirements.txt venv/pip.log
  echo "$want" >"$stamp"
fi
venv/bin/python -m pytest -q -p no:cacheprovider tests "$@"
