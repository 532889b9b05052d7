"""Gauges of each partner's breaker and parked events, read from the store at each export.

One series per partner (attribute ``eventbus.partner``), for at most
``MAX_PARTNERS`` partners: their names come from messages, so their number is
capped before they become series. A store that cannot answer reports nothing.

Telemetry observes them when ``eventbus.assembly`` hands it ``watching(store)``
(``Telemetry.observe``); OpenTelemetry is imported only when they are read, so a
service without the ``[telemetry]`` extra imports this module too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

from eventbus.telemetry import names

if TYPE_CHECKING:
    from opentelemetry.metrics import Meter
    from opentelemetry.metrics import Observation as Measurement

Gauges = Callable[["Meter", Callable[[], datetime]], None]
"""What ``Telemetry.observe`` takes: gauges to create on its meter, with its clock."""

logger = logging.getLogger("eventbus.telemetry")
MAX_PARTNERS = 100
STATES = {"half_open": 1, "open": 2}
"""The ``breaker_state`` values; anything else (closed) is 0."""


def watching(store: Any) -> Gauges:
    """Return the partner gauges of ``store``, for ``Telemetry.observe``."""
    return lambda meter, now: partner_gauges(meter, store, now)


def partner_gauges(meter: Meter, store: Any, now: Callable[[], datetime]) -> None:
    """Create the breaker state, open-for and parked gauges on ``meter``, reading ``store``."""
    def parked() -> list[dict[str, Any]]:
        return [{"name": k, "n": v} for k, v in sorted(store.parked_counts().items())]

    readers: list[tuple[str, str, Callable[[], list[Measurement]]]] = [
        (names.BREAKER_STATE, "1", lambda: _read(store.breakers, _state)),
        (names.BREAKER_OPEN_FOR, "s", lambda: _read(store.breakers, _open_for(now()))),
        (names.PARKED, "{event}", lambda: _read(parked, lambda doc: doc["n"]))]
    for name, unit, read in readers:
        meter.create_observable_gauge(name, callbacks=[_callback(read)], unit=unit)


def _callback(read: Callable[[], list[Measurement]]) -> Callable[[Any], list[Measurement]]:
    return lambda options: read()


def _read(rows: Callable[[], Iterable[dict[str, Any]]],
          value: Callable[[dict[str, Any]], float]) -> list[Measurement]:
    from opentelemetry.metrics import Observation as Measurement

    try:
        found = list(rows())[:MAX_PARTNERS]
    except Exception as exc:  # a store that cannot answer now reports nothing
        logger.debug("partners not read: %s", exc)
        return []
    return [Measurement(value(doc), {names.PARTNER: str(doc["name"])}) for doc in found]


def _state(doc: dict[str, Any]) -> float:
    return STATES.get(str(doc.get("state")), 0)


def _open_for(now: datetime) -> Callable[[dict[str, Any]], float]:
    def seconds(doc: dict[str, Any]) -> float:
        opened = doc.get("opened_at")
        if doc.get("state") == "closed" or not isinstance(opened, datetime):
            return 0.0
        return max((now - opened).total_seconds(), 0.0)
    return seconds
