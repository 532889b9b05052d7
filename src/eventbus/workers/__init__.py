"""Workers: long-running consumers and sweepers beside the push service.

* ``rate``: the events-per-second ceiling for rate-limited partners;
* ``pull``: the StreamingPull subscriber loop, ack/nack and shutdown;
  ``subscriber``: its google-cloud-pubsub subscription; ``metrics``: its counters;
* ``command``: ``eventbus worker`` (console script and ``python -m eventbus worker``);
* ``redrive``: the store-driven redrive sweeper (``eventbus redrive``);
* ``original``: the message a stored record came from, rebuilt (redrive and replay);
* ``sweeper``: the sweepers' loops, once or every interval (``eventbus relay``,
  ``eventbus redrive``);
* ``deadletter``: the dead-letter drain (``eventbus dlq drain``).

Moved: ``parked`` (now ``eventbus.partners.parked``), a stub that warns.

May import: ``eventbus.model``, ``eventbus.settings``, ``eventbus.store`` (the
protocol and documents), ``eventbus.processor``, ``eventbus.outbox``,
``eventbus.pubsub.message``, ``eventbus.telemetry``, and google-cloud-pubsub
(``subscriber`` and ``deadletter`` only). Never ``eventbus.ops`` (the CLI imports
the workers, not the other way round), ``eventbus.web``, Flask or pymongo: the
app object ``eventbus worker`` loads is only read for the service it carries.
"""
