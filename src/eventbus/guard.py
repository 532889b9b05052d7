"""The side-effect guard: seed 004's "Idempotence For Side Effects", on the store.

A side effect the event store cannot make idempotent (an HTTP call to a
partner, an e-mail) runs through ``Guard.run(key, effect)``:

1. **key check**: the key is SUCCESS → the effect is not run again; its
   stored result is returned (``Guarded.skipped``);
2. **lease lock**: the key is leased to this call; if another worker holds a
   live lease, ``LeaseHeld`` (transient: the event is redelivered later);
3. **the effect** runs and returns a JSON-able result;
4. **the key set permanently**: SUCCESS with the result; if the effect
   raised, FAILED with the error, the lease released, and the error re-raised.

The lease is taken and compared on the store's clock, and renewed with the
handler's (``keep``: the processor's heartbeat) while the effect runs, so a
partner call longer than the lease is not taken over by a duplicate delivery.
This narrows duplicate effects to one case: the worker dies (or is frozen
past its lease, so its renewals stop) after the effect started and before
SUCCESS was stored. Passing the key on to the other side (an
``Idempotency-Key`` header) closes it.

May import: ``eventbus.model``, ``eventbus.store.base`` and the pure builders of
``eventbus.store.documents``; it talks to the store only through
``guard_take`` and ``guard_finish``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from eventbus.model.errors import ReplayRefused
from eventbus.model.status import Status
from eventbus.store.base import GuardStore
from eventbus.store.documents import error_document

Effect = Callable[[], Mapping[str, Any] | None]
"""A side effect; what it returns (a mapping, or None for nothing) is stored as its result."""
Keeper = Callable[[str, str], contextlib.AbstractContextManager[Any]]
"""Keeps a guard's lease (key, owner) alive for a block: the processor's heartbeat."""


def _unkept(key: str, owner: str) -> contextlib.AbstractContextManager[Any]:
    """No renewal (a guard used outside a processor): the lease runs its length."""
    return contextlib.nullcontext()


@dataclasses.dataclass(frozen=True)
class Guarded:
    """The outcome of ``Guard.run``: the effect's result, now or from an earlier run."""

    key: str
    result: Mapping[str, Any]
    skipped: bool
    """True when an earlier run already succeeded and the effect was not run now."""


class Guard:
    """Runs side effects at most once per key (see the module docstring)."""

    def __init__(self, store: GuardStore, *, lease: timedelta, now: Callable[[], datetime],
                 keep: Keeper | None = None) -> None:
        self.store, self.lease, self.now = store, lease, now
        self.keep: Keeper = keep or _unkept

    def run(self, key: str, effect: Effect, *,
            classify: Callable[[BaseException], str] = lambda exc: "transient") -> Guarded:
        """Run ``effect`` unless ``key`` already succeeded; see the module docstring.

        ``classify`` names the failure stored on FAILED (``transient`` or ``permanent``).
        """
        owner = uuid.uuid4().hex
        done = self.store.guard_take(key, owner, self.now(), self.lease)
        if done is not None:
            return Guarded(key, dict(done.get("result") or {}), skipped=True)
        try:
            with self.keep(key, owner):
                result = dict(effect() or {})
        except BaseException as exc:
            # Guarded by the owner: a worker whose lease ran out must not undo
            # the state that the lease's next holder wrote.
            self.store.guard_finish(key, owner, self.now(), succeeded=False,
                                    result=error_document(exc, classify(exc)))
            raise
        self.store.guard_finish(key, owner, self.now(), succeeded=True, result=result)
        return Guarded(key, result, skipped=False)


class ReplayGuard(Guard):
    """The guard of replay mode (``eventbus.model.replaying``): a guarded effect is never run again.

    A key that succeeded returns the result stored the first time (one read,
    ``guard_get``); a key that never succeeded raises ``ReplayRefused``, unless
    ``new_calls`` (the operator's ``--allow-new-calls``) lets it run as live.
    """

    def __init__(self, store: GuardStore, *, lease: timedelta, now: Callable[[], datetime],
                 keep: Keeper | None = None, new_calls: bool = False) -> None:
        super().__init__(store, lease=lease, now=now, keep=keep)
        self.new_calls = new_calls

    def run(self, key: str, effect: Effect, *,
            classify: Callable[[BaseException], str] = lambda exc: "transient") -> Guarded:
        """Return the stored result of ``key``; refuse (or, allowed, run) one never made."""
        done = self.store.guard_get(key)
        if done is not None and done.get("status") == Status.SUCCESS:
            return Guarded(key, dict(done.get("result") or {}), skipped=True)
        if not self.new_calls:
            raise ReplayRefused(f"guarded call {key!r} never succeeded before; a rebuild makes "
                                "it only with --allow-new-calls")
        return super().run(key, effect, classify=classify)
