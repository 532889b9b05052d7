"""``python -m eventbus``: see ``eventbus.cli``."""

import sys

from eventbus.cli import main

sys.exit(main())
