"""Forwarding to public topics: which events, under which contract, through which mapping.

The sync guide's event-bus rule: other services do not subscribe to the bus
(they would come to depend on every internal step); chosen events are
forwarded to **dedicated topics** whose structure stays backward compatible.
A router declares it next to its handlers::

    routes.forward("OR_MGMT", topic="order-status", contract=OrderStatusV1,
                   fields={"order_id": "entity_data.orderId",
                           "status": "entity_data.orderStatusLatest",
                           "partner_id": "entity_metadata.partnerId"},
                   when={"entity_data.orderStatusLatest": ("OR_SHP", "OR_DLV")})

``fields`` maps each contract field to a dotted path in the event document
(as the handler received it, after upcasting), or to ``path(p, convert)``
when the value needs converting (``path("entity_data.orderId", str)``);
``when`` keeps only events whose values at those paths are among the given
ones. Two contracts of one topic
(``v1`` and ``v2``) may be served side by side: each SUCCESS then forwards one
message per version, told apart by the ``contract_version`` attribute.

A forward is an **outbox entry** written with the event's SUCCESS (so never
zero times, and never before the effect is stored) and published by the
relay or its sweeper. Its identity is deterministic (``forward_key``) and the
message carries the source event's idempotency key, so a consumer that
deduplicates on it sees each event once. An entry that was already
PUBLISHED is kept as it is when the event runs again (an operator replay),
so it is not forwarded twice. An event whose values do not fit the contract
gets a FAILED entry with the reason instead: visible to operators, never
published half-built, and the business effect stays done once.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from eventbus.model.content import bounded_text, error_text
from eventbus.model.contract import Contract, ContractError, ContractViolation, contract_of
from eventbus.model.event import Event, lookup
from eventbus.model.keys import MAX_KEY_LENGTH, digest
from eventbus.model.status import Status

KIND = "public"
"""``kind`` of a forwarding entry in an outbox (children have none)."""
EVENT_ROOTS = ("event_type", "event_version", "event_direction", "entity_metadata",
               "entity_data")
# Pub/Sub's topic id rule: 3..255 characters, a letter first, not "goog...".
_TOPIC = re.compile(r"^(?!goog)[A-Za-z][A-Za-z0-9._~+%-]{2,254}$")


def is_forward(entry: Mapping[str, Any]) -> bool:
    """True for an outbox entry that forwards to a public topic (not a cascade child)."""
    return entry.get("kind") == KIND


def forward_key(source_key: str, topic: str, version: str) -> str:
    """The deterministic identity of one event's forward to ``topic`` under ``version``."""
    key = f"{source_key}>{topic}@{version}"
    return key if len(key) <= MAX_KEY_LENGTH else f"f:{digest(key)}"


@dataclasses.dataclass(frozen=True)
class Path:
    """A dotted path of the event and a conversion of the value found there."""

    path: str
    convert: Callable[[Any], Any]

    def read(self, document: Mapping[str, Any]) -> Any:
        """The converted value; None stays None; a failed conversion is a ``ContractViolation``.

        Whatever ``convert`` raises (``int("x")``, ``v.upper()`` of a number, an
        exception of its own) means the value does not fit the mapping.
        """
        value = lookup(document, self.path)
        if value is None:
            return None
        try:
            return self.convert(value)
        except Exception as exc:  # the user's conversion: any failure is the value's
            raise ContractViolation(f"{self.path}: {type(exc).__name__}: "
                                    f"{error_text(exc, 500)}") from None


def path(where: str, convert: Callable[[Any], Any]) -> Path:
    """Map a contract field to ``convert`` of the value at ``where``."""
    return Path(where, convert)


def _path_of(source: str | Path) -> str:
    return source.path if isinstance(source, Path) else source


def _read(document: Mapping[str, Any], source: str | Path) -> Any:
    return source.read(document) if isinstance(source, Path) else lookup(document, source)


@dataclasses.dataclass(frozen=True)
class Forward:
    """One declaration: events of ``event_type`` go to ``topic`` as ``contract``."""

    event_type: str
    topic: str
    contract: Contract
    fields: Mapping[str, str | Path]
    when: Mapping[str, tuple[Any, ...]] = dataclasses.field(default_factory=dict)

    def problems(self) -> list[str]:
        """What makes this declaration unusable, whatever the router holds."""
        where = f"forward {self.event_type} -> {self.topic} ({self.contract.ref})"
        found = [] if _TOPIC.match(self.topic) else [
            f"{where}: {self.topic!r} is not a Pub/Sub topic id"]
        for name in self.fields:
            if self.contract.field(name) is None:
                found.append(f"{where}: the contract has no field {name!r}")
        for spec in self.contract.fields:
            if spec.required and spec.name not in self.fields:
                found.append(f"{where}: required field {spec.name!r} is not mapped")
        for source in [*map(_path_of, self.fields.values()), *self.when]:
            if source.split(".", 1)[0] not in EVENT_ROOTS:
                found.append(f"{where}: {source!r} is not a path in the event "
                             f"(it starts with one of {', '.join(EVENT_ROOTS)})")
        return found

    def selects(self, document: Mapping[str, Any]) -> bool:
        """True when ``document`` passes every ``when`` condition."""
        return all(lookup(document, path) in accepted for path, accepted in self.when.items())

    def body(self, document: Mapping[str, Any]) -> dict[str, Any]:
        """The public body for ``document``; ``ContractViolation`` if it does not fit."""
        values = {name: _read(document, source) for name, source in self.fields.items()}
        return self.contract.body(values)

    def entry(self, key: str, root_key: str, document: Mapping[str, Any],
              created_at: datetime) -> dict[str, Any]:
        """The outbox entry forwarding ``document`` (its record's key ``key``)."""
        entry = self.head(key, root_key, created_at)
        try:
            entry["body"] = self.body(document)
        except Exception as exc:  # ContractViolation, or a value that breaks the checks
            return _failed(entry, exc)
        entry["status"] = Status.PENDING.value
        return entry

    def head(self, key: str, root_key: str, created_at: datetime) -> dict[str, Any]:
        """The entry's identity and routing, before its body and status."""
        return {"idempotency_key": forward_key(key, self.topic, self.contract.version),
                "kind": KIND, "topic": self.topic, "contract": self.contract.name,
                "contract_version": self.contract.version, "source_key": key,
                "event_type": self.event_type, "parent_key": key, "root_key": root_key,
                "publish_attempts": 0, "created_at": created_at}


