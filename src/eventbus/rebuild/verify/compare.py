"""What an outbox emits, and how a recorded outbox and a sandbox one differ.

An outbox holds a parent's children (in emit order: a child's key carries its
index) and its public-topic forwards (``kind: public``, keyed by topic and
contract version). Children are compared **by position**, so a renamed step
reads "child 0: stored A, now B" rather than an unrelated missing and new
child; forwards by their key. A child's payload is its stored
``payload_fingerprint`` (``eventbus.model.keys.fingerprint_text`` of the
child's canonical JSON); a forward's is the fingerprint of its public body.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from eventbus.model.forward import is_forward
from eventbus.model.keys import canonical_json, fingerprint_document, fingerprint_text
from eventbus.model.status import Status

Kind = Literal["missing", "new", "changed", "payload", "forward_missing", "forward_new",
               "forward_body", "forward_failed"]
_EVENT_FIELDS = ("event_type", "event_version", "event_direction", "entity_metadata",
                 "entity_data")


class Malformed(ValueError):
    """Raised when a recorded outbox is not a list of entries: nothing to compare with."""


@dataclasses.dataclass(frozen=True)
class Emitted:
    """One child or forward: its key, its type (a forward's: topic@version), its fingerprint.

    ``failed`` marks a forward whose body could not be built (stored FAILED).
    """

    key: str
    event_type: str
    fingerprint: str
    failed: bool = False

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {"key": self.key, "type": self.event_type, "fingerprint": self.fingerprint,
                **({"failed": True} if self.failed else {})}


@dataclasses.dataclass(frozen=True)
class Difference:
    """One way the current code's outbox differs from the recorded one.

    ``index`` is the child's position (None for a forward); ``stored`` and
    ``now`` are the two sides (one is None for a missing or new one).
    """

    kind: Kind
    stored: Emitted | None
    now: Emitted | None
    index: int | None = None

    @property
    def child(self) -> str:
        """The key that names the child (or forward): the recorded one when there is one."""
        side = self.stored or self.now
        assert side is not None
        return side.key

    def text(self) -> str:
        """One line for an operator (values still to be escaped by the caller)."""
        stored, now = self.stored, self.now
        where = f"child {self.index}" if self.index is not None else "forward"
        if self.kind in ("missing", "forward_missing"):
            assert stored is not None
            return f"{where} {stored.key} ({stored.event_type}) is no longer emitted"
        if self.kind in ("new", "forward_new"):
            assert now is not None
            return f"{where} {now.key} ({now.event_type}) is new: it was never emitted"
        assert stored is not None and now is not None
        if self.kind == "changed":
            return (f"{where}: stored {stored.key} ({stored.event_type}), now {now.key} "
                    f"({now.event_type}): a renamed, added or reordered step")
        if self.kind == "forward_failed":
            return (f"{where} {stored.key}: stored {_built(stored)}, now {_built(now)}")
        return (f"{where} {stored.key} ({stored.event_type}): payload fingerprint "
                f"{stored.fingerprint[:12]} stored, {now.fingerprint[:12]} now")

    def to_json(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {"kind": self.kind, "child": self.child, "index": self.index,
                "stored": self.stored.to_json() if self.stored else None,
                "now": self.now.to_json() if self.now else None, "text": self.text()}


def _built(side: Emitted) -> str:
    return "FAILED (the event did not fit the contract)" if side.failed else "built"


@dataclasses.dataclass(frozen=True)
class Emits:
    """An outbox read for comparing: its children in order, its forwards by key."""

    children: tuple[Emitted, ...]
    forwards: Mapping[str, Emitted]


def emitted(outbox: Any) -> Emits:
    """Read an outbox (stored or the sandbox's); ``Malformed`` when it is not a list of entries."""
    if outbox is None:
        outbox = []
    if not isinstance(outbox, Sequence) or isinstance(outbox, str | bytes):
        raise Malformed("its stored outbox is not a list")
    children: list[Emitted] = []
    forwards: dict[str, Emitted] = {}
    for number, entry in enumerate(outbox):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("idempotency_key"), str):
            raise Malformed(f"its stored outbox entry {number} is not an entry with a key")
        if is_forward(entry):
            forwards[entry["idempotency_key"]] = _forward(entry)
        else:
            children.append(Emitted(entry["idempotency_key"], str(entry.get("event_type")),
                                    _child_fingerprint(entry)))
    return Emits(tuple(children), forwards)


def _child_fingerprint(entry: Mapping[str, Any]) -> str:
    found = entry.get("payload_fingerprint")
    if isinstance(found, str):
        return found
    # Older entries have no stored fingerprint: the child's event fields, as emit hashes them.
    return fingerprint_document({name: entry.get(name) for name in _EVENT_FIELDS})


def _forward(entry: Mapping[str, Any]) -> Emitted:
    kind = f"{entry.get('topic')}@{entry.get('contract_version')}"
    failed = entry.get("status") == Status.FAILED or "body" not in entry
    body = "" if failed else fingerprint_text(canonical_json(entry.get("body")))
    return Emitted(entry["idempotency_key"], kind, body, failed=failed)


def compare(stored: Emits, now: Emits, *, forwards: bool = True) -> list[Difference]:
    """Every difference between the recorded outbox and the current code's, children first.

    ``forwards=False``: the children only (what was recorded holds no forwards).
    """
    found: list[Difference] = []
    for index in range(max(len(stored.children), len(now.children))):
        old = stored.children[index] if index < len(stored.children) else None
        new = now.children[index] if index < len(now.children) else None
        if old is None:
            found.append(Difference("new", None, new, index))
        elif new is None:
            found.append(Difference("missing", old, None, index))
        elif (old.key, old.event_type) != (new.key, new.event_type):
            found.append(Difference("changed", old, new, index))
        elif old.fingerprint != new.fingerprint:
            found.append(Difference("payload", old, new, index))
    if not forwards:
        return found
    for key in sorted(stored.forwards.keys() | now.forwards.keys()):
        was, is_now = stored.forwards.get(key), now.forwards.get(key)
        if is_now is None:
            found.append(Difference("forward_missing", was, None))
        elif was is None:
            found.append(Difference("forward_new", None, is_now))
        elif was.failed != is_now.failed:
            found.append(Difference("forward_failed", was, is_now))
        elif was.fingerprint != is_now.fingerprint:
            found.append(Difference("forward_body", was, is_now))
    return found
