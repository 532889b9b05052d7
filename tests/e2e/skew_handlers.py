"""Test-only handlers for the clock-skew end-to-end tests (``test_clock_skew_e2e.py``).

Load them into the real gunicorn service with
``EVENTBUS_HANDLER_MODULES=tests.e2e.skew_handlers``.

- ``TEST_PARTNER_CALL``: the partner app's own notifier (``handlers.notifications``:
  the guard, the partner's breaker, the ``Idempotency-Key`` header), under a type
  a test may push; ``PARTNER_NOTIFY`` itself is internal, only a relay may send it.
  ``entity_data`` needs ``kind`` (text) and ``payload`` (an object).
- ``TEST_ORDERED``: ordered by ``entity_data.seq``; sleeps ``entity_data.sleep``
  seconds. Each run records in ``e2e_ordered_runs`` (one document per entity id)
  the seqs that started and finished, how many runs of the entity were under
  way at once (``running``; ``most_at_once`` is the highest it reached).
"""

from __future__ import annotations

import functools
import time

from pymongo import ReturnDocument

from eventbus import Context, Router
from handlers.notifications import PartnerNotifier
from handlers.settings import AppSettings

PARTNER_CALL = "TEST_PARTNER_CALL"
ORDERED = "TEST_ORDERED"
ORDERED_RUNS = "e2e_ordered_runs"

routes = Router()


@functools.cache
def _notifier() -> PartnerNotifier:
    # Read when the first event comes, in the service, whose environment names the partner.
    return PartnerNotifier(AppSettings.from_env().partners)


@routes.handler(PARTNER_CALL)
def partner_call(context: Context) -> None:
    """Call the partner once for this event through the app's own guarded notifier."""
    _notifier()(context)


@routes.handler(ORDERED, ordered_by="entity_data.seq")
def ordered(context: Context) -> None:
    """Record that this seq runs (and beside how many others), sleep, then record its end."""
    data = context.event.entity_data
    seq = int(data["seq"])
    runs = context.db[ORDERED_RUNS]
    entity = context.event.entity_metadata.entity_id
    # One atomic $inc: the count it returns is how many runs of the entity were
    # under way at that moment, whichever instance each runs on.
    under_way = runs.find_one_and_update(
        {"_id": entity}, {"$inc": {"running": 1}, "$push": {"started": seq}},
        upsert=True, return_document=ReturnDocument.AFTER)
    runs.update_one({"_id": entity}, {"$max": {"most_at_once": under_way["running"]}})
    try:
        time.sleep(float(data.get("sleep", 0)))
    finally:
        runs.update_one({"_id": entity}, {"$inc": {"running": -1}, "$push": {"finished": seq}})
