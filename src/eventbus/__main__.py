"""``python -m eventbus``: the same as the ``eventbus`` console script (``eventbus.ops.cli``)."""

import sys

from eventbus.ops.cli import main

sys.exit(main())
