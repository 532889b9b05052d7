"""A Pub/Sub push-subscription framework: dispatch on ``event_type``, idempotent on MongoDB.

Handlers register on the one ``router``::

    from eventbus import router

    @router.handler("OR_MGMT", versions=("v2",))
    def on_order(context): ...
"""

from eventbus.router import router

__all__ = ["router"]
