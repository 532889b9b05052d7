"""The answers that run no handler: rejections, conflicts, and records that exist already.

* a message that can never run (``Located.error``) or whose content the store
  refuses is stored FAILED for good in its bounded form (``store.reject``),
  REJECTED; the same bytes again (a redelivery, or a republish: its key is
  of the bytes, ``keys.rejected_key``) are a DUPLICATE of that record, which
  counts the delivery (``delivery_count``);
* a different payload under a taken key is recorded under its own
  ``conflict_key`` and answered CONFLICT (acked), never run;
* a record SUCCESS or FAILED for good is a DUPLICATE, one PROCESSING under a
  live lease is IN_PROGRESS (503).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from eventbus.model.content import error_text
from eventbus.model.errors import ContentRejected, InvalidEvent
from eventbus.model.keys import conflict_key
from eventbus.model.outcome import Outcome
from eventbus.model.status import Status
from eventbus.processor.intake import Intake, Located
from eventbus.processor.work import Result
from eventbus.store import documents
from eventbus.store.base import ProcessorStore

logger = logging.getLogger("eventbus")


class Rejections:
    """Stores and answers what will not run, through one store and clock."""

    def __init__(self, store: ProcessorStore, now: Callable[[], datetime]) -> None:
        self.store, self.now = store, now

    def reject(self, located: Located, exc: Exception) -> Result:
        """Store ``located`` FAILED for good (bounded) and answer REJECTED, or as it stands."""
        kind = "content" if isinstance(exc, ContentRejected) else "invalid"
        inserted = self._store(located.key, located.fields, documents.error_document(exc, kind))
        if not inserted:
            return self._already_refused(located)
        logger.error("rejected message %s: %s", located.delivery.message_id, error_text(exc))
        return Result(Outcome.REJECTED, key=located.key, error=brief(exc),
                      event_type=str(located.fields.get("event_type", "")))

    def refuse_content(self, located: Located) -> Result:
        """The claim's fields were refused for their content: store the bounded form."""
        return self.reject(Intake.refuse(located.delivery, located.event),
                           ContentRejected("claim: the store refused the content"))

    def conflict(self, located: Located, record: Mapping[str, Any]) -> Result:
        """Record a different payload under a taken key; answer CONFLICT (acked)."""
        key = conflict_key(located.key, located.fingerprint)
        fields = {**Intake.refuse(located.delivery, located.event).fields,
                  "conflicts_with": located.key}
        error = {"type": "Conflict", "classification": "conflict",
                 "message": "a different payload came under a key that is taken"}
        self._store(key, fields, error)
        logger.error("conflict on %s: a different payload (message %s) recorded as %s",
                     located.key, located.delivery.message_id, key)
        return Result(Outcome.CONFLICT, key=located.key, error="Conflict",
                      event_type=str(record.get("event_type", "")))

    def _already_refused(self, located: Located) -> Result:
        # Stored before: the same message again is a duplicate; a different
        # payload under that key (an unknown type reusing a key) is a conflict.
        record = self.store.get(located.key) or {}
        if _other_payload(record, located):
            return self.conflict(located, record)
        return existing(record, located)

    def _store(self, key: str, fields: Mapping[str, Any], error: Mapping[str, Any]) -> bool:
        try:
            return self.store.reject(key, fields, self.now(), error)
        except ContentRejected:
            # The bounded form itself was refused (a server stricter than the
            # checks): keep what surely fits, the key, the error and the hash.
            minimal = {name: fields[name] for name in documents.MINIMAL_FIELDS if name in fields}
            return self.store.reject(key, minimal, self.now(), error)


def existing(record: Mapping[str, Any], located: Located) -> Result:
    """The answer for a key whose record stands: IN_PROGRESS while leased, else DUPLICATE."""
    status = record.get("event_status")
    outcome = Outcome.IN_PROGRESS if status == Status.PROCESSING else Outcome.DUPLICATE
    event = located.event
    return Result(outcome, key=located.key, event_type=event.event_type if event else "",
                  attempt=int(record.get("attempts", 0) or 0))


def brief(exc: BaseException) -> str:
    """The error as answered over HTTP: its type and, for invalid input, what is wrong.

    Messages of other errors may name internal hosts (a store, a partner URL);
    they go to the logs only.
    """
    if isinstance(exc, InvalidEvent):
        return f"{type(exc).__name__}: {error_text(exc, 300)}"
    return type(exc).__name__


def _other_payload(record: Mapping[str, Any] | None, located: Located) -> bool:
    if record is None or record.get("event_status") == Status.PROCESSING:
        return False
    stored = record.get("payload_fingerprint") or record.get("payload_sha256")
    # A refusal a corrected payload replaced is this key's payload too: its
    # redelivery is a duplicate, not a conflict.
    earlier = {entry.get("payload_fingerprint") or entry.get("payload_sha256")
               for entry in record.get("rejections") or () if isinstance(entry, Mapping)}
    return stored is not None and stored != located.fingerprint and \
        located.fingerprint not in earlier
