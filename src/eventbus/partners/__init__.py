"""Partners: a breaker, a shared rate, a bulkhead and a slow-call window each.

A handler calls out through ``context.partner(partner_id).call(...)`` (or
``call_async``); what a call goes through, and why, is ``call``'s docstring.

* ``call``: ``Partner`` (one partner's call: bulkhead, breaker, rate, effect,
  outcome) and ``Partners`` (a processor's registry of them);
* ``breaker``: the stored ``BreakerState``, its pure transitions (``admit``,
  ``succeeded``, ``failed``, ``slowed``, ``recorded``, ``forced``), ``swap``
  (compare-and-swap), and ``partner_name``;
* ``bulkhead``: a cap on one partner's calls in flight in a process;
* ``slow_calls``: a process's window of a partner's latest calls;
* ``documents``: the stored breaker and rate-bucket documents, pure builders;
* ``store``: ``PartnerStore``, the feature's store protocol, and ``store_beside``;
* ``mongo`` / ``memory``: the store's partner primitives, on MongoDB and on a dict;
* ``parked``: which parked events the redrive sweeper may bring back (``Gate``);
* ``view``: the operator's view (``eventbus partners``, the console's Partners page);
* ``command``: the ``eventbus partners ...`` commands;
* ``gauges``: the breaker and parked-event gauges of telemetry.

May import: the core (``eventbus.model``, ``eventbus.settings``, ``eventbus.clock``,
``eventbus.store``, ``eventbus.ops`` in ``view`` and ``command`` only); pymongo only in
``mongo``. The core imports this package only through ``eventbus.assembly``.
"""

from eventbus.partners.breaker import (
    CLOSED,
    HALF_OPEN,
    OPEN,
    BreakerState,
    CallOutcome,
    Decision,
    Policy,
    admit,
    describe_reason,
    failed,
    forced,
    partner_name,
    recorded,
    slowed,
    succeeded,
    swap,
)
from eventbus.partners.call import Partner, Partners, Started

__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "BreakerState", "CallOutcome", "Decision", "Partner",
           "Partners", "Policy", "Started", "admit", "describe_reason", "failed", "forced",
           "partner_name", "recorded", "slowed", "succeeded", "swap"]
