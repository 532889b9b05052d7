"""A handler the operator end-to-end tests can repair: broken while a file exists.

Start the service with ``EVENTBUS_HANDLER_MODULES=tests.e2e.ops_handlers`` and
``E2E_BROKEN_FILE=<path>``. ``TEST_REPAIRABLE`` fails for good (``PermanentError``,
before any effect) while that file exists; once it is removed, the handler
counts one run of its ``tag`` in ``e2e_effects`` (not idempotent on purpose, so
a second run would show).
"""

from __future__ import annotations

import os

from eventbus import Context, PermanentError, Router

EFFECTS = "e2e_effects"
BROKEN_ENV = "E2E_BROKEN_FILE"

routes = Router()


@routes.handler("TEST_REPAIRABLE")
def repairable(context: Context) -> None:
    """Fail for good while the broken file exists; afterwards count one run."""
    broken = os.environ.get(BROKEN_ENV, "")
    if broken and os.path.exists(broken):
        raise PermanentError("the handler is broken until it is repaired")
    tag = context.event.entity_data["tag"]
    context.db[EFFECTS].update_one({"_id": tag}, {"$inc": {"runs": 1}}, upsert=True)
