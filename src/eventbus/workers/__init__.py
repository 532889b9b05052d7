"""Workers: long-running consumers beside the push service.

* ``batch``: a batch of deliveries through the same processor, router and
  handlers as push, claimed and finished with one store round trip each;
* ``rate``: the events-per-second ceiling for rate-limited partners;
* ``pull``: the StreamingPull subscriber loop, ack/nack and shutdown;
* ``command``: ``eventbus worker`` (console script and ``python -m eventbus worker``).

May import: ``eventbus.model``, ``eventbus.settings``, ``eventbus.store`` (the
protocol), ``eventbus.processor``, ``eventbus.telemetry``, and
google-cloud-pubsub (``pull`` only). Never Flask or pymongo: the app object
``eventbus worker`` loads is only read for the service it carries.
"""
