"""The read-only operator commands: ``failed``, ``history``, ``show``, ``stats``, ``retries``.

Each prints a table (every stored value escaped) or, with ``--json``, ASCII JSON.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Mapping
from typing import Any

from eventbus.model.order import entity_key
from eventbus.ops import backoff, cascade
from eventbus.ops.commands.common import (
    Tools,
    add_filters,
    add_table_options,
    positive,
    query_of,
    since,
    since_at,
    width_of,
)
from eventbus.ops.render import WIDTH, clip, duration, moment, safe, table, to_json
from eventbus.ops.reports import (
    LIST_FIELDS,
    EventView,
    FailedReport,
    Stats,
    event_view,
    failed_groups,
    forwarded,
    history,
    labels,
    stats,
    status_label,
)
from eventbus.store.base import Record
from eventbus.store.operator_queries import EventQuery


def add(commands: Any) -> None:
    """Register the commands on the ``eventbus`` sub-parsers."""
    failed = commands.add_parser("failed", help="failed events, grouped by cause (seed 002)")
    add_filters(failed)
    failed.add_argument("--list", action="store_true", help="list the events, not the groups")
    add_table_options(failed)
    failed.set_defaults(run=cmd_failed)
    partner = commands.add_parser("history", help="a partner's events, newest first (seed 002)")
    partner.add_argument("--partner", required=True, help="entity_metadata.partnerId")
    partner.add_argument("--limit", type=positive, default=100, help="at most (default 100)")
    add_table_options(partner)
    partner.set_defaults(run=cmd_history)
    show = commands.add_parser("show", help="one event: record, attempts, error, cascade")
    show.add_argument("key", help="the idempotency key")
    add_table_options(show)
    show.set_defaults(run=cmd_show)
    entity = commands.add_parser("entity", help="an ordered entity: applied position, holder, "
                                                "its last events (ordered_by)")
    entity.add_argument("partner", help="entity_metadata.partnerId")
    entity.add_argument("entity_type", help="entity_metadata.entity_type")
    entity.add_argument("entity_id", help="entity_metadata.entity_id")
    entity.add_argument("--limit", type=positive, default=20, help="events (default 20)")
    add_table_options(entity)
    entity.set_defaults(run=cmd_entity)
    add_stats(commands)
    add_retries(commands)


def add_stats(commands: Any) -> None:
    """Register ``stats``."""
    window = commands.add_parser("stats", help="events by type, status and partner in a window")
    when = window.add_mutually_exclusive_group()
    when.add_argument("--since", type=since, help="2h, 7d or an ISO time")
    when.add_argument("--hours", type=positive, help="the last N hours (default 24)")
    add_table_options(window)
    window.set_defaults(run=cmd_stats)


def add_retries(commands: Any) -> None:
    """Register ``retries``."""
    retries = commands.add_parser("retries", help="backoff analysis from the attempt histories")
    retries.add_argument("--min-backoff", type=float, default=10.0,
                         help="seconds, when Pub/Sub cannot be asked (default 10)")
    retries.add_argument("--max-backoff", type=float, default=600.0,
                         help="seconds, when Pub/Sub cannot be asked (default 600)")
    retries.add_argument("--offline", action="store_true",
                         help="do not ask Pub/Sub for the subscription's policy")
    retries.add_argument("--nearest", type=positive, default=10,
                         help="how many events nearest the attempt cap (default 10)")
    add_table_options(retries)
    retries.set_defaults(run=cmd_retries)


# -- failed --------------------------------------------------------------------------------

def cmd_failed(args: argparse.Namespace, tools: Tools) -> int:
    """Print the failed events of the filters, grouped by cause (or listed)."""
    report = failed_groups(tools.store(), query_of(args, tools))
    data = {"groups": [group.to_json() for group in report.groups],
            "truncated": report.truncated}
    if args.list:
        data = {"events": [_row_json(record) for record in report.records],
                "truncated": report.truncated}
    tools.emit(data, failed_text(report, listed=args.list, total=width_of(args)), args)
    return 0


def failed_text(report: FailedReport, *, listed: bool = False,
                total: int | None = WIDTH) -> str:
    """Return the groups table (or the events table) of a failed report, ``total`` wide."""
    if not report.records:
        return "no failed events"
    if listed:
        text = events_table(report.records, total=total)
    else:
        text = table(["group", "count", "retrying", "final", "event_type", "error", "message"],
                     [[g.id, g.count, g.retrying, g.final, g.event_type, g.error_type, g.message]
                      for g in report.groups], whole=("group",), total=total)
        text += f"\n\n{len(report.records)} failed events in {len(report.groups)} groups" \
                "; replay one group: eventbus replay --group <group>"
    return text + ("\n(truncated: narrow the filters)" if report.truncated else "")


def events_table(records: list[Record], total: int | None = WIDTH) -> str:
    """Return a table of records: created, key, type, status, attempts, partner, error."""
    return table(["created", "key", "event_type", "status", "attempts", "partner", "error"],
                 [[moment(r.get("created")), r.get("idempotency_key"), r.get("event_type"),
                   status_label(r), r.get("attempts", 0), _partner(r), _error(r)]
                  for r in records], total=total)


def _row_json(record: Mapping[str, Any]) -> dict[str, Any]:
    return {"key": record.get("idempotency_key"), "event_type": record.get("event_type"),
            "status": status_label(record), "attempts": record.get("attempts", 0),
            "partner": _partner(record), "created": moment(record.get("created")),
            "error": record.get("error")}


def _partner(record: Mapping[str, Any]) -> Any:
    meta = record.get("entity_metadata")
    return meta.get("partnerId") if isinstance(meta, Mapping) else None


def _error(record: Mapping[str, Any]) -> str:
    error = record.get("error")
    if not isinstance(error, Mapping):
        return ""
    return f"{error.get('type', '?')}: {error.get('message', '')}"


# -- history, show -------------------------------------------------------------------------

def cmd_history(args: argparse.Namespace, tools: Tools) -> int:
    """Print a partner's events, newest first."""
    records = history(tools.store(), args.partner, args.limit)
    text = (events_table(records, width_of(args)) if records
            else f"no events of partner {safe(args.partner)}")
    tools.emit({"partner": args.partner, "events": [_row_json(r) for r in records]}, text, args)
    return 0


