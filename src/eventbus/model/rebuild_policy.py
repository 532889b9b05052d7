"""Replay mode: what a handler sees when an operator's rebuild runs it again.

A rebuild (``eventbus rebuild``, ``eventbus.rebuild.runner``) runs chosen handlers
again over stored SUCCESS events. The handler gets ``context.replay``, a
``Replay`` (who started it, why, when, which rebuild); on a live delivery it
is None. A handler may branch on it, e.g. to skip a write that only makes
sense live. What the library does in replay mode, whatever the handler does:

* guarded side effects (``context.guard.run``) are not run again: the result
  stored the first time is returned; a guarded call that never succeeded
  before is refused (``ReplayRefused``) unless ``new_calls`` is set;
* partner calls made outside the guard (``context.partner(name).call``) are
  refused unless ``new_calls`` is set: the library cannot know whether they
  ran before;
* children the handler emits that exist already are duplicates; new ones are
  published only when ``emit_new`` is set; public forwards only with ``forward``.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Any, Literal

ReplayPolicy = Literal["run", "skip"]
"""A route's behaviour on replay: ``run`` (the default) or ``skip`` (never re-run)."""
REPLAY_POLICIES: tuple[ReplayPolicy, ...] = ("run", "skip")


@dataclasses.dataclass(frozen=True)
class Replay:
    """Who runs a handler again, why and when; ``context.replay`` in replay mode."""

    rebuild_id: str
    by: str
    why: str
    at: datetime
    """When the rebuild started (the store's clock)."""
    new_calls: bool = False
    """Guarded calls that never succeeded, and unguarded partner calls, may run."""
    emit_new: bool = False
    """New children are stored in the outbox and published."""
    forward: bool = False
    """Public forwards are published again."""

    def audit(self) -> dict[str, Any]:
        """The fields every audit entry of this rebuild carries (``replays``)."""
        return {"by": self.by, "why": self.why, "at": self.at, "rebuild": self.rebuild_id}
