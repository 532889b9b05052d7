"""The idempotency state machine, written once over the store's primitives, as stages over a batch.

``Processor.run(deliveries)`` (push: ``process(delivery)``, a batch of one):
locate each delivery once (``intake``) → refuse what can never run → claim the
batch → run the handlers under renewed leases (``heartbeat``) → finish the
batch → relay what succeeded (``pipeline``). Each item's outcome is one of:

* record already SUCCESS, or FAILED for good   → DUPLICATE (ack, handler not run)
* record PROCESSING under a live lease          → IN_PROGRESS (503, redelivered later)
* new, retryable, or lease expired              → claimed, the handler runs
* handler returned                              → SUCCESS (+ outbox) → PROCESSED;
                                                  then ``after_success`` (the inline relay),
                                                  whose failures never change the outcome
* handler raised a transient error              → FAILED retryable → RETRY (503)
* handler raised a permanent error, or the attempt cap is reached
                                                → FAILED for good → REJECTED (ack)
* payload can never be an event, or its content
  can never be stored, or it forges a cascade    → stored FAILED, bounded → REJECTED (ack)
  (``rejections``)
* a different payload under a taken key         → recorded as a conflict → CONFLICT (ack)
* another worker took the lease meanwhile       → LEASE_LOST (503), its holder decides
* the store is unreachable                      → UNAVAILABLE (503), nothing changed

The modules: ``pipeline`` (``Processor``, the stages), ``intake`` (locate),
``rejections`` (what is refused and stored FAILED), ``heartbeat`` (lease renewal),
``ordering`` (per-entity lanes and holds), ``handler_loop`` (the event loop of the
``async def`` handlers), ``work`` (an item's state through the stages), ``middleware``,
``mode`` (the declared steps a mode may replace: ``Mode``, ``LiveMode``).
Moved: ``replay_mode`` (now ``eventbus.rebuild.mode``), a stub that warns.

``eventbus.web.http_status`` turns outcomes into status codes; the pull
worker acks or nacks on the same ``Outcome.acked``. Observers (telemetry, the
worker's batch timings) are ``middleware`` around the stages.

May import: ``eventbus.model``, ``eventbus.store.base``/``documents``, ``eventbus.guard``,
``eventbus.correlation`` (log lines' trace) and ``eventbus.settings``.
Never Flask, pymongo, a Google client, or ``eventbus.telemetry``.
"""

from eventbus.processor.heartbeat import Heartbeat
from eventbus.processor.intake import Intake, Located
from eventbus.processor.middleware import Middleware
from eventbus.processor.pipeline import AfterSuccess, Clock, Processor
from eventbus.processor.work import Item, Result

__all__ = ["AfterSuccess", "Clock", "Heartbeat", "Intake", "Item", "Located", "Middleware",
           "Processor", "Result"]
