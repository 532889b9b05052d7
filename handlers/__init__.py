"""Business handlers, one module per domain. Importing this package registers them all.

A handler is a function of one ``Context``, registered with
``@router.handler(event_type, versions=..., upcasters=...)``:

* return normally → the event is stored SUCCESS and acked;
* raise ``PermanentError`` → stored FAILED for good and acked;
* raise anything else → stored FAILED, retryable; Pub/Sub redelivers later.

Write effects so that running them twice is harmless (the framework makes a
second run rare, not impossible: a lease can expire under a slow handler).
"""

from handlers import notifications, orders, promotions, subscriptions

__all__ = ["notifications", "orders", "promotions", "subscriptions"]
