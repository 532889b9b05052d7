"""Run recorded events through the current router in the sandbox, one ``Verdict`` each.

For each stored record (any mapping shaped like one: the store's, a sample's,
an archive's):

1. a record that is not SUCCESS, or is SUCCESS as stale (its handler never
   ran), recorded nothing to compare: **skipped**;
2. its message is rebuilt as the redrive rebuilds it
   (``eventbus.workers.original.build``: stored body, attributes, ordering
   key) and must land on the record's own key with the current router; it
   then runs through a real ``Processor`` on the ``SandboxStore``, on a clock
   set to when its handler ran (``_written_at``: the claim time of its last
   attempt, which a rebuild never moves), so a handler that reads
   ``context.now`` sees the time it first saw;
3. the children and forwards the sandbox stored are compared with the
   record's outbox (``compare``): equal is **same**, else **different**;
4. whatever keeps the comparison from meaning anything is **unverifiable**,
   with the reason: not routed any more, the receiver would refuse it, the
   handler raised, it called a partner outside the guard, or it emitted
   differently while a guarded side effect had no stored result (its
   stand-in, not the code, may be why).

The sandbox is emptied before each record (``SandboxStore.begin``): every
event runs as its first attempt did, on a fresh claim, with an empty
database for the handler's own effects. So a verdict depends on the event
and the code only, never on which other events were selected with it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Literal

from eventbus.model.content import error_text
from eventbus.model.delivery import Delivery
from eventbus.model.outcome import Outcome
from eventbus.model.router import Router
from eventbus.model.status import Status
from eventbus.ops.render import from_epoch_ms
from eventbus.partners import Partners
from eventbus.processor import Processor
from eventbus.rebuild.verify.compare import Difference, Emits, Malformed, compare, emitted
from eventbus.rebuild.verify.sample import BadInput
from eventbus.rebuild.verify.sandbox import (
    Lookups,
    SandboxPartnerStore,
    SandboxStore,
    sandbox_databases,
)
from eventbus.settings import Settings
from eventbus.testing import FakeClock
from eventbus.workers.original import Message, NotReplayable, build

State = Literal["same", "different", "unverifiable", "skipped", "unreadable"]
_START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """What verify found for one record (or one unreadable input line)."""

    key: str
    state: State
    event_type: str = ""
    differences: tuple[Difference, ...] = ()
    reason: str = ""
    basis: str = ""
    """What it was compared with, when the input mixes sources: ``record`` (the stored
    record) or ``archive`` (the children an archive holds); empty otherwise."""

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        data: dict[str, Any] = {"key": self.key, "state": self.state,
                                "event_type": self.event_type}
        if self.reason:
            data["reason"] = self.reason
        if self.basis:
            data["basis"] = self.basis
        if self.differences:
            data["differences"] = [d.to_json() for d in self.differences]
        return data


@dataclasses.dataclass
class Report:
    """Every verdict of a run, in input order."""

    verdicts: list[Verdict] = dataclasses.field(default_factory=list)

    def of(self, state: State) -> list[Verdict]:
        """The verdicts in ``state``."""
        return [v for v in self.verdicts if v.state == state]

    def counts(self) -> dict[str, int]:
        """How many verdicts of each state."""
        states: tuple[State, ...] = ("same", "different", "unverifiable", "skipped",
                                     "unreadable")
        return {state: len(self.of(state)) for state in states}

    def exit_code(self, *, allow_unverifiable: bool = False) -> int:
        """1 for a difference, or (unless allowed) an unverifiable or unreadable record,
        or when nothing was compared at all; else 0."""
        counts = self.counts()
        if counts["different"]:
            return 1
        if not allow_unverifiable and (counts["unverifiable"] or counts["unreadable"]):
            return 1
        return 0 if counts["same"] else 1

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json``: the counts, and every verdict that is not ``same``."""
        return {"counts": self.counts(),
                "verdicts": [v.to_json() for v in self.verdicts if v.state != "same"]}


