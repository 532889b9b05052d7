"""Issue 39, faults 5 and 7: the operator tools decide on the store's clock; one ``--app`` loader.

Fault 5: a store whose clock is at T, a host whose clock is at T + 30 min.
``eventbus partners open|close``, ``eventbus relay`` and the console must
stamp T (REFERENCE.md, "Time"), on both stores: the memory store's clock is a
``FakeClock`` 30 minutes behind the host, the MongoDB store's a ``Shift`` of
-30 minutes on the server's.

Fault 7: every command that takes ``--app`` loads it with ``load_router``:
a Router, a function returning one (``handlers:create_router``) or an app from
``create_app`` (``main:app``), and refuses anything else with one clear line.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import io
import json
import sys
from collections.abc import Callable, Iterator
from typing import Any

import flask
import pytest

from eventbus import Context, Router
from eventbus.clock import Shift, bson_time
from eventbus.model.delivery import Delivery
from eventbus.ops import cli
from eventbus.ops.commands import console, public
from eventbus.ops.commands.common import APP_FORMS, UsageError, locator
from eventbus.partners import BreakerState, Partners
from eventbus.processor import Intake, Processor
from eventbus.pubsub.message import build_event, build_message
from eventbus.rebuild import command as rebuilding
from eventbus.rebuild.verify import command as verify
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.store.mongo import MongoEventStore
from eventbus.testing import CapturingPublisher, FakeClock
from eventbus.web.console import ConsoleConfig, create_console_app
from tests.partner_stores import beside

SKEW = dt.timedelta(minutes=30)
"""How far the host's clock is ahead of the store's."""
CLOSE = dt.timedelta(seconds=5)
"""A stamp within this of the store's clock is on it (the skew is 360 times more)."""
SETTINGS = Settings(max_attempts=5, breaker_failures=2, breaker_open_seconds=30,
                    breaker_probe_seconds=10, relay_inline=False)
MODULE = "tests.ops.test_ops_clock_and_app"


# --- the app forms ``--app`` may name (fault 7), and some it may not -----------------------

ROUTES = Router()


@ROUTES.handler("CALL")
def call(context: Context) -> None:
    """Call partner ``acme``, which is down: two failures open its breaker, then events park."""
    context.partner("acme").call(down)


@ROUTES.handler("PARENT")
def parent(context: Context) -> None:
    """Emit one child, left PENDING in the outbox for ``eventbus relay``."""
    context.emit("CHILD", {"n": 1})


@ROUTES.handler("CHILD")
def child(context: Context) -> None:
    """The child's own handler (a child must be one this app can process)."""


def down() -> None:
    raise ConnectionError("acme is down")


def make_routes() -> Router:
    """A function returning a Router, as ``handlers:create_router``."""
    return ROUTES


def needs_settings(settings: Settings) -> Router:
    """Not a factory: it needs an argument."""
    return ROUTES


def returns_nothing() -> None:
    """A function that returns no router."""


NOT_AN_APP = 42
PLAIN_FLASK = flask.Flask("plain")


# --- fixtures ------------------------------------------------------------------------------

@pytest.fixture(params=["memory", "mongo"])
def store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A store whose clock is 30 minutes behind this host's, on either store."""
    if request.param == "memory":
        yield MemoryEventStore(clock=FakeClock(dt.datetime.now(dt.UTC) - SKEW))
        return
    database = request.getfixturevalue("mongo_db")
    settings = Settings(mongodb_uri=request.getfixturevalue("mongo_uri"),
                        mongodb_db=database.name)
    mongo = MongoEventStore.from_settings(settings, shift=Shift(-SKEW.total_seconds()))
    mongo.ensure_indexes()
    yield mongo
    mongo.close()


def on_store_clock(store: Any, moment: dt.datetime | None) -> bool:
    """True when ``moment`` is the store's now (within ``CLOSE``), not the host's."""
    assert moment is not None
    return abs(bson_time(moment) - store.now()) < CLOSE


