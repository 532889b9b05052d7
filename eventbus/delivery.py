"""OUT-direction delivery: one HTTP call to a partner, guarded against repeats.

A partner endpoint is a side effect the event store cannot make idempotent,
so each call is guarded as the sync guide's "Idempotence For Side Effects"
describes, in the ``partner_deliveries`` collection keyed by idempotency key:

1. **key check**: the key is ``DELIVERED`` → the call is not made again;
2. **lease lock**: take a lease on the key; if another worker holds a live
   one, raise ``LeaseHeld`` (transient: the event is redelivered later);
3. **the call**, with the key in an ``Idempotency-Key`` header, so a partner
   that deduplicates can do so too;
4. **the key set permanently**: on 2xx the record becomes ``DELIVERED``.

The partner's answer is classified and recorded on the record
(``classification``, ``status_code``):

* 2xx → ``delivered``;
* 408, 429, 5xx, other non-4xx answers, network errors and timeouts →
  ``transient``: ``PartnerUnavailable``, the event is retried;
* any other 4xx → ``permanent``: ``PartnerRejected``, the event is stored
  FAILED for good.

This narrows duplicate calls to one case: the worker dies (or its lease
runs out) after the partner took the call and before ``DELIVERED`` is
stored. The partner's own handling of ``Idempotency-Key`` is the only cure.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

import requests
from pymongo.collection import Collection
from pymongo.database import Database
from pymongo.errors import DuplicateKeyError

from eventbus import records
from eventbus.errors import LeaseHeld, PartnerRejected, PartnerUnavailable

logger = logging.getLogger("eventbus.delivery")

COLLECTION = "partner_deliveries"
IN_FLIGHT = "IN_FLIGHT"
DELIVERED = "DELIVERED"
FAILED = "FAILED"
RETRYABLE_4XX = frozenset({408, 429})


@dataclasses.dataclass(frozen=True)
class Delivered:
    """The outcome of ``PartnerClient.deliver``: the partner took the call."""

    key: str
    status_code: int
    skipped: bool
    """True when an earlier call was already DELIVERED and none was made now."""


def classify_status(status: int) -> str:
    """Return ``delivered``, ``transient`` or ``permanent`` for a partner's HTTP status."""
    if 200 <= status < 300:
        return "delivered"
    if 400 <= status < 500 and status not in RETRYABLE_4XX:
        return "permanent"
    return "transient"


class PartnerClient:
    """Makes guarded partner calls; time and HTTP session are injected for tests."""

    def __init__(self, db: Database, *, timeout: float, lease: timedelta,
                 now: Callable[[], datetime], session: requests.Session | None = None) -> None:
        self.collection: Collection = db[COLLECTION]
        self.timeout, self.lease, self.now = timeout, lease, now
        self.session = session
        """Reused for every call when given; otherwise each call opens and closes its own."""

    def deliver(self, key: str, url: str, body: Mapping[str, Any]) -> Delivered:
        """POST ``body`` to ``url`` once per ``key``; raise on a failed or refused call."""
        record = self.collection.find_one({"_id": key})
        if record is not None and record.get("status") == DELIVERED:
            logger.info("partner call %s was already delivered; not calling again", key)
            return Delivered(key, int(record.get("status_code", 0)), skipped=True)
        owner = self._take_lease(key, url)
        status = self._call(key, url, body, owner)
        # The call happened: the key is set for good, even if the lease ran out meanwhile.
        self.collection.update_one({"_id": key}, delivered_update(self.now(), status))
        return Delivered(key, status, skipped=False)

    def _take_lease(self, key: str, url: str) -> str:
        """Take the lease on ``key`` and return its owner token, or raise ``LeaseHeld``."""
        now, owner = records.bson_time(self.now()), uuid.uuid4().hex
        try:
            self.collection.update_one(lease_filter(key, now),
                                       lease_update(now, owner, self.lease, url), upsert=True)
        except DuplicateKeyError:
            # The record exists and did not match: leased by another worker, or
            # delivered since the check, which the redelivery's check will see.
            record = self.collection.find_one({"_id": key}) or {}
            raise LeaseHeld({**record, "idempotency_key": key}) from None
        return owner

    def _call(self, key: str, url: str, body: Mapping[str, Any], owner: str) -> int:
        try:
            post = self.session.post if self.session is not None else requests.post
            response = post(url, json=dict(body), timeout=self.timeout,
                            headers={"Idempotency-Key": key}, allow_redirects=False)
        except requests.RequestException as exc:
            self._release(key, owner, failed_update(self.now(), "transient", None, exc))
            raise PartnerUnavailable(f"partner call to {url} failed: "
                                     f"{type(exc).__name__}: {exc}") from exc
        kind = classify_status(response.status_code)
        if kind != "delivered":
            error = f"partner answered {response.status_code} at {url}"
            self._release(key, owner, failed_update(self.now(), kind, response.status_code, error))
            raise (PartnerRejected if kind == "permanent" else PartnerUnavailable)(error)
        return response.status_code

    def _release(self, key: str, owner: str, update: Mapping[str, Any]) -> None:
        # Guarded by the owner: a worker whose lease ran out must not undo the
        # state that the lease's next holder wrote.
        self.collection.update_one({"_id": key, "lease_owner": owner}, update)


def lease_filter(key: str, now: datetime) -> dict[str, Any]:
    """Return the filter that matches ``key`` only when it may be leased at ``now``."""
    return {"_id": key, "status": {"$ne": DELIVERED},
            "$or": [{"lease_until": {"$exists": False}}, {"lease_until": {"$lt": now}}]}


def lease_update(now: datetime, owner: str, lease: timedelta, url: str) -> dict[str, Any]:
    """Return the upsert that takes the lease (and creates the record the first time)."""
    return {"$set": {"status": IN_FLIGHT, "lease_owner": owner, "url": url,
                     "lease_until": records.bson_time(now + lease), "updated_at": now},
            "$inc": {"attempts": 1},
            "$setOnInsert": {"created_at": now}}


def delivered_update(now: datetime, status: int) -> dict[str, Any]:
    """Return the update that sets the key permanently: DELIVERED with the status code."""
    moment = records.bson_time(now)
    return {"$set": {"status": DELIVERED, "classification": "delivered", "status_code": status,
                     "delivered_at": moment, "updated_at": moment},
            "$unset": {"lease_until": "", "lease_owner": "", "error": ""}}


def failed_update(now: datetime, classification: str, status: int | None,
                  error: object) -> dict[str, Any]:
    """Return the update that releases the lease after a failed call, recording why."""
    moment = records.bson_time(now)
    return {"$set": {"status": FAILED, "classification": classification, "status_code": status,
                     "error": str(error)[:records.MAX_ERROR_MESSAGE], "updated_at": moment},
            "$unset": {"lease_until": "", "lease_owner": ""}}