def cmd_show(args: argparse.Namespace, tools: Tools) -> int:
    """Print one event: the record, its attempt timeline, its error, its cascade."""
    view = event_view(tools.store(), args.key)
    if view is None:
        print(f"eventbus: no event with idempotency key {safe(args.key)!r}", file=tools.err)
        return 1
    tools.emit(view.to_json(), show_text(view, width_of(args)), args)
    return 0


def cmd_entity(args: argparse.Namespace, tools: Tools) -> int:
    """Print an entity's applied position and holder, and its last events with their status."""
    store = tools.store()
    record = store.get(entity_key(args.partner, args.entity_type, args.entity_id)) or {}
    events = store.find_events(EventQuery(partner_id=args.partner, entity_type=args.entity_type,
                                          entity_id=args.entity_id),
                               limit=args.limit, fields=LIST_FIELDS)
    data = {"position": record.get("position"), "applied_key": record.get("applied_key"),
            "applied_at": record.get("applied_at"), "holder": record.get("holder"),
            "events": [{"key": e.get("idempotency_key"), "status": status_label(e),
                        "event_type": e.get("event_type"), "created": e.get("created")}
                       for e in events]}
    tools.emit(data, entity_text(data, width_of(args)), args)
    return 0 if record or events else 1


def entity_text(data: Mapping[str, Any], total: int | None = WIDTH) -> str:
    """Return the text of ``entity``: position, holder, events newest first."""
    holder = data.get("holder") if isinstance(data.get("holder"), Mapping) else None
    lines = [f"{'position:':<14}{safe(data.get('position'))}",
             f"{'applied by:':<14}{safe(data.get('applied_key') or '-')}",
             f"{'applied at:':<14}{safe(data.get('applied_at') or '-')}",
             f"{'held:':<14}" + (f"by {safe(holder.get('owner'))} until "
                                 f"{safe(holder.get('until'))}" if holder else "no"),
             "", "events:", _indent(table(
                 ["created", "key", "event_type", "status"],
                 [[moment(e["created"]), e["key"], e["event_type"], e["status"]]
                  for e in data["events"]], total=_inner(total)))]
    return "\n".join(lines)