class Verifier:
    """Runs records through ``router`` in a sandbox reading ``lookups`` (module doc).

    ``databases`` makes the handlers' database for each event (default: an
    empty mongomock one, ``sandbox.sandbox_databases``). Its processor keeps
    threads (the heartbeat's, an ``async def`` handler's loop): ``close()``, or
    ``with Verifier(...) as verifier:``, ends them.
    """

    def __init__(self, router: Router, lookups: Lookups, settings: Settings | None = None, *,
                 databases: Callable[[], Any] | None = None) -> None:
        self.clock = FakeClock(_START)
        self.store = SandboxStore(lookups, clock=self.clock,
                                  databases=databases or sandbox_databases())
        # No after_success hook and no publisher: nothing the sandbox stores is sent.
        settings = settings or Settings(relay_inline=False)
        partners = Partners(SandboxPartnerStore(self.store), settings, now=self.clock,
                            sleep=self.clock.sleep, monotonic=self.clock.monotonic)
        self.processor = Processor(self.store, router, settings, self.clock,
                                   sleep=self.clock.sleep, monotonic=self.clock.monotonic,
                                   partners=partners)
        self._seen: set[str] = set()

    def verify(self, records: Iterable[Mapping[str, Any] | BadInput]) -> Iterator[Verdict]:
        """One verdict per record (or unreadable input), in order; never raises for one."""
        for record in records:
            if isinstance(record, BadInput):
                yield Verdict(record.where, "unreadable", reason=record.reason)
            else:
                yield self.verify_one(record)

    def run(self, records: Iterable[Mapping[str, Any] | BadInput]) -> Report:
        """``verify`` into a ``Report``."""
        return Report(list(self.verify(records)))

    def close(self) -> None:
        """Stop the sandbox processor's threads (``Processor.close``); every one joined."""
        self.processor.close(grace=0)

    def __enter__(self) -> Verifier:
        """``with Verifier(...) as verifier:`` closes it at the end."""
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the verifier."""
        self.close()

    def verify_one(self, record: Mapping[str, Any], *, forwards: bool = True) -> Verdict:
        """The verdict of one stored record; never raises for what the record holds.

        ``forwards=False`` compares the children only (an archive's stand-in
        record: the forwards went to public topics, not to the archived bus).
        """
        key = record.get("idempotency_key")
        if not isinstance(key, str) or not key:
            return Verdict("?", "unverifiable", reason="not a stored record: no idempotency_key")
        event_type = record.get("event_type")
        event_type = event_type if isinstance(event_type, str) else ""
        skipped = _nothing_recorded(record)
        if skipped:
            return Verdict(key, "skipped", event_type, reason=skipped)
        if key in self._seen:
            return Verdict(key, "skipped", event_type, reason="given twice: verified once")
        self._seen.add(key)
        try:
            return self._verify(key, event_type, record, forwards)
        except Exception as exc:  # one hostile record must not stop the others' verdicts
            return Verdict(key, "unverifiable", event_type,
                           reason=f"verify could not run it: {type(exc).__name__}: "
                                  f"{error_text(exc, 300)}")

    def _verify(self, key: str, event_type: str, record: Mapping[str, Any],
                forwards: bool) -> Verdict:
        try:
            stored = emitted(record.get("outbox"))
        except Malformed as exc:
            return Verdict(key, "unverifiable", event_type, reason=str(exc))
        self.store.begin()
        self.clock.moment = _written_at(record)
        try:
            message = build(record, self.processor.locate)
        except NotReplayable as exc:
            return Verdict(key, "unverifiable", event_type,
                           reason=f"not verifiable with the current code: {exc}")
        result = self.processor.process(_delivery(message, record))
        if self.store.partner_calls:
            return Verdict(key, "unverifiable", event_type,
                           reason=f"its handler calls partner {self.store.partner_calls[0]!r} "
                                  "outside the guard: verify never calls a partner")
        if result.outcome is not Outcome.PROCESSED:
            why = f": {result.error}" if result.error else ""
            return Verdict(key, "unverifiable", event_type,
                           reason=f"the current code did not succeed ({result.outcome.value}"
                                  f"{why})")
        return self._judged(key, event_type, stored, self.store.produced(key) or {}, forwards)

    def _judged(self, key: str, event_type: str, stored: Emits,
                produced: Mapping[str, Any], forwards: bool) -> Verdict:
        if produced.get("stale"):
            return Verdict(key, "unverifiable", event_type,
                           reason="the sandbox ran it as stale (an older position)")
        differences = tuple(compare(stored, emitted(produced.get("outbox")), forwards=forwards))
        if not differences:
            return Verdict(key, "same", event_type)
        if self.store.stand_ins:
            # The handler saw a stand-in where the real run saw a partner's answer:
            # the difference may be the stand-in's, not the code's.
            return Verdict(key, "unverifiable", event_type, differences,
                           reason=f"side effect {self.store.stand_ins[0]!r} has no stored "
                                  "result; its stand-in may explain the differences")
        return Verdict(key, "different", event_type, differences)


def _nothing_recorded(record: Mapping[str, Any]) -> str:
    status = record.get("event_status")
    if status != Status.SUCCESS:
        return f"stored {status if isinstance(status, str) else '?'}: no children recorded"
    if record.get("stale"):
        return "stored as stale: its handler never ran"
    return ""


def _written_at(record: Mapping[str, Any]) -> dt.datetime:
    """When the handler ran: the time of its last attempt (the one that succeeded).

    Seed 002's attempt map (``entity_metadata.resilienceAttemptCount``: attempt
    number to its claim's time) is written only by a claim; a rebuild, a
    replay's audit entry or an outbox sweep move ``lastUpdatedTime`` but never
    the map, so a rebuilt event verifies with the time its handler first saw.
    A record without the map (a sample, an archive's stand-in): its
    ``lastUpdatedTime``, else its ``created``, else the sandbox's fixed start.
    """
    meta = record.get("entity_metadata")
    history = meta.get("resilienceAttemptCount") if isinstance(meta, Mapping) else None
    attempts = record.get("attempts")
    if isinstance(history, Mapping) and isinstance(attempts, int):
        ran = from_epoch_ms(history.get(str(attempts)))
        if ran is not None:
            return ran
    return from_epoch_ms(record.get("lastUpdatedTime")) or \
        from_epoch_ms(record.get("created")) or _START


def _delivery(message: Message, record: Mapping[str, Any]) -> Delivery:
    pubsub = record.get("pubsub")
    meta: Mapping[str, Any] = pubsub if isinstance(pubsub, Mapping) else {}

    def text(name: str) -> str:
        value = meta.get(name)
        return value if isinstance(value, str) else ""

    return Delivery(message.data, message.attributes, message_id=text("messageId") or "verify",
                    publish_time=text("publishTime"), subscription=text("subscription"),
                    ordering_key=message.ordering_key or "", form="verify")
