"""The Pulumi program's own tests: run in the program's venv (``infra/deploy/pulumi/venv``).

Pulumi's SDK pins a protobuf that the service's runtime pins do not allow,
so the deployment code and its tests live in a virtual environment of their
own, the one ``pulumi up`` itself creates from ``requirements.txt``.
"""

import sys
from pathlib import Path

# The test modules share test_stack's helpers through ``siblings.sibling``.
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))