def show_text(view: EventView, total: int | None = WIDTH) -> str:
    """Return the text of ``show``: fields, attempts, replays, cascade, data."""
    record = view.record
    # Each field on a line of its own, cut to the width; the key, which is copied, whole.
    lines = [f"{name + ':':<14}{safe(value)}" for name, value in _summary(record)]
    lines = [line if total is None or line.startswith("key:") else clip(line, total)
             for line in lines]
    lines += ["", "attempts:", _indent(table(
        ["#", "at", "since previous", ""],
        [[a.number, a.at.isoformat() if a.at else "?", duration(a.delay_ms),
          "after a replay" if a.after_replay else ""] for a in view.attempts],
        total=_inner(total)))]
    replays = [r for r in record.get("replays", []) if isinstance(r, Mapping)]
    if replays:
        lines += ["", "replays:", _indent(table(
            ["at", "by", "rebuild", "outcome", "children", "why", "attempt", "data"],
            [[r.get("at"), r.get("by"), r.get("rebuild") or "", r.get("outcome") or "",
              children_of(r), r.get("why"), r.get("attempt"),
              to_json(r["data"]) if "data" in r else ""] for r in replays],
            total=_inner(total)))]
    forwards = forwarded(record)
    if forwards:
        lines += ["", "forwarded:", _indent(table(
            ["topic", "contract", "status", "message id", "at / error"], forwards,
            total=_inner(total)))]
    if view.tree is not None:
        tree = _indent(cascade.render(view.tree, marked=view.key))
        # Cut to the width like the tables (``eventbus trace KEY`` prints it whole).
        lines += ["", "cascade:", *(line if total is None else clip(line, total)
                                    for line in tree.splitlines())]
    body = record.get("entity_data") if "raw_payload" not in record else record["raw_payload"]
    lines += ["", "raw_payload:" if "raw_payload" in record else "entity_data:",
              _indent(to_json(body))]
    return "\n".join(lines)


def _summary(record: Mapping[str, Any]) -> list[tuple[str, Any]]:
    found = record.get("entity_metadata")
    meta: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    rows: list[tuple[str, Any]] = [
        ("key", record.get("idempotency_key")),
        ("event", f"{record.get('event_type')} {record.get('event_version')} "
                  f"{record.get('event_direction')}"),
        ("status", status_label(record)),
        ("attempts", f"{record.get('attempts', 0)}" + (
            f" (replayed at {record['replayed_at_attempt']})"
            if "replayed_at_attempt" in record else "")),
        ("partner", f"{meta.get('partnerId')} {meta.get('partnerName') or ''}".rstrip()),
        ("entity", f"{meta.get('entity_type')} {meta.get('entity_id')}"),
        ("created", moment(record.get("created"))),
        ("updated", moment(record.get("lastUpdatedTime"))),
    ]
    if record.get("error"):
        rows.append(("error", _error(record) + f" [{record['error'].get('classification')}]"))
    count = record.get("delivery_count")
    if isinstance(count, int) and count > 1:  # a refused payload that came again, the same bytes
        rows.append(("delivered", f"{count} times, the same bytes each time"))
    if isinstance(record.get("dead_lettered"), Mapping):
        mark = record["dead_lettered"]
        rows.append(("dead-lettered", f"{mark.get('at')} from {mark.get('subscription')} "
                                      f"(messageId {mark.get('messageId')})"))
    return rows


