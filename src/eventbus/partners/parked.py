"""Which parked events a redrive pass brings back: as many as their partner's breaker lets through.

A parked event is due at its breaker's reopening (``redrive_at``); when that
comes, its partner is most likely still down. So a pass republishes every
parked event of a partner whose breaker is closed (it answers again; a rate
park is always of a closed one), but only one per pass of a partner whose
breaker is open past its time (its probe), and none while the breaker still
refuses (open, a live probe out, or held open by an operator). The others
stay due, unchanged, and the pass reads past them; a probe that closes the
breaker makes them all due at once (``ParkedEvents.unpark``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from eventbus.partners.breaker import CLOSED, BreakerState, Policy, admit
from eventbus.partners.documents import is_parked
from eventbus.partners.store import PartnerStore
from eventbus.settings import Settings

ALL, ONE, NONE = "all", "one", "none"


class Gate:
    """One pass's view of the breakers (each read once per pass)."""

    def __init__(self, store: PartnerStore, settings: Settings, now: datetime) -> None:
        self.store, self.now, self.policy = store, now, Policy.from_settings(settings)
        self._verdicts: dict[str, str] = {}
        """Partner → what this pass still sends it: ``all``, ``one`` (its probe), ``none``."""

    def lets_through(self, record: Mapping[str, Any]) -> bool:
        """True when ``record`` is not parked, or its partner may be called now."""
        if not is_parked(record):
            return True
        partner = str(record["error"].get("partner"))
        verdict = self._verdicts.get(partner) or self._verdict(partner)
        self._verdicts[partner] = NONE if verdict == ONE else verdict
        return verdict != NONE

    def _verdict(self, partner: str) -> str:
        state = BreakerState.from_document(self.store.breaker_get(partner))
        if state.state == CLOSED and state.manual is None:
            return ALL
        return ONE if admit(state, self.now, self.policy)[0].allowed else NONE
