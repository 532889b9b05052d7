"""``Verifier`` on LocalBus: an app run once, then verified against a changed one.

Each test runs ``ORDER`` events through a first version of a small app on
LocalBus (in-memory store), then verifies the stored records with a second
version: unchanged, reordered, renamed, changed payload, a changed forward, a
handler that raises, a partner called outside the guard, a guarded effect.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from eventbus import Context, Router, contract
from eventbus.rebuild.verify import Report, StoreLookups, Verifier
from eventbus.store.operator_queries import EventQuery
from eventbus.testing import LocalBus
from tests.verify.recording import cli_run

ENTITY = {"partnerId": "p1", "partnerName": "P", "entity_id": "o-1", "entity_type": "Order"}
Emit = Callable[[Context], None]


@contract("order-out", "v1")
@dataclasses.dataclass(frozen=True)
class OrderOut:
    """A public order."""

    order_id: int


def app(emit: Emit, *, forward: str = "entity_data.orderId",
        extra: Callable[[Router], None] | None = None) -> Router:
    """``ORDER`` runs ``emit``; its children ``STEP_A`` and ``STEP_B`` do nothing."""
    routes = Router()
    routes.handler("ORDER")(emit)
    for step in ("STEP_A", "STEP_B", "STEP_C"):
        routes.handler(step, internal=True)(lambda context: None)
    routes.forward("ORDER", topic="order-out", contract=OrderOut, fields={"order_id": forward})
    if extra is not None:
        extra(routes)
    return routes


def two_steps(context: Context) -> None:
    context.emit("STEP_A", {"n": context.event.entity_data["n"]})
    context.emit("STEP_B", {"n": 1})


def recorded(router: Router, count: int = 2) -> tuple[LocalBus, list[Mapping[str, Any]]]:
    """The bus (closed: its store is what the tests read) and its SUCCESS records, oldest first."""
    with LocalBus(router) as bus:
        for n in range(count):
            bus.publish("ORDER", {"n": n, "orderId": 100 + n}, entity=ENTITY)
            bus.clock.advance(1)
    records = bus.store.find_events(EventQuery(statuses=("SUCCESS",)), limit=100)
    return bus, sorted(records, key=lambda r: r["created"])


def verify(router: Router, bus: LocalBus, records: list[Mapping[str, Any]]) -> Report:
    with Verifier(router, StoreLookups(bus.store)) as verifier:
        return verifier.run(records)


def test_an_unchanged_app_emits_what_was_recorded() -> None:
    bus, records = recorded(app(two_steps))
    report = verify(app(two_steps), bus, records)
    assert report.counts()["same"] == len(records) == 6  # 2 orders, 4 children
    assert report.exit_code() == 0


def test_a_renamed_step_names_the_event_and_the_child() -> None:
    bus, records = recorded(app(two_steps))

    def renamed(context: Context) -> None:
        context.emit("STEP_C", {"n": context.event.entity_data["n"]})
        context.emit("STEP_B", {"n": 1})

    report = verify(app(renamed), bus, records)
    different = report.of("different")
    assert [v.key for v in different] == [r["idempotency_key"] for r in records
                                          if r["event_type"] == "ORDER"]
    change = different[0].differences[0]
    assert change.kind == "changed" and change.index == 0
    assert change.child == f"{different[0].key}/0:STEP_A"
    assert change.now is not None and change.now.key == f"{different[0].key}/0:STEP_C"
    # The recorded STEP_A children still have their route here: they verify as they were.
    assert {v.state for v in report.verdicts if v.event_type == "STEP_A"} == {"same"}
    assert report.exit_code() == 1


def test_reordered_emits_differ_at_both_positions() -> None:
    bus, records = recorded(app(two_steps), count=1)

    def reordered(context: Context) -> None:
        context.emit("STEP_B", {"n": 1})
        context.emit("STEP_A", {"n": context.event.entity_data["n"]})

    report = verify(app(reordered), bus, records)
    (verdict,) = report.of("different")
    assert [(d.kind, d.index) for d in verdict.differences] == [("changed", 0), ("changed", 1)]
    assert report.exit_code() == 1


def test_a_changed_payload_differs_by_its_fingerprint() -> None:
    bus, records = recorded(app(two_steps), count=1)

    def changed(context: Context) -> None:
        context.emit("STEP_A", {"n": context.event.entity_data["n"], "more": True})
        context.emit("STEP_B", {"n": 1})

    report = verify(app(changed), bus, records)
    (verdict,) = report.of("different")
    (difference,) = verdict.differences
    assert difference.kind == "payload" and difference.child.endswith("/0:STEP_A")
    assert difference.stored and difference.now
    assert difference.stored.fingerprint != difference.now.fingerprint
    assert report.exit_code() == 1


def test_a_new_and_a_missing_child_are_listed() -> None:
    bus, records = recorded(app(two_steps), count=1)

    def one_more(context: Context) -> None:
        two_steps(context)
        context.emit("STEP_C", {})

    def one_less(context: Context) -> None:
        context.emit("STEP_A", {"n": context.event.entity_data["n"]})

    more = verify(app(one_more), bus, records).of("different")[0].differences
    less = verify(app(one_less), bus, records).of("different")[0].differences
    assert [(d.kind, d.index) for d in more] == [("new", 2)]
    assert [(d.kind, d.index) for d in less] == [("missing", 1)]


def test_a_changed_forward_mapping_is_a_difference() -> None:
    bus, records = recorded(app(two_steps), count=1)
    report = verify(app(two_steps, forward="entity_data.n"), bus, records)
    (verdict,) = report.of("different")
    assert [d.kind for d in verdict.differences] == ["forward_body"]
    assert verdict.differences[0].child.endswith(">order-out@v1")


def test_a_handler_that_raises_is_unverifiable_not_different() -> None:
    bus, records = recorded(app(two_steps), count=1)

    def broken(context: Context) -> None:
        raise KeyError("n")

    report = verify(app(broken), bus, records)
    (verdict,) = report.of("unverifiable")
    assert verdict.key == records[0]["idempotency_key"]
    assert "did not succeed" in verdict.reason and "KeyError" in verdict.reason
    assert report.exit_code() == 1
    assert report.exit_code(allow_unverifiable=True) == 0  # the children still verify: same


def test_an_event_no_longer_routed_is_unverifiable() -> None:
    bus, records = recorded(app(two_steps), count=1)
    without_b = Router()
    without_b.handler("ORDER")(two_steps)
    without_b.handler("STEP_A", internal=True)(lambda context: None)
    report = verify(without_b, bus, records)
    reasons = {v.event_type: v.reason for v in report.of("unverifiable")}
    assert "not verifiable with the current code" in reasons["STEP_B"]


def test_a_partner_called_outside_the_guard_is_refused_and_reported() -> None:
    calls: list[str] = []

    def direct(context: Context) -> None:
        context.partner("acme").call(lambda: calls.append("called"))
        two_steps(context)

    bus, records = recorded(app(direct), count=1)
    assert calls == ["called"]  # the first run called it
    report = verify(app(direct), bus, records)
    (verdict,) = report.of("unverifiable")
    assert "calls partner 'acme' outside the guard" in verdict.reason
    assert calls == ["called"]  # verify did not


def test_a_guarded_effect_answers_its_stored_result_and_never_runs() -> None:
    calls: list[int] = []

    def guarded(context: Context) -> None:
        done = context.guard.run(context.key, lambda: calls.append(1) or {"code": 200})
        context.emit("STEP_A", {"code": done.result["code"]})

    bus, records = recorded(app(guarded), count=2)
    assert len(calls) == 2
    report = verify(app(guarded), bus, records)
    assert report.counts()["same"] == len(records) and len(calls) == 2

    class Forgetful(StoreLookups):
        def side_effect(self, key: str) -> Mapping[str, Any] | None:
            return None

    with Verifier(app(guarded), Forgetful(bus.store)) as verifier:
        forgot = verifier.run(records)
    # With no stored result the stand-in ({}) makes the handler fail, never call.
    assert {v.state for v in forgot.verdicts if v.event_type == "ORDER"} == {"unverifiable"}
    assert len(calls) == 2


def test_the_command_never_asks_for_a_publisher_and_reports_json() -> None:
    bus, _ = recorded(app(two_steps))
    code, out, err = cli_run(bus.store, "verify", "--app", "tests.verify.test_verifier:BASE",
                             "--json")
    assert code == 0, err
    assert '"same": 6' in out


def test_selection_by_type_and_a_keys_file(tmp_path: Any) -> None:
    bus, records = recorded(app(two_steps))
    code, out, _ = cli_run(bus.store, "verify", "--app", "tests.verify.test_verifier:BASE",
                           "--type", "ORDER")
    assert code == 0 and "verified 2 events: 2 same" in out
    keys = tmp_path / "keys.txt"
    keys.write_text(f"# one known, one not\n{records[0]['idempotency_key']}\nnope\n")
    code, out, _ = cli_run(bus.store, "verify", "--app", "tests.verify.test_verifier:BASE",
                           "--keys", str(keys))
    assert code == 1 and "1 same" in out and "nope" in out and "no stored record" in out


def test_close_ends_the_sandbox_processors_threads() -> None:
    routes = app(two_steps)

    @routes.handler("ASYNC")
    async def awaits(context: Context) -> None:
        await asyncio.sleep(0)
        two_steps(context)

    with LocalBus(routes) as bus:
        bus.publish("ASYNC", {"n": 1}, entity=ENTITY)
        records = bus.store.find_events(EventQuery(statuses=("SUCCESS",)), limit=100)
    before = set(threading.enumerate())
    with Verifier(routes, StoreLookups(bus.store)) as verifier:
        assert verifier.run(records).counts()["same"] == len(records) == 3
        started = set(threading.enumerate()) - before
        # The heartbeat's, and the async handler's loop and its watchdog.
        assert {"eventbus-heartbeat", "eventbus-async"} <= {t.name for t in started}
    assert [t.name for t in started if t.is_alive()] == []
    verifier.close()  # a second close is harmless


@pytest.mark.parametrize("argv", [["--sample", "/nonexistent/file.jsonl"],
                                  ["--keys", "/nonexistent/keys"]])
def test_a_file_that_cannot_be_read_is_one_line_and_exit_2(argv: list[str]) -> None:
    bus, _ = recorded(app(two_steps), count=1)
    code, _, err = cli_run(bus.store, "verify", "--app", "tests.verify.test_verifier:BASE",
                           *argv)
    assert code == 2 and err.startswith("eventbus: cannot read") and "Traceback" not in err


BASE = app(two_steps)