def _inner(total: int | None) -> int | None:
    """The width of a table indented by ``_indent`` in a text ``total`` wide."""
    return None if total is None else total - 2


def children_of(entry: Mapping[str, Any]) -> str:
    """A rebuild's audit entry's children in words: ``2 same, 1 changed, 1 new (emitted)``;
    empty for an entry without them (an operator's replay, a stale or failed rerun)."""
    children = entry.get("children")
    if not isinstance(children, Mapping):
        return ""
    same, changed, new = (_count(children.get(name)) for name in ("duplicates", "changed", "new"))
    emitted = " (emitted)" if children.get("emitted") and new else ""
    return f"{same} same, {changed} changed, {new} new{emitted}"


def _count(value: Any) -> int:
    """A child count as stored: a number, or the list of those children."""
    if isinstance(value, list):
        return len(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _indent(text: str) -> str:
    return "\n".join(f"  {line}" for line in text.splitlines())


# -- stats, retries ------------------------------------------------------------------------

def cmd_stats(args: argparse.Namespace, tools: Tools) -> int:
    """Print events by type, status and partner created in the window."""
    start = since_at(args.since, tools) or tools.now() - dt.timedelta(hours=args.hours or 24)
    counts = stats(tools.store(), start)
    tools.emit(counts.to_json(), stats_text(counts, width_of(args)), args)
    return 0


def stats_text(counts: Stats, total: int | None = WIDTH) -> str:
    """Return the two tables of ``stats``: by type and by partner."""
    if not counts.total:
        return f"no events created since {counts.since.isoformat()}"
    columns = labels([*counts.by_type.values()])
    parts = [f"{counts.total} events created since {counts.since.isoformat()}"]
    for title, rows in (("event_type", counts.by_type), ("partner", counts.by_partner)):
        parts.append(table([title, *columns, "total"],
                           [[name, *(c[label] for label in columns), sum(c.values())]
                            for name, c in sorted(rows.items())], total=total))
    return "\n\n".join(parts)


def cmd_retries(args: argparse.Namespace, tools: Tools) -> int:
    """Print the backoff analysis and the events nearest the attempt cap."""
    policy = _policy(args, tools)
    report = backoff.analyse(tools.store(), policy, tools.settings.max_attempts,
                             nearest=args.nearest)
    tools.emit(report.to_json(), retries_text(report, width_of(args)), args)
    return 0


def _policy(args: argparse.Namespace, tools: Tools) -> backoff.Policy:
    flags = backoff.Policy(args.min_backoff, args.max_backoff, "flags")
    if args.offline:
        return flags
    try:
        return backoff.subscription_policy(tools.settings.project_id, tools.ops.subscription)
    except Exception as exc:  # any failure to ask Pub/Sub: fall back to the flags
        reason = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        return backoff.Policy(args.min_backoff, args.max_backoff,
                              f"flags (Pub/Sub not reachable: {reason})")


def retries_text(report: backoff.RetryReport, total: int | None = WIDTH) -> str:
    """Return the policy line, the delays table and the nearest-cap table."""
    policy = report.policy
    bounds = ("none" if policy.min_backoff is None else
              f"{policy.min_backoff:g}s..{policy.max_backoff:g}s")
    lines = [f"retry policy: backoff {bounds} ({safe(policy.source)}); "
             f"attempt cap {report.cap}; {report.scanned} events retried at least once"]
    rows = [[row.number, len(row.delays_ms), *map(duration, row.percentiles().values()),
             duration(max(row.delays_ms))] for row in report.rows]
    lines += ["", table(["attempt", "samples", "p50", "p90", "p99", "max"], rows, total=total)
              if rows else "no retried events yet"]
    near = [[n.key, n.event_type, n.status, n.used, n.left] for n in report.nearest]
    lines += ["", "nearest the attempt cap:",
              table(["key", "event_type", "status", "used", "left"], near, total=total)
              if near else "none unfinished"]
    return "\n".join(lines)
