"""The idempotency state machine, written once over the store's primitives.

locate (once per message: ``intake``) → claim → dispatch under a renewed
lease (``heartbeat``) → finish (``machine``). Each step's failure has exactly
one outcome; ``eventbus.web.http_status`` turns outcomes into status codes.

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
* a different payload under a taken key         → recorded as a conflict → CONFLICT (ack)
* another worker took the lease meanwhile       → LEASE_LOST (503), its holder decides
* the store is unreachable                      → UNAVAILABLE (503), nothing changed

May import: ``eventbus.model``, ``eventbus.store.base``/``documents``, ``eventbus.guard``,
``eventbus.telemetry`` (spans and counters, a no-op by default) and ``eventbus.settings``.
Never Flask, pymongo or a Google client.
"""

from eventbus.processor.heartbeat import Heartbeat
from eventbus.processor.intake import Intake, Located
from eventbus.processor.machine import AfterSuccess, Clock, Processor, Result

__all__ = ["AfterSuccess", "Clock", "Heartbeat", "Intake", "Located", "Processor", "Result"]
