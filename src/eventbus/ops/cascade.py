"""Follow a cascade from its source: ``eventbus trace KEY``.

Every child carries ``parent_key`` and ``root_key``, and every parent lists its
children in ``outbox``. Given any key of a cascade, ``load`` goes to the root
and walks down the outboxes, reading each level's documents by their unique
key; ``render`` prints the tree with each event's status and, for children,
whether the relay published them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from eventbus.model.forward import is_forward
from eventbus.model.status import Status
from eventbus.ops.render import safe
from eventbus.store.base import EventStore

# Cascades are a few steps deep; the cap only stops a corrupted loop.
MAX_DEPTH = 32
NOT_RECEIVED = "NOT RECEIVED"


@dataclasses.dataclass
class Node:
    """One event of a cascade: its stored state and, for a child, its outbox entry."""

    key: str
    event_type: str
    status: str
    entry: Mapping[str, Any] | None = None
    error: str = ""
    children: list[Node] = dataclasses.field(default_factory=list)


def load(store: EventStore, key: str) -> Node | None:
    """Return the cascade that ``key`` belongs to, from its root; None if ``key`` is unknown."""
    document = store.get(key)
    if document is None:
        return None
    root_key = document.get("root_key") or key
    # The root may be gone (TTL) while its descendants remain: start from what is left.
    root = store.get(root_key) if root_key != key else document
    return _tree(store, root or document, None, 0)


def _tree(store: EventStore, document: Mapping[str, Any] | None,
          entry: Mapping[str, Any] | None, depth: int) -> Node:
    node = _node(document, entry)
    # Forwards to public topics are shown with the event (``eventbus show``), not as children.
    outbox = [entry for entry in (document or {}).get("outbox", []) if not is_forward(entry)]
    if not outbox or depth >= MAX_DEPTH:
        return node
    keys = [str(child.get("idempotency_key")) for child in outbox]
    found = {doc["idempotency_key"]: doc for doc in store.get_many(keys)}
    node.children = [_tree(store, found.get(child_key), child, depth + 1)
                     for child_key, child in zip(keys, outbox, strict=True)]
    return node


def _node(document: Mapping[str, Any] | None, entry: Mapping[str, Any] | None) -> Node:
    source = document or entry or {}
    status = str(document.get("event_status", "?")) if document else NOT_RECEIVED
    if document and status == Status.FAILED:
        status += " (retrying)" if document.get("retryable") else " (for good)"
    error = (document or {}).get("error") or {}
    return Node(key=str(source.get("idempotency_key", "?")),
                event_type=str(source.get("event_type", "?")), status=status, entry=entry,
                error=str(error.get("message", "")) if isinstance(error, Mapping) else "")


def render(node: Node, marked: str = "") -> str:
    """Return the tree as text, one event per line; the ``marked`` key gets an arrow."""
    return "\n".join(_lines(node, "", "", marked))


def _lines(node: Node, first: str, rest: str, marked: str) -> Iterator[str]:
    arrow = "  <--" if node.key == marked else ""
    # Keys, types and errors come from messages: escaped, so none can move the cursor.
    yield (f"{first}{safe(node.event_type)}  {node.status}  {safe(node.key)}"
           f"{_published(node)}{arrow}")
    if node.error:
        yield f"{rest}    error: {safe(node.error)}"
    for number, child in enumerate(node.children, 1):
        last = number == len(node.children)
        yield from _lines(child, rest + ("└─ " if last else "├─ "),
                          rest + ("   " if last else "│  "), marked)


def _published(node: Node) -> str:
    entry = node.entry
    if entry is None:
        return ""
    if entry.get("status") == Status.PUBLISHED:
        return (f"  [published {entry.get('published_at')}, "
                f"messageId {safe(entry.get('messageId'))}]")
    attempts = entry.get("publish_attempts", 0)
    last = (entry.get("last_error") or {}).get("message", "")
    return f"  [outbox {safe(entry.get('status'))}, {attempts} publish attempts" + \
        (f", last error: {safe(last)}]" if last else "]")
