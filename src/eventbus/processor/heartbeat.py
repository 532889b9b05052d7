"""Short leases kept alive while a handler runs, so a killed worker's event is free in seconds.

A claim holds its record for ``store.lease`` (default 20 s). While a batch's
handlers run, one background thread per processor renews every live lease
each ``lease / 4`` in one round trip (``renew_many``); a handler shorter than
that costs no store write at all. A
worker that dies stops renewing, and the record is claimable again within one
lease. A renewal that finds the lease taken by another worker marks it lost:
the processor then answers 503 instead of acking work another worker owns.

Three kinds of lease are kept: events' claims (``renew_many``), ordered
entities' holds (``renew_entities``) and side-effect guards' leases
(``guard_renew``, while a guarded effect runs), so a partner call longer than
the lease is never taken over by a duplicate. Every renewal is fenced by the
store: a lease that ran out on the store's clock is lost, never renewed.
``close()`` (its processor's) stops and joins the thread; a batch after it is
not renewed in the background, so a handler longer than a lease then finds its
lease lost (fenced) rather than start a thread nothing would stop.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime

from eventbus.model.errors import StoreUnavailable
from eventbus.store.base import RenewingStore

logger = logging.getLogger("eventbus.heartbeat")


@dataclasses.dataclass
class Lease:
    """One live lease, as the heartbeat sees it."""

    key: str
    owner: str
    lost: bool = False
    entity: bool = False
    """An ordered entity's hold (``renew_entities``), not an event's lease."""
    guard: bool = False
    """A side-effect guard's lease (``guard_renew``)."""


class Heartbeat:
    """Renews the leases of running handlers; ``beat()`` is one round, tests call it."""

    def __init__(self, store: RenewingStore, *, now: Callable[[], datetime],
                 interval: float | None = None, background: bool = True) -> None:
        self.store, self.now = store, now
        self.interval = interval or store.lease.total_seconds() / 4
        self._live: dict[int, Lease] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._background = background

    @contextlib.contextmanager
    def hold(self, owners: Mapping[str, str],
             entities: Mapping[str, str] | None = None) -> Iterator[dict[str, Lease]]:
        """Keep every lease of a batch (key → owner) alive for the block; yield them by key.

        ``entities`` (entity key → owner) are the ordered entities the batch
        holds: renewed with the leases, so a long handler keeps its entity.
        """
        leases = {key: Lease(key, owner) for key, owner in owners.items()}
        held = [Lease(key, owner, entity=True) for key, owner in (entities or {}).items()]
        # ``_kept`` written out (every push holds its claim here): one generator, not two.
        kept = [*leases.values(), *held]
        self._keep(kept)
        try:
            yield leases
        finally:
            self._drop(kept)

    @contextlib.contextmanager
    def holding(self, entities: Mapping[str, str]) -> Iterator[dict[str, Lease]]:
        """Keep the holds of ``entities`` (entity key → owner) alive; yield their leases by key."""
        held = {key: Lease(key, owner, entity=True) for key, owner in entities.items()}
        with self._kept(list(held.values())):
            yield held

    @contextlib.contextmanager
    def guarding(self, key: str, owner: str) -> Iterator[Lease]:
        """Keep a side-effect guard's lease alive while its effect runs."""
        lease = Lease(key, owner, guard=True)
        with self._kept([lease]):
            yield lease

    @contextlib.contextmanager
    def _kept(self, leases: list[Lease]) -> Iterator[None]:
        """Renew ``leases`` on every beat for the block (``hold`` writes it out)."""
        self._keep(leases)
        try:
            yield
        finally:
            self._drop(leases)

    def _keep(self, leases: list[Lease]) -> None:
        """Register ``leases`` for every beat (the one place they are), the thread started."""
        with self._lock:
            self._live.update((id(lease), lease) for lease in leases)
        if self._background and self._thread is None:
            self._ensure_thread()

    def _drop(self, leases: list[Lease]) -> None:
        """Renew ``leases`` no more."""
        with self._lock:
            for lease in leases:
                self._live.pop(id(lease), None)

    def confirm(self, lease: Lease) -> bool:
        """Renew one entity hold now (before a lane's event); False, and lost, if it lapsed."""
        try:
            lease.lost = not self.store.renew_entities({lease.key: lease.owner}, self.now())
        except StoreUnavailable:
            lease.lost = True  # unknown: the lane stops rather than run unheld
        return not lease.lost

    def beat(self) -> None:
        """Renew every live lease in one round trip; mark the ones another worker took as lost."""
        with self._lock:
            leases = [lease for lease in self._live.values() if not lease.lost]
        for guard in [lease for lease in leases if lease.guard]:
            try:
                guard.lost = not self.store.guard_renew(guard.key, guard.owner, self.store.lease)
            except StoreUnavailable as exc:
                logger.warning("guard lease %s not renewed: %s", guard.key, exc)
        for round_ in _rounds([lease for lease in leases if not lease.guard]):
            renew = self.store.renew_entities if round_[0].entity else self.store.renew_many
            try:
                held = renew({lease.key: lease.owner for lease in round_}, self.now())
            except StoreUnavailable as exc:  # the next beat tries again
                logger.warning("%d leases not renewed: %s", len(round_), exc)
                return
            for lease in round_:
                lease.lost = lease.key not in held

    def close(self) -> None:
        """Stop the background thread and wait for it to end (its beat in flight, if any)."""
        with self._lock:
            self._background = False  # no thread starts after this
            thread = self._thread
        self._wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _ensure_thread(self) -> None:
        if not self._background or self._thread is not None:
            return
        with self._lock:
            if self._thread is None and self._background:
                self._thread = threading.Thread(target=self._run, name="eventbus-heartbeat",
                                                daemon=True)
                self._thread.start()

    def _run(self) -> None:
        # One thread per processor, asleep between beats; daemon, so it never
        # holds a worker's shutdown.
        while not self._wake.wait(self.interval):
            self.beat()


def _rounds(leases: list[Lease]) -> list[list[Lease]]:
    """Split ``leases`` so no key is asked twice in one round (an old and a new owner),
    and events and entities are renewed apart."""
    rounds: list[list[Lease]] = []
    for lease in leases:
        free = next((r for r in rounds if r[0].entity == lease.entity
                     and all(other.key != lease.key for other in r)), None)
        if free is None:
            rounds.append(free := [])
        free.append(lease)
    return rounds