def run(store: Any, *argv: str,
        publisher: CapturingPublisher | None = None) -> tuple[int, str, str]:
    """``eventbus ARGV`` as the console script runs it, on ``store``; (exit, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EVENTBUS_OPERATOR", "ops@example.com")
        patch.setattr(cli, "open_store", lambda settings: store)
        patch.setattr(cli, "publisher",
                      lambda settings, timeout=30.0: publisher or CapturingPublisher())
        patch.setattr("sys.stdout", out)
        patch.setattr("sys.stderr", err)
        code = cli.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def deliver(store: Any, event_type: str, n: int) -> str:
    """Process one event through the real processor on the store's clock; its stored key."""
    entity = {"partnerId": "p-1", "entity_id": f"e-{n}", "entity_type": "Order"}
    body, attributes = build_message(build_event(event_type, {"n": n}, entity=entity))
    partners = Partners.beside(store, SETTINGS, now=store.now)
    with contextlib.closing(Processor(store, ROUTES, SETTINGS, store.now,
                                      partners=partners)) as processor:
        return processor.process(Delivery(body, attributes, message_id=f"m-{n}")).key


# --- fault 5: the store's clock --------------------------------------------------------------

def test_the_tools_clock_is_the_stores_not_the_hosts(store: Any) -> None:
    tools = cli.tools(Settings())
    tools.open_store = lambda: store
    assert on_store_clock(store, tools.now())
    assert tools.now() < dt.datetime.now(dt.UTC) - SKEW + CLOSE  # not the host's T + 30 min


def test_partners_open_and_close_stamp_the_breaker_and_the_redrive_on_the_stores_clock(
        store: Any) -> None:
    keys = [deliver(store, "CALL", n) for n in range(3)]  # two failures open it, then parks
    parked_keys = [key for key in keys
                   if ((store.get(key) or {}).get("error") or {}).get("classification")
                   == "parked"]
    assert parked_keys and store.parked_counts() == {"acme": len(parked_keys)}
    assert run(store, "partners", "open", "acme", "--why", "maintenance")[0] == 0
    held = BreakerState.from_document(beside(store).breaker_get("acme"))
    assert on_store_clock(store, held.opened_at) and on_store_clock(store, held.audit[-1]["at"])

    code, out, err = run(store, "partners", "close", "acme", "--why", "partner fixed")
    assert (code, err) == (0, "") and "closed" in out
    closed = BreakerState.from_document(beside(store).breaker_get("acme"))
    assert closed.state == "closed" and closed.audit[-1]["action"] == "close"
    assert on_store_clock(store, closed.audit[-1]["at"])
    # Due now on the store's clock: the redrive takes them at once, not 30 minutes from now.
    for key in parked_keys:
        redrive_at = (store.get(key) or {})["redrive_at"]
        assert on_store_clock(store, redrive_at) and redrive_at <= store.now()


def test_relay_stamps_published_at_on_the_stores_clock(store: Any) -> None:
    key = deliver(store, "PARENT", 1)
    publisher = CapturingPublisher()
    code, _, err = run(store, "relay", "--once", "--grace", "0", publisher=publisher)
    assert code == 0, err
    [entry] = (store.get(key) or {})["outbox"]
    assert entry["status"] == "PUBLISHED" and len(publisher.take()) == 1
    assert on_store_clock(store, entry["published_at"])


def test_the_console_decides_on_the_stores_clock(store: Any) -> None:
    app = create_console_app(store, ConsoleConfig(token="t"), settings=SETTINGS,
                             publisher=CapturingPublisher)
    assert on_store_clock(store, app.extensions["eventbus.console"].now())
    tools = cli.tools(Settings())
    tools.open_store = lambda: store
    args = cli.parser().parse_args(["console"])
    served, _ = console.build(args, tools)
    assert on_store_clock(store, served.extensions["eventbus.console"].now())


def test_since_counts_back_from_the_stores_clock(store: Any) -> None:
    """``--since 10m``: ten minutes before the store's now, not the host's (30 min ahead)."""
    deliver(store, "CALL", 1)  # a failure, created at the store's T
    code, out, err = run(store, "failed", "--since", "10m", "--json")
    assert code == 0, err
    assert [group["count"] for group in json.loads(out)["groups"]] == [1]
    code, out, err = run(store, "stats", "--since", "10m", "--json")
    assert code == 0 and json.loads(out)["total"] == 1, (out, err)


# --- fault 7: one loader for every --app ---------------------------------------------------

