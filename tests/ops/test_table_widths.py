"""Issue 42 item 4: every operator table fits its width, with hostile stored values.

``render.table`` takes a total width (100 unless ``--wide``) and cuts the
widest cuttable columns, then the keys, then (columns at their minimum) the
lines; the commands print their tables through it. The values here are what
outsiders may store: a 500-character event type, right-to-left text, a lone
surrogate, wide characters, escape codes. Run on the memory store (no server).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
from typing import Any

import pytest

from eventbus import Context, PermanentError, Router
from eventbus.model.delivery import Delivery
from eventbus.ops import cli
from eventbus.ops.commands.queries import events_table, failed_text, show_text, stats_text
from eventbus.ops.progress import status_table
from eventbus.ops.render import columns, table
from eventbus.ops.reports import event_view, failed_groups, failed_query, stats
from eventbus.processor import Processor
from eventbus.pubsub.message import build_event, build_message
from eventbus.settings import Settings
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import CapturingPublisher, FakeClock

LONG_TYPE = "SHIPMENT_LABEL_PRINTED" * 23  # 506 characters
RTL = "\u05e9\u05dc\u05d5\u05dd \u0645\u0631\u062d\u0628\u0627 " * 8  # Hebrew and Arabic
LONE = "bad \ud800 half \udfff"
WIDE = "\u5168\u89d2\u6587\u5b57" * 20  # two columns each
HOSTILE = [LONG_TYPE, RTL, LONE, WIDE, "\x1b[31mred\x1b[0m\u202eevil", "x" * 300]
SETTINGS = Settings(max_attempts=5, relay_inline=False)

routes = Router()


@routes.handler("OR_MGMT")
def order(context: Context) -> None:
    """Fail for good with the event's hostile message."""
    raise PermanentError(str(context.event.entity_data.get("why")))


@routes.handler("SHIPMENT_LABEL_PRINTED0")
def label(context: Context) -> None:
    """Succeed (a 22-character type)."""


@pytest.fixture
def store() -> MemoryEventStore:
    """A memory store holding events with hostile types, partners and messages."""
    memory = MemoryEventStore(clock=FakeClock(dt.datetime.now(dt.UTC)))
    with contextlib.closing(Processor(memory, routes, SETTINGS, memory.now)) as processor:
        for n, value in enumerate(HOSTILE):
            for event_type in ("OR_MGMT", "SHIPMENT_LABEL_PRINTED0", LONG_TYPE[:250],
                               LONG_TYPE):
                entity = {"partnerId": f"p{n}", "entity_id": f"e-{n}", "entity_type": "Order"}
                body, attributes = build_message(build_event("OR_MGMT", {}, entity=entity))
                # Set afterwards, as JSON escapes: a lone surrogate no publisher would send.
                document = json.loads(body)
                document["event_type"] = event_type  # 250: unknown; 506: invalid (raw payload)
                document["entity_metadata"].update(partnerId=f"p{n}-{value[:120]}",
                                                   partnerName=value)
                document["entity_data"] = {"why": f"{value} {n}"}
                attributes = {k: event_type if k == "event_type" else v
                              for k, v in attributes.items()}
                processor.process(Delivery(json.dumps(document).encode(), attributes,
                                           message_id=f"m-{n}-{len(event_type)}"))
    return memory


def widest(text: str) -> int:
    """The widest line of ``text``, in terminal columns."""
    return max(columns(line) for line in text.splitlines())


@pytest.mark.parametrize("total", [80, 100])
def test_a_table_of_hostile_values_fits_its_width(total: int) -> None:
    rows = [[value, value, n, value] for n, value in enumerate(HOSTILE)]
    text = table(["key", "event_type", "n", "message"], rows, total=total)
    assert widest(text) <= total
    assert "\x1b" not in text and "\u202e" not in text
    text.encode("utf-8")  # no lone surrogate reaches the terminal
    assert "…" in text


def test_keys_stay_whole_while_the_other_columns_can_be_cut() -> None:
    key = "p:partner-1:" + "k" * 40
    text = table(["key", "message"], [[key, "m" * 300]], total=80)
    assert key in text and widest(text) <= 80


