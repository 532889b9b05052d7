"""eventbus: a Pub/Sub push-subscription framework, dispatching on ``event_type``, idempotent.

Build a service::

    from eventbus import Router, create_app

    routes = Router()

    @routes.handler("OR_MGMT", versions=("v2",))
    def on_order(context): ...           # or: async def on_order(context): await ...

    app = create_app(routes)             # gunicorn main:app
    asgi = asgi_app(app)                 # or uvicorn main:asgi (the same service)
    worker = create_worker(routes)       # or a pull worker (no Flask): eventbus worker

Publish from another service (needs only google-cloud-pubsub)::

    from eventbus import publish
    publish("OR_MGMT", {...}, entity={"partnerId": "p1", "entity_id": "o-1",
                                      "entity_type": "Order"})

Test handlers without any server: ``eventbus.testing.LocalBus``.

The core, each a package that says what it may import:

* ``eventbus.model``     the message model and rules: event, keys, errors, status,
                         router, context, public contracts and forwards (pure, no I/O);
* ``eventbus.settings``  the frozen ``Settings``, read once from the environment
                         (pydantic-settings models, the ``[service]`` extra);
* ``eventbus.settings_base`` what the settings share with the publisher: the error
                         type, Pub/Sub's size limit, ``publish()``'s two variables (stdlib);
* ``eventbus.clock``     time in one place: the store's clock, lease arithmetic, waits;
* ``eventbus.store``     storage of the event collection, the only layer that talks to
                         it: protocol, documents, MongoDB, in-memory;
* ``eventbus.processor`` the state machine as stages over a batch (push: a batch of
                         one): locate, claim, handle, finish, relay; middleware around them;
* ``eventbus.guard``     the side-effect guard (check, lease, call, done);
* ``eventbus.correlation`` trace context and request ids on every log line and
                         outbound call (the standard library only);
* ``eventbus.http``      outbound HTTP calls that end within a total deadline, their
                         answers capped (requests; httpx for async code);
* ``eventbus.telemetry`` spans and metrics on OpenTelemetry's SDK (off: no-ops);
* ``eventbus.outbox``    children: the relay and its sweeper;
* ``eventbus.pubsub``    Google's edges: envelope, push auth, message, publisher;
* ``eventbus.contracts`` public contracts as files: schemas, the compatibility check.

The features, each one folder with its own store primitives, command and views:

* ``eventbus.partners``  partners: a breaker, a shared rate, a bulkhead and a slow-call
                         window each (``context.partner``); its refusals park events;
* ``eventbus.rebuild``   handlers run again over stored events (``eventbus rebuild``),
                         ``verify`` (a sandboxed dry run) and the ``archive`` reader.

The edges, which put the core and the features together:

* ``eventbus.assembly``  a service's parts from its settings (store, telemetry, relay,
                         processor), for ``create_app`` and ``create_worker`` alike;
* ``eventbus.web``       Flask: ``create_app``, the functions target, the status table;
                         ``asgi_app``: the same service as an ASGI app (Starlette);
* ``eventbus.workers``   the pull worker, the relay and redrive sweepers' loops,
                         the dead-letter drain;
* ``eventbus.ops``       the operator's read and repair tools, the ``eventbus``
                         console script;
* ``eventbus.testing``   ``LocalBus``, a fake clock, a capturing publisher.

Moved, importable from the old path for one release with a ``DeprecationWarning``
(``eventbus._moved``): ``eventbus.bulkhead`` and ``eventbus.slow_calls`` (now in
``eventbus.partners``), ``eventbus.deadline`` and ``eventbus.deadline_async`` (now in
``eventbus.http``).

``create_app`` (Flask), ``create_worker`` and ``Settings`` (pydantic) are imported on
first use, so ``from eventbus import publish`` works where neither Flask, pymongo nor
pydantic is installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from eventbus.model.context import Context
from eventbus.model.contract import contract
from eventbus.model.errors import PermanentError, TransientError
from eventbus.model.forward import path
from eventbus.model.router import Router
from eventbus.pubsub.publisher import Publisher, publish

if TYPE_CHECKING:
    from eventbus.settings import Settings
    from eventbus.web.app import create_app, push_target
    from eventbus.web.asgi import asgi_app
    from eventbus.workers.pull import create_worker

__all__ = ["Context", "PermanentError", "Publisher", "Router", "Settings", "TransientError",
           "asgi_app", "contract", "create_app", "create_worker", "path", "publish",
           "push_target"]

_LAZY = {"create_app": "eventbus.web.app", "push_target": "eventbus.web.app",
         "asgi_app": "eventbus.web.asgi", "Settings": "eventbus.settings",
         "create_worker": "eventbus.workers.pull"}


def __getattr__(name: str) -> Any:
    # PEP 562: the web layer (Flask, pymongo) and the settings (pydantic) load only when
    # asked for.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'eventbus' has no attribute {name!r}")
