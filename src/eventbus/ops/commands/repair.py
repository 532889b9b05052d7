"""The repairing operator commands: ``replay``, and ``dlq drain`` (``workers.deadletter``)."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from eventbus.ops import correct, jsonfile
from eventbus.ops.commands.common import (
    APP_HELP,
    Tools,
    UsageError,
    add_filters,
    add_table_options,
    filters_given,
    locator,
    positive,
    query_of,
    rate,
    wait_seconds,
    width_of,
)
from eventbus.ops.render import safe, table
from eventbus.ops.replay import Replayer, ReplayResult, fetch, replayable, spaced
from eventbus.ops.reports import failed_groups, find_group, status_label
from eventbus.store.base import Record
from eventbus.workers import deadletter


def add(commands: Any) -> None:
    """Register ``replay`` and ``dlq`` on the ``eventbus`` sub-parsers."""
    replay = commands.add_parser("replay", help="republish FAILED events through the push path")
    replay.add_argument("keys", nargs="*", help="idempotency keys to replay")
    replay.add_argument("--group", help="a group id from `eventbus failed`")
    add_filters(replay)
    replay.add_argument("--why", default="", help="the reason, kept in the audit entry")
    replay.add_argument("--data", type=Path,
                        help="corrected event JSON for one refused event (invalid, unknown type "
                             "or version, conflict): it runs under that event's own key")
    replay.add_argument("--dry-run", action="store_true", help="list what would be replayed")
    replay.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    replay.add_argument("--rate", type=rate, default=5.0,
                        help="at most N events per second, e.g. 5/s (default 5/s)")
    replay.add_argument("--app", help=f"{APP_HELP} (default $EVENTBUS_APP)")
    add_table_options(replay)
    replay.set_defaults(run=cmd_replay)
    queue = commands.add_parser("dlq", help="the dead-letter subscription")
    actions = queue.add_subparsers(dest="action", required=True)
    drain = actions.add_parser("drain", help="store each dead letter, then ack it")
    drain.add_argument("--subscription", help="default $PUBSUB_DEAD_LETTER_SUBSCRIPTION")
    drain.add_argument("--max", type=positive, help="at most N messages")
    drain.add_argument("--batch", type=positive, default=10, help="messages per pull")
    drain.add_argument("--wait", type=wait_seconds, default=10.0,
                       help="seconds an empty subscription is waited on before the drain "
                            "ends (default 10)")
    drain.add_argument("--app", help=f"{APP_HELP} (default $EVENTBUS_APP)")
    add_table_options(drain)
    drain.set_defaults(run=cmd_drain)


# -- replay --------------------------------------------------------------------------------

def cmd_replay(args: argparse.Namespace, tools: Tools) -> int:
    """Replay by key, group or filter: dry run, confirmation, rate limit, progress."""
    body = _corrected(args.data) if args.data is not None else None  # before the store
    records, missing = select(args, tools)
    for key in missing:
        print(f"eventbus: no event with idempotency key {safe(key)!r}", file=tools.err)
    if body is not None:
        return _replay_with_data(args, tools, records, body)
    chosen = [record for record in records if replayable(record)]
    for record in records:
        if not replayable(record):
            print(f"eventbus: {safe(record['idempotency_key'])!r} is {status_label(record)}, "
                  "not FAILED: not replayed", file=tools.err)
    if args.dry_run or not chosen:
        return _plan(args, tools, chosen, missing)
    if not _confirmed(args, tools, len(chosen)):
        return 2
    results = _run(args, tools, chosen)
    return 0 if all(r.outcome == "replayed" for r in results) and not missing else 1


def select(args: argparse.Namespace, tools: Tools) -> tuple[list[Record], list[str]]:
    """Return the records chosen by keys, ``--group`` or the filters, and unknown keys."""
    given = sum([bool(args.keys), args.group is not None, filters_given(args)])
    if given != 1:
        raise UsageError("replay needs exactly one of: KEY..., --group ID, or filters "
                         "(--type/--partner/--since/--retryable/--final)")
    store = tools.store()
    if args.keys:
        return fetch(store, list(dict.fromkeys(args.keys)))
    if args.group is not None:
        group = find_group(failed_groups(store, query_of(args, tools)), args.group)
        if group is None:
            raise UsageError(f"no failed group {safe(args.group)!r} (see `eventbus failed`)")
        return fetch(store, group.keys)
    return failed_groups(store, query_of(args, tools)).records, []


def _plan(args: argparse.Namespace, tools: Tools, chosen: list[Record],
          missing: list[str]) -> int:
    rows = [[r.get("idempotency_key"), r.get("event_type"), status_label(r),
             r.get("attempts", 0)] for r in chosen]
    text = (table(["key", "event_type", "status", "attempts"], rows, total=width_of(args)) +
            f"\n\n{len(rows)} events would be replayed" if rows else "nothing to replay")
    tools.emit({"dry_run": True, "keys": [r.get("idempotency_key") for r in chosen]}, text,
               args)
    return 1 if missing or not chosen else 0


def _confirmed(args: argparse.Namespace, tools: Tools, count: int) -> bool:
    if args.yes or count <= tools.ops.replay_confirm_above:
        return True
    interactive = getattr(tools.stdin, "isatty", lambda: False)()
    if not interactive:
        print(f"eventbus: {count} events to replay (more than "
              f"{tools.ops.replay_confirm_above}): confirm with --yes", file=tools.err)
        return False
    print(f"Replay {count} events? [y/N] ", end="", file=tools.err, flush=True)
    return tools.stdin.readline().strip().lower() in ("y", "yes")


def replayer(args: argparse.Namespace, tools: Tools) -> Replayer:
    """Return the replayer of the command's settings, app and rate."""
    return Replayer(tools.store(), tools.publisher(), tools.now, by=tools.ops.operator,
                    why=args.why or "replayed from the command line",
                    locate=locator(args.app or tools.ops.app, tools.store()),
                    limit=spaced(args.rate),
                    redrive_after=timedelta(seconds=tools.settings.redrive_after_seconds))