@pytest.fixture()
def main_app(monkeypatch: pytest.MonkeyPatch, mongo_uri: str, mongo_db: Any) -> Iterator[Any]:
    """``main:app``, imported on the test database (it ensures its indexes there)."""
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    monkeypatch.setenv("MONGODB_DB", mongo_db.name)
    sys.modules.pop("main", None)
    app = importlib.import_module("main").app
    yield app
    sys.modules.pop("main", None)
    service = app.extensions["eventbus"]  # what main.py built: its threads end here
    service.processor.close()
    service.store.close()


def _rebuild(spec: str) -> Router:
    tools = cli.tools(Settings())
    return rebuilding._router(argparse.Namespace(app=spec), tools)


def _located(spec: str) -> Router:
    locate = locator(spec, MemoryEventStore())
    found = getattr(locate, "__self__", None)
    assert isinstance(found, Intake)
    return found.router


def _worker(spec: str) -> Router:
    """The router ``eventbus worker --app SPEC`` would pull with (the loader the CLI gives it)."""
    seen: list[Router] = []

    def instead(args: argparse.Namespace, tools: Any, load: Callable[[str], Any]) -> int:
        from eventbus.workers.command import router_of

        seen.append(router_of(args.app, load))
        return 0

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("eventbus.workers.command.run", instead)
        args = cli.parser().parse_args(["worker", "--app", spec])
        args.run(args, None)
    return seen[0]


LOADERS: dict[str, Callable[[str], Router]] = {
    "rebuild": _rebuild,
    "verify": verify.app_router,
    "contracts": public.router_of,
    "console, replay, dlq drain, redrive": _located,
    "worker": _worker,
}


@pytest.mark.parametrize("command", LOADERS)
def test_every_command_loads_a_router_a_function_returning_one_and_an_app(
        command: str, main_app: Any) -> None:
    load = LOADERS[command]
    assert load(f"{MODULE}:ROUTES") is ROUTES
    assert load(f"{MODULE}:make_routes") is ROUTES
    assert "OR_MGMT" in load("handlers:create_router").event_types()
    assert load("main:app") is main_app.extensions["eventbus"].processor.router


@pytest.mark.parametrize("command", LOADERS)
@pytest.mark.parametrize(("attribute", "says"), [
    ("NOT_AN_APP", "is a value of type int"),
    ("PLAIN_FLASK", "is a Flask app without eventbus"),
    ("returns_nothing", "is a value of type NoneType"),
    ("needs_settings", "needs arguments"),
    ("Router", "is the class Router itself"),
])
def test_every_command_refuses_anything_else_with_one_clear_message(
        command: str, attribute: str, says: str) -> None:
    spec = f"{MODULE}:{attribute}" if attribute != "Router" else "eventbus:Router"
    with pytest.raises(UsageError) as refused:
        LOADERS[command](spec)
    assert says in str(refused.value) and repr(spec) in str(refused.value)
    if attribute != "needs_settings":
        assert str(refused.value).endswith(f"not {APP_FORMS}")


@pytest.mark.parametrize("command", LOADERS)
def test_a_module_that_is_not_there_is_one_line(command: str) -> None:
    with pytest.raises(UsageError, match="cannot load the app 'no_such_module:app'"):
        LOADERS[command]("no_such_module:app")


def test_operators_md_rebuild_command_runs() -> None:
    """OPERATORS.md's dry run, as written: ``--app handlers:create_router`` (exit 2 before)."""
    store = MemoryEventStore()
    code, out, err = run(store, "rebuild", "--app", "handlers:create_router", "--type",
                         "OR_MGMT", "--since", "2026-11-20T09:00", "--until",
                         "2026-11-23T14:00", "--dry-run")
    assert (code, err) == (0, ""), err
    assert "neither" not in out


@pytest.mark.parametrize("argv", [
    ("rebuild", "--type", "OR_MGMT", "--dry-run"),
    ("verify",),
    ("contracts", "check"),
    ("console",),
    ("redrive", "--once"),
    ("worker",),
])
def test_a_bad_app_on_the_command_line_is_exit_2_and_one_line(argv: tuple[str, ...]) -> None:
    code, _, err = run(MemoryEventStore(), *argv, "--app", f"{MODULE}:NOT_AN_APP")
    assert code == 2
    assert err == (f"eventbus: '{MODULE}:NOT_AN_APP' is a value of type int, "
                   f"not {APP_FORMS}\n")
