"""``eventbus partners``: each partner's breaker, why it opened, failures, slow calls, parked
events, rate and bulkhead;
``eventbus partners open|close NAME --why ...`` holds a breaker open or closes it, audited
(``eventbus.partners.view``)."""

from __future__ import annotations

import argparse
from typing import Any

from eventbus.ops.commands.common import Tools, UsageError, add_json, add_table_options, width_of
from eventbus.ops.render import safe, table
from eventbus.partners.store import store_beside
from eventbus.partners.view import PartnerView, SteerError, describe, steer, views


def add(commands: Any) -> None:
    """Register ``partners`` with its ``open`` and ``close`` actions."""
    partners = commands.add_parser("partners", help="partner breakers, parked events, rates")
    add_table_options(partners)
    partners.set_defaults(run=cmd_list)
    actions = partners.add_subparsers(dest="action")
    for action, words in (("open", "hold a partner's breaker open: its events are parked"),
                          ("close", "close a partner's breaker; its parked events come back")):
        steering = actions.add_parser(action, help=words)
        steering.add_argument("name", help="the partner, as listed or its raw id")
        steering.add_argument("--why", required=True, help="the reason, kept in the audit entry")
        add_json(steering)
        steering.set_defaults(run=cmd_steer)


def cmd_list(args: argparse.Namespace, tools: Tools) -> int:
    """Print every partner with a breaker, parked events, a rate or a cap of its own.

    Calls in flight are each process's own (its bulkhead): this command runs in
    none of the service's processes, so it says so instead of showing 0.
    """
    found = views(store_beside(tools.store(), tools.settings), tools.settings, tools.now())
    rows = [_row(view) for view in found]
    headers = ["partner", "breaker", "opened because", "failures", "last error", "slow calls",
               "parked", "rate/s", "bulkhead"]
    text = table(headers, rows, whole=("partner",), total=width_of(args)) if rows \
        else "no partner has a breaker or parked events"
    if rows:
        text += ("\nbulkhead: calls in flight allowed per process; the calls in flight are "
                 "each process's own (the console mounted in the service shows its process's)")
    tools.emit([view.to_json() for view in found], text, args)
    return 0


def _row(view: PartnerView) -> list[Any]:
    when = f"{view.last_failure_at:%Y-%m-%d %H:%M:%S}Z " if view.last_failure_at else ""
    last = f"{when}{view.last_error}" if view.last_error else ""
    opened = f"{view.opened_at:%Y-%m-%d %H:%M:%S}Z {view.reason}" \
        if view.reason and view.opened_at else view.reason
    return [view.name, view.label, opened or "-", view.failures, last, slow_calls(view),
            view.parked, f"{view.rate:g}" if view.rate else "-",
            view.concurrency or "-"]


def slow_calls(view: PartnerView) -> str:
    """The slow calls column: how many, and the last one's length and time."""
    if not view.slow_calls:
        return "0"
    when = f" at {view.last_slow_at:%H:%M:%S}Z" if view.last_slow_at else ""
    return f"{view.slow_calls} (last {view.last_slow_seconds:g} s{when})"


def cmd_steer(args: argparse.Namespace, tools: Tools) -> int:
    """Hold open or close one breaker by hand, with the operator's reason."""
    if not args.why.strip():
        raise UsageError("--why must say why (it is kept in the audit entry)")
    hold_open, now = args.action == "open", tools.now()
    try:
        store = store_beside(tools.store(), tools.settings)
        after = steer(store, args.name, hold_open=hold_open, why=args.why,
                      by=tools.ops.operator, now=now, settings=tools.settings)
    except SteerError as exc:
        print(f"eventbus: {exc}", file=tools.err)
        return 1
    _, _, label = describe(after, now)
    tools.emit({"name": args.name, "state": after.state, "label": label},
               f"{safe(args.name)}: {safe(label)}", args)
    return 0