def test_keys_too_long_to_share_a_row_go_on_a_line_of_their_own() -> None:
    key = "p:partner-1:order-1:OR_MGMT:" + "0123456789abcdef" * 2
    rows = [["2026-12-03 07:38:04.845Z", key, "OR_MGMT", "FAILED(final)", "m" * 300]]
    lines = table(["created", "key", "event_type", "status", "error"], rows,
                  total=80).splitlines()
    assert lines[0] == "key" and lines[1].split() == ["created", "event_type", "status",
                                                      "error"]
    assert lines[3] == key
    assert lines[4].split()[:4] == ["2026-12-03", "07:38:04.845Z", "OR_MGMT", "FAILED(final)"]
    assert max(map(columns, lines)) <= 80


def test_wide_cuts_nothing() -> None:
    text = table(["key", "message"], [["k" * 200, "m" * 300]], total=None)
    assert "k" * 200 in text and "m" * 300 in text


def test_a_table_with_more_columns_than_fit_is_cut_line_by_line() -> None:
    headers = [f"column-{n}" for n in range(30)]
    assert widest(table(headers, [["v" * 20] * 30], total=80)) <= 80


@pytest.mark.parametrize("total", [80, 100])
def test_every_text_of_the_query_commands_fits(store: MemoryEventStore, total: int) -> None:
    report = failed_groups(store, failed_query())
    assert report.records
    assert widest(failed_text(report, total=total)) <= total
    assert widest(failed_text(report, listed=True, total=total)) <= total
    assert widest(events_table(report.records, total=total)) <= total
    assert widest(stats_text(stats(store, dt.datetime(2000, 1, 1, tzinfo=dt.UTC)),
                             total=total)) <= total
    assert widest(status_table(store, total=total)) <= total
    for record in report.records:
        view = event_view(store, str(record["idempotency_key"]))
        assert view is not None
        lines = show_text(view, total).splitlines()
        # The key is on its own line, whole, to be copied; the event's own body is printed
        # as JSON (``--json`` has it too); the rest fits.
        assert lines[0] == f"key:          {record['idempotency_key']}"
        body = next(n for n, line in enumerate(lines) if line in ("entity_data:", "raw_payload:"))
        assert widest("\n".join(lines[1:body])) <= total


def test_the_status_table_keeps_its_columns_apart_for_a_long_type(
        store: MemoryEventStore) -> None:
    lines = status_table(store).splitlines()
    row = next(line for line in lines if line.startswith("SHIPMENT_LABEL_PRINTED0 "))
    assert row.split()[0] == "SHIPMENT_LABEL_PRINTED0"


def run(store: Any, *argv: str) -> tuple[int, str]:
    """``eventbus ARGV`` on ``store``: (exit, stdout)."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "open_store", lambda settings: store)
        patch.setattr(cli, "publisher", lambda settings, timeout=30.0: CapturingPublisher())
        patch.setattr("sys.stdout", out)
        patch.setattr("sys.stderr", io.StringIO())
        code = cli.main(list(argv))
    return code, out.getvalue()


@pytest.mark.parametrize("argv", [["failed"], ["failed", "--list"], ["stats"],
                                  ["replay", "--final", "--dry-run"], ["partners"]])
def test_the_commands_fit_100_columns_and_take_wide_and_json(store: MemoryEventStore,
                                                             argv: list[str]) -> None:
    code, out = run(store, *argv)
    assert code in (0, 1) and widest(out) <= 100
    code, wide = run(store, *argv, "--wide")
    assert code in (0, 1) and widest(wide) >= widest(out)
    code, data = run(store, *argv, "--json")
    assert code in (0, 1) and data.isascii()
    json.loads(data)


def test_history_fits_and_wide_shows_the_whole_values(store: MemoryEventStore) -> None:
    partner = f"p0-{LONG_TYPE[:120]}"
    _, out = run(store, "history", "--partner", partner)
    assert widest(out) <= 100
    _, wide = run(store, "history", "--partner", partner, "--wide")
    assert LONG_TYPE in wide
