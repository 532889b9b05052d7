"""The store protocol: the few primitives every layer above storage may use.

Modelled on Powertools idempotency's ``BasePersistenceLayer``: the state
machine (``eventbus.processor``), the outbox relay, the side-effect guard and
the operator commands are written once above these primitives, and
``MongoEventStore`` and ``MemoryEventStore`` implement them. The contract
suite (``tests/contract``) runs against both, so they cannot drift. Each
layer takes only the protocol of what it uses (``ProcessorStore``,
``RenewingStore``, ``GuardStore``, ``PartnerStore``, ``OutboxStore``,
``RedriveStore``); ``EventStore`` is all of them, for the composition root.

Time: every primitive decides leases, holds and due times on **the store's
clock** (``now()``; ``eventbus.clock``), never on the ``now`` a caller
passes, which only stamps audit fields (``lastUpdatedTime``, the attempt
map). Every write made under a lease or hold is fenced: it takes effect only
while the lease still holds on that clock.

Two error rules hold for every primitive of every implementation:

* a conflict that matters to the caller is ``AlreadyExists(record)`` (or
  ``LeaseHeld(record)`` for the guard), carrying the stored record so no
  second read is needed;
* a failure to reach the store is ``StoreUnavailable``, transient.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from eventbus.model.errors import AlreadyExists, ContentRejected

Record = dict[str, Any]
"""A stored document, as the seed schema names its fields."""


@dataclasses.dataclass(frozen=True)
class Claim:
    """A claim taken on a record: this worker now holds its lease."""

    attempt: int
    """1-based number of the attempt taken now."""
    owner: str
    """Random lease token of this claim; finishing needs it."""
    record: Mapping[str, Any]
    """The record as this claim left it (its lease, attempt and attempt map included).

    One meaning on every store and batch size (the contract suite pins it).
    What a claim never changes is read here: ``parks``, ``replayed_at_attempt``,
    ``replays``, the outbox of an earlier SUCCESS.
    """


@dataclasses.dataclass(frozen=True)
class BatchClaim:
    """What ``claim_many`` did: the keys it took, and every other key's record as it stands."""

    taken: dict[str, Claim]
    """Key → the claim taken on it (one owner for the whole batch)."""
    records: dict[str, Record]
    """Key → its record, for the keys not taken (a duplicate, a conflict, held elsewhere)."""
    refused: frozenset[str] = frozenset()
    """Keys whose fields the store refused for their content (``ContentRejected`` for one)."""
    holds: EntityHolds | None = None
    """The entities ``claim_many(..., takes=)`` held for the taken keys (None: none asked).

    Only entities held by this claim are in it; an entity it could not hold
    (busy, ahead, or a holder's lease ran out) is left to ``take_entities``.
    """


def claim_of_one(claim: Callable[[str, Mapping[str, Any], datetime], Claim], key: str,
                 fields: Mapping[str, Any], now: datetime) -> BatchClaim:
    """``claim_many`` of one key through the single-key ``claim``: its cost, its rules."""
    try:
        return BatchClaim({key: claim(key, fields, now)}, {})
    except AlreadyExists as exc:  # and Conflict, its subclass
        return BatchClaim({}, {key: dict(exc.record)})
    except ContentRejected:
        return BatchClaim({}, {}, frozenset({key}))


@dataclasses.dataclass(frozen=True)
class Finish:
    """One outcome to store with ``finish_many``: SUCCESS with children, or FAILED."""

    key: str
    owner: str
    outbox: tuple[Mapping[str, Any], ...] = ()
    error: Mapping[str, Any] | None = None
    """None for SUCCESS; the error document for FAILED."""
    retryable: bool = False
    redrive_at: datetime | None = None
    extra: Mapping[str, Any] | None = None
    """More fields stored with the outcome: SUCCESS's ``order`` and ``stale`` of an ordered
    event, a rebuild's ``replays`` entry of a new record (SUCCESS or FAILED)."""
    unclaim: bool = False
    """Give the claim back untouched (its entity is busy): PENDING again, the attempt returned.

    With ``redrive_at``: when the store's redrive brings it back if the broker does not."""
    not_before: datetime | None = None
    """A FAILED-retryable deferral (``RetryAfter``): no claim takes it before this time on the
    store's clock (``documents.NOT_BEFORE``), so a duplicate delivery does not run it early."""
    parked: bool = False
    """A FAILED-retryable park (its partner paused): counts one more in the record's ``parks``."""
    audit: Mapping[str, Any] | None = None
    """A rebuild's audit entry (``RebuildStore.rebuild_finish_many``): appended to ``replays``;
    the status is not written, and ``outbox`` holds only the entries to append."""