def _run(args: argparse.Namespace, tools: Tools, chosen: list[Record]) -> list[ReplayResult]:
    worker = replayer(args, tools)
    results = []
    for number, record in enumerate(chosen, 1):
        results.append(worker.replay(record))
        print(f"replay: {number}/{len(chosen)} {results[-1].outcome} "
              f"{safe(results[-1].key)}", file=tools.err, flush=True)
    _report(args, tools, results)
    return results


def _report(args: argparse.Namespace, tools: Tools, results: list[ReplayResult]) -> None:
    done = sum(r.outcome == "replayed" for r in results)
    text = table(["key", "outcome", "message id", "detail"],
                 [[r.key, r.outcome, r.message_id, r.detail] for r in results],
                 whole=("key", "message id"), total=width_of(args))
    tools.emit({"results": [r.to_json() for r in results], "replayed": done},
               f"{text}\n\n{done} of {len(results)} replayed", args)


def _replay_with_data(args: argparse.Namespace, tools: Tools, records: list[Record],
                      body: Mapping[str, Any]) -> int:
    if len(records) != 1 or not args.keys:
        raise UsageError("--data replays exactly one event, given by its key")
    try:
        correct.check_correctable(records[0])
    except correct.NotCorrectable as exc:
        raise UsageError(str(exc)) from None
    if args.dry_run:
        tools.emit({"dry_run": True, "keys": [records[0]["idempotency_key"]]},
                   f"would replay {safe(records[0]['idempotency_key'])} with {args.data}", args)
        return 0
    result = replayer(args, tools).replay_with_data(records[0], body)
    _report(args, tools, [result])
    return 0 if result.outcome == "replayed" else 1


def _corrected(path: Path) -> Mapping[str, Any]:
    try:
        body = jsonfile.loads(jsonfile.read_text(str(path)), str(path))
    except jsonfile.Unreadable as exc:
        raise UsageError(str(exc)) from None
    if not isinstance(body, dict):
        raise UsageError(f"{path} must hold one event object")
    return body


# -- dlq drain -----------------------------------------------------------------------------

def cmd_drain(args: argparse.Namespace, tools: Tools) -> int:
    """Pull the dead-letter subscription into the store, acking after each write."""
    name = args.subscription or tools.ops.dead_letter_subscription
    store = tools.store()
    locate = locator(args.app or tools.ops.app, store)
    source = deadletter.PubSubDeadLetters(tools.settings.project_id, name, wait=args.wait)
    try:
        report = deadletter.drain(
            store, source, locate, tools.now, batch=args.batch, limit=args.max,
            progress=lambda r: print(f"dlq: {r.pulled} pulled, {r.acked} acked",
                                     file=tools.err, flush=True))
    finally:
        source.close()
    text = (f"drained {source.subscription}: {report.pulled} pulled, {report.stored} stored "
            f"as new FAILED records, {report.marked} marked on existing records, "
            f"{report.acked} acked")
    if report.keys:
        text = table(["key"], [[key] for key in report.keys], total=width_of(args)) + \
            "\n\n" + text
    tools.emit(report.to_json(), text + (f"\n{safe(report.error)}" if report.error else ""),
               args)
    return 1 if report.error else 0
