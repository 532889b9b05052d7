"""The message model and its rules: events, keys, errors, statuses, the router, the context.

* ``event``: the event as parsed and checked; ``content``: what may be stored of a payload;
* ``delivery``: one message as a transport hands it over;
* ``keys``: idempotency keys and the canonical JSON they hash;
* ``errors``: the error types and the classifier (transient, permanent, paused);
* ``status``: the one status vocabulary; ``outcome``: each outcome and its facts;
* ``router``: routes by ``event_type`` and version; ``context``: what a handler gets;
* ``order``: entity positions (per-entity order); ``forward``: forwarded public events;
* ``contract``: public contracts, declared in code;
* ``rebuild_policy``: what a route does in a rebuild, and what a replayed handler sees.

Moved: ``replaying`` (now ``rebuild_policy``), a stub that warns for one release.

Pure: no I/O, no Flask, no pymongo, no Google client. May import the
standard library and ``eventbus.settings`` only; every other layer may
import it.
"""