@dataclasses.dataclass(frozen=True)
class EntityTake:
    """What a batch asks of one entity: to hold it for its events (keys and positions)."""

    entity: Mapping[str, Any]
    """``{partnerId, entity_type, entity_id}``, stored with a new entity record."""
    keys: tuple[str, ...]
    positions: tuple[Any, ...]
    kind: str = ""
    """The kind all ``positions`` share (``eventbus.model.order``), "" when mixed: a hold
    in the claim then holds only an entity with no applied position."""


@dataclasses.dataclass(frozen=True)
class EntityHolds:
    """What ``take_entities`` did: the owner of the holds, and each entity's record after it."""

    owner: str
    records: dict[str, Record]
    """Entity key → its record; ``holder.owner`` is the owner when this call holds it."""
    owners: dict[str, str] = dataclasses.field(default_factory=dict)
    """Entity key → its owner, where a later take (a retry) held it under another one."""

    def owner_of(self, entity_key: str) -> str:
        """The owner ``entity_key`` is held under, if held by these takes."""
        return self.owners.get(entity_key, self.owner)

    def held(self, entity_key: str) -> bool:
        """True when these takes hold ``entity_key``."""
        holder = self.records.get(entity_key, {}).get("holder")
        return isinstance(holder, Mapping) and holder.get("owner") == self.owner_of(entity_key)


@dataclasses.dataclass(frozen=True)
class EntityRelease:
    """Free a held entity at finish; with ``applied_key``, store ``position`` as applied.

    Fenced: it takes effect only while ``owner``'s hold holds. The position
    only moves forward. ``orphan`` keeps the orphan keys (and positions) whose
    records the holder did not see finished, for the next holder to read.
    """

    entity_key: str
    owner: str
    position: Any = None
    applied_key: str = ""
    orphan: Mapping[str, Sequence[Any]] | None = None
    kind: str = ""
    """The kind of ``position``, stored beside it; the position moves only over an
    applied one of the same kind (or one stored untagged, before kinds were)."""


@dataclasses.dataclass(frozen=True)
class Finished:
    """What ``finish_many`` did with the outcomes it was given."""

    lost: frozenset[str] = frozenset()
    """Keys whose lease another worker took: nothing was stored for them."""
    refused: frozenset[str] = frozenset()
    """Keys whose children the store refused for their content: stored FAILED for good instead."""
    unreleased: frozenset[str] = frozenset()
    """Entity keys whose release did not take: the hold had lapsed (another holder may have it)."""


@dataclasses.dataclass(frozen=True)
class OutboxEntry:
    """One child waiting in its parent's outbox, addressed by the parent and its index."""

    parent_key: str
    index: int
    entry: Mapping[str, Any]

    @property
    def key(self) -> str:
        """The child's idempotency key."""
        return str(self.entry.get("idempotency_key"))


class Clocked(Protocol):
    """What every user of the store shares: its clock."""

    def now(self) -> datetime:
        """The store's clock (``eventbus.clock``): what every lease and window is measured on."""
        ...


class RenewingStore(Protocol):
    """What the heartbeat uses: it keeps a live worker's leases and holds."""

    @property
    def lease(self) -> timedelta:
        """How long a claim holds its record before another worker may take it."""
        ...

    def renew_many(self, owners: Mapping[str, str], now: datetime) -> set[str]:
        """Extend the leases of ``owners`` (key → owner) at once; return the keys still held."""
        ...

    def renew_entities(self, holders: Mapping[str, str], now: datetime) -> set[str]:
        """Extend the holds of ``holders`` (entity key → owner) at once; return those still held."""
        ...

    def guard_renew(self, key: str, owner: str, lease: timedelta) -> bool:
        """Extend ``owner``'s guard lease on ``key`` by ``lease`` from the store's now, while
        it still holds; False otherwise (taken, finished, or run out)."""
        ...


class GuardStore(Clocked, Protocol):
    """What the side-effect guard uses (``eventbus.guard``)."""

    def guard_take(self, key: str, owner: str, now: datetime, lease: timedelta) -> Record | None:
        """Lease side effect ``key``: None when taken now, its record when already SUCCESS.

        Raise ``LeaseHeld`` when another owner holds a live lease.
        """
        ...

    def guard_finish(self, key: str, owner: str, now: datetime, *, succeeded: bool,
                     result: Mapping[str, Any]) -> bool:
        """Store how the effect ended (SUCCESS with its result, or FAILED with the error).

        A success is stored even if the lease was lost (the effect happened);
        a failure only releases ``owner``'s lease. False when nothing matched.
        """
        ...

    def guard_get(self, key: str) -> Record | None:
        """Return the guard record of side effect ``key``, or None."""
        ...


