"""The outbox: children a handler emitted, published after the parent's SUCCESS.

``relay`` publishes pending entries inline (the processor's ``after_success``
hook) and as a sweeper. May import ``eventbus.model``, ``eventbus.store.base``
and ``eventbus.pubsub.message``; it reaches the outbox only through the store.
"""