class Forwards:
    """The forwarding declarations of a router."""

    def __init__(self) -> None:
        self._by_type: dict[str, list[Forward]] = {}

    def add(self, event_type: str, *, topic: str, contract: Any,
            fields: Mapping[str, str | Path],
            when: Mapping[str, Iterable[Any]] | None = None) -> Forward:
        """Declare a forward; ``ContractError`` for one that cannot work or is declared twice."""
        forward = Forward(event_type, topic, contract_of(contract), dict(fields),
                          {path: tuple(values) for path, values in (when or {}).items()})
        problems = forward.problems()
        if problems:
            raise ContractError("; ".join(problems))
        self._put(forward)
        return forward

    def _put(self, forward: Forward) -> None:
        same = [f for f in self._by_type.get(forward.event_type, [])
                if (f.topic, f.contract.version) == (forward.topic, forward.contract.version)]
        if same and same[0] != forward:
            raise ContractError(f"{forward.event_type} is forwarded to {forward.topic} as "
                                f"{forward.contract.version} twice")
        if not same:
            self._by_type.setdefault(forward.event_type, []).append(forward)

    def include(self, other: Forwards) -> None:
        """Add every declaration of ``other``."""
        for forward in other.all():
            self._put(forward)

    def all(self) -> list[Forward]:
        """Every declaration, by event type then topic and version."""
        return sorted((f for group in self._by_type.values() for f in group),
                      key=lambda f: (f.event_type, f.topic, _number(f.contract.version)))

    def check(self, internal: Mapping[str, bool]) -> None:
        """Refuse forwards of unhandled or internal types, and topics with clashing contracts.

        ``internal`` maps each handled event type to whether it is internal.
        """
        problems = []
        for forward in self.all():
            if forward.event_type not in internal:
                problems.append(f"forward {forward.event_type} -> {forward.topic}: no handler "
                                f"for {forward.event_type!r}, so no such event ever succeeds")
            elif internal[forward.event_type]:
                problems.append(f"forward {forward.event_type} -> {forward.topic}: "
                                f"{forward.event_type!r} is an internal step; only events "
                                "from outside may be made public")
        problems += _clashes(self.all())
        if problems:
            raise ContractError("; ".join(problems))

    def topics(self) -> dict[str, list[Contract]]:
        """Each public topic and the contract versions it serves, oldest first."""
        served: dict[str, dict[str, Contract]] = {}
        for forward in self.all():
            served.setdefault(forward.topic, {})[forward.contract.version] = forward.contract
        return {topic: [found[v] for v in sorted(found, key=_number)]
                for topic, found in sorted(served.items())}

    def entries(self, event: Event, key: str, root_key: str, created_at: datetime,
                previous: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
        """The forwarding entries of one SUCCESS; ones already PUBLISHED are kept as they are."""
        declared = self._by_type.get(event.event_type)
        if not declared:
            return []
        document = event.to_document()
        published = {entry.get("idempotency_key"): entry for entry in previous
                     if is_forward(entry) and entry.get("status") == Status.PUBLISHED}
        out = []
        for forward in declared:
            try:
                selected = forward.selects(document)
            except Exception as exc:  # a value the handler's event holds refuses comparing
                entry = _failed(forward.head(key, root_key, created_at), exc)
            else:
                if not selected:
                    continue
                entry = forward.entry(key, root_key, document, created_at)
            out.append(dict(published.get(entry["idempotency_key"], entry)))
        return out


def _failed(entry: dict[str, Any], exc: Exception) -> dict[str, Any]:
    """``entry`` FAILED for good with ``exc``: never published, shown to operators.

    A forward is built after the handler's effect is done, so its failure
    (the event does not fit the contract, or the mapping's own code raised)
    fails the forward only; the event stays SUCCESS and its effect is not
    repeated. The same event fails the same way again: permanent.
    """
    entry.update(status=Status.FAILED.value, error={
        "type": bounded_text(type(exc).__name__, 200), "message": error_text(exc),
        "classification": "permanent"})
    return entry


def _clashes(forwards: Sequence[Forward]) -> list[str]:
    """A topic serves one contract name, and a field keeps its type across versions."""
    problems: list[str] = []
    names: dict[str, str] = {}
    kinds: dict[tuple[str, str], tuple[str, bool]] = {}
    for forward in forwards:
        topic, contract = forward.topic, forward.contract
        if names.setdefault(topic, contract.name) != contract.name:
            problems.append(f"topic {topic} serves two contracts, {names[topic]} and "
                            f"{contract.name}; one topic, one contract (in versions)")
        for spec in contract.fields:
            kind = (spec.kind, spec.repeated)
            if kinds.setdefault((topic, spec.name), kind) != kind:
                problems.append(f"topic {topic}: field {spec.name!r} changes type between "
                                "versions; a retyped field needs a new field name or topic")
    return sorted(set(problems))


def _number(version: str) -> int:
    return int(version[1:])


__all__ = ["KIND", "ContractError", "Forward", "Forwards", "Path", "forward_key",
           "is_forward", "lookup", "path"]