class ParkedEvents(Clocked, Protocol):
    """What the store answers about parked events (FAILED-retryable, waiting for a partner):
    the partners' store asks it (``eventbus.partners.store``), and the redrive's gate."""

    def parked_counts(self) -> dict[str, int]:
        """Return partner → how many events are parked for it (FAILED-retryable, parked)."""
        ...

    def unpark(self, name: str, now: datetime) -> int:
        """Make every event parked for partner ``name`` due for the redrive at ``now``.

        Each record is its own atomic update (no transaction); returns how many.
        """
        ...


class ProcessorStore(RenewingStore, GuardStore, Protocol):
    """What the processor uses (``eventbus.processor``): the idempotency state machine, its
    batches and entity holds (whose claims rely on the key's unique index: ``ensure_indexes``);
    it hands the same store to its heartbeat and guard."""

    def ensure_indexes(self) -> None:
        """Prepare the store (indexes); a no-op when it is ready."""
        ...

    @property
    def database(self) -> Any:
        """The database handlers use for their own effects (None when there is none)."""
        ...

    def claim(self, key: str, fields: Mapping[str, Any], now: datetime) -> Claim:
        """Take the lease on ``key``, or raise ``AlreadyExists`` with the unchanged record."""
        ...

    def succeed(self, key: str, owner: str, now: datetime,
                outbox: Sequence[Mapping[str, Any]] = ()) -> bool:
        """Mark ``key`` SUCCESS with its children; False if ``owner`` lost the lease."""
        ...

    def fail(self, key: str, owner: str, now: datetime, error: Mapping[str, Any], *,
             retryable: bool, redrive_at: datetime | None = None) -> bool:
        """Mark ``key`` FAILED with ``error``; False if ``owner`` lost the lease.

        ``redrive_at``: when the store's redrive sweeper publishes it again if
        nothing else delivered it by then (a retryable failure only).
        """
        ...

    def renew(self, key: str, owner: str, now: datetime) -> bool:
        """Extend ``owner``'s lease on ``key`` by a lease from the store's now; False when it
        no longer holds (taken, or run out: a lapsed lease is never brought back)."""
        ...

    def reject(self, key: str, fields: Mapping[str, Any], now: datetime,
               error: Mapping[str, Any], raw_payload: str | None = None) -> bool:
        """Store ``key`` FAILED for good unless it exists; True if this call inserted it.

        A new record has ``delivery_count`` 1. When the record of ``key`` is
        this very refusal again (stored by rejection, never claimed since,
        the same ``payload_sha256``: ``documents.repeats``), its
        ``delivery_count`` grows by one and nothing else changes; any other
        record is never changed.
        """
        ...

    def get(self, key: str) -> Record | None:
        """Return the record of ``key``, or None."""
        ...

    def get_many(self, keys: Collection[str]) -> list[Record]:
        """Return the records of ``keys`` that exist."""
        ...

    def claim_many(self, items: Mapping[str, Mapping[str, Any]], now: datetime,
                   takes: Mapping[str, EntityTake] | None = None) -> BatchClaim:
        """Claim every key of ``items`` (key → ``fields`` as for ``claim``) at once.

        The rules are ``claim``'s, key by key; the keys taken share one owner.
        One key costs what ``claim`` costs (one round trip). Raises
        ``StoreUnavailable`` when the store cannot be asked at all.

        ``takes`` (entity key → ``EntityTake``, as for ``take_entities``): also
        hold those entities in the same round trips where the store can
        (``BatchClaim.holds``): a new entity, or one nobody holds whose applied
        position is at most the lowest of its take. An entity none of whose
        keys was taken is never left held. A new ordered event then costs
        what an unordered one costs in round trips.
        """
        ...

    def finish_many(self, finishes: Sequence[Finish], now: datetime,
                    releases: Sequence[EntityRelease] = ()) -> Finished:
        """Store every outcome at once (one key: one round trip, as ``succeed``/``fail``).

        Children the store refuses for their content leave their parent FAILED
        for good (``Finished.refused``); a lease another worker took leaves the
        record as that worker has it (``Finished.lost``). ``releases`` free the
        entities the batch held, in the same round trip.
        """
        ...

    def take_entities(self, takes: Mapping[str, EntityTake], now: datetime) -> EntityHolds:
        """Hold each free entity (entity key → ``EntityTake``) for one new owner, at once.

        An entity is free when nobody holds it or its holder's lease ran out
        (that holder's keys and positions become its ``orphan``). One entity:
        one round trip; many: two.
        """
        ...


class OutboxStore(Clocked, Protocol):
    """What the outbox relay and its gauge use (``eventbus.outbox``)."""

    def pending_outbox(self, cutoff: datetime) -> Iterator[OutboxEntry]:
        """Yield every outbox entry PENDING since ``cutoff`` or before."""
        ...

    def mark_published(self, entry: OutboxEntry, now: datetime, message_id: str,
                       tries: int) -> bool:
        """Mark ``entry`` PUBLISHED; False if it was no longer PENDING."""
        ...

    def mark_publish_failed(self, entry: OutboxEntry, now: datetime,
                            error: Mapping[str, Any], tries: int) -> None:
        """Record failed publish tries on ``entry``, which stays PENDING."""
        ...

    def oldest_pending_outbox(self) -> datetime | None:
        """Return when the oldest PENDING outbox entry was created; None when none is.

        Read by the ``eventbus.outbox.oldest_pending_age`` gauge.
        """
        ...


class RedriveStore(ParkedEvents, Protocol):
    """What the store-driven redrive uses (``eventbus.workers.redrive``): its records and
    their parked counts (the partners' breakers come from their own store)."""

    def redrivable(self, limit: int, exclude: Collection[str] = ()) -> list[Record]:
        """Return up to ``limit`` records due for a redrive on the store's clock
        (``documents.redrive_filter``: FAILED-retryable or PENDING whose ``redrive_at`` came,
        PROCESSING whose lease ran out a lease ago), leaving out the keys in ``exclude``."""
        ...

    def mark_redriven(self, key: str, redrives: int, next_at: datetime) -> bool:
        """Count a redrive of ``key``; False when another sweeper counted it first."""
        ...

    def abandon(self, key: str, now: datetime, error: Mapping[str, Any]) -> bool:
        """Give ``key`` up for good (FAILED, not retryable); False unless it was retryable.

        A PROCESSING record whose lease expired a lease ago or more (its worker
        died; ``documents.abandon_filter``) is given up too; a live one never.
        """
        ...


class RebuildStore(Clocked, Protocol):
    """What a rebuild uses (``eventbus rebuild``: the processor in replay mode and its runner).

    A rebuild leases stored SUCCESS records under ``rebuild_lease`` (never their
    status) and appends one audit entry per record to ``replays``; its runs and
    plans are in a store of its own (``eventbus.rebuild.store.RunStore``).
    """

    @property
    def lease(self) -> timedelta:
        """How long a rebuild's lease holds a record (the claim's lease)."""
        ...

    def rebuild_claim_many(self, records: Mapping[str, Mapping[str, Any]], rebuild_id: str,
                           now: datetime) -> BatchClaim:
        """Lease every key of ``records`` (key → the record as the caller read it) for a rebuild.

        Taken: a SUCCESS record (not stale, not an entity) without a live rebuild
        lease and without an audit entry of ``rebuild_id``; one owner for the batch.
        ``BatchClaim.records`` holds every other key's record as it stands (absent:
        no record). When every key is taken, the claims' records are the given
        ones with the lease: one round trip, no read back.
        """
        ...

    def rebuild_renew_many(self, owners: Mapping[str, str], now: datetime) -> set[str]:
        """Extend the rebuild leases of ``owners`` (key → owner); return the keys still held."""
        ...

    def rebuild_finish_many(self, finishes: Sequence[Finish], now: datetime) -> Finished:
        """Store each rebuilt record's audit entry (``Finish.audit``) and new outbox entries.

        Fenced by the rebuild lease (``Finished.lost``: it lapsed, nothing stored).
        ``Finish.unclaim`` gives the lease back untouched. The status never changes.
        """
        ...


class EventStore(ProcessorStore, OutboxStore, RedriveStore, RebuildStore, Protocol):
    """Every primitive on stored events, their outboxes and guarded effects.

    Only the composition root (``eventbus.assembly``, ``eventbus.web.app``, the
    commands) holds the whole store; each layer takes the protocol of what it uses.
    The operator's queries are ``eventbus.store.operator_queries.OperatorStore``."""

    def summaries(self, roots: Collection[str] | None = None) -> list[Record]:
        """Return the summary fields of every event, or of the cascades from ``roots``.

        Summary fields: key, type, status, retryable, error, outbox keys,
        ``root_key``.
        """
        ...

    def reset(self) -> None:
        """Empty the store's whole database (local demo databases only)."""
        ...
