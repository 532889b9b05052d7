"""``eventbus verify``: would the current code emit what the store recorded? (a CI check)

    eventbus verify [--app handlers:create_router] [--type T] [--partner P]
                    [--entity-type T --entity-id ID] [--since 7d] [--until TIME]
                    [--keys FILE] [--limit 1000] [--allow-unverifiable] [--json]
    eventbus verify --sample FILE [--app ...] [--allow-unverifiable] [--json]
    eventbus verify --record-sample N [the filters above] > FILE
    eventbus verify --from-archive PATH [the filters above] [--settle 1h] [--app ...]

Stored SUCCESS events (selected like the other operator commands, newest
``--limit``, run oldest first) or a recorded sample's run through the app's
router in a sandbox (``eventbus.rebuild.verify``): no store writes, no partner
calls, no publishing. Each difference in the children or forwards is listed
with the event's key and the child's. Exit 0 when every event emits what was
recorded; 1 for any difference, for an event that cannot be verified (not
routed any more, the handler raised, it calls a partner outside the guard,
a bad sample line) unless ``--allow-unverifiable``, or when nothing was
verified at all; 2 for arguments or a file that cannot be used.

``--from-archive PATH`` verifies the events an archive holds (a directory or
``gs://bucket/prefix`` of the Cloud Storage subscription's Avro files,
``eventbus.rebuild.verify.from_archive``): each against its stored record while the
store has it, else against the children the archive holds for it (the
forwards are not on the bus, so not compared). ``--since``/``--until`` select
by publish time. An event with no record whose archive ends less than
``--settle`` (default 1h) after it is unverifiable: its children may not be
archived yet. Each bad file or record of the archive is one *unreadable* line.

``--record-sample N`` verifies N stored events the same way and writes them,
with the parents and stored side-effect results they read, as a sample file
(JSON lines, ``eventbus.rebuild.verify.sample``) on stdout; the report goes to stderr.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eventbus.model.router import Router
from eventbus.ops.commands.common import (
    APP_HELP,
    Tools,
    UsageError,
    add_json,
    duration,
    load_router,
    positive,
    since,
)
from eventbus.ops.render import safe, table, to_json
from eventbus.rebuild.verify import (
    Report,
    StoreLookups,
    Verdict,
    Verifier,
    parse_sample,
    sample_lines,
)
from eventbus.rebuild.verify.from_archive import (
    SETTLE,
    ArchiveLookups,
    ArchiveVerifier,
    index_archive,
    select_archived,
)
from eventbus.store.operator_queries import EventQuery, matches

DEFAULT_APP = "handlers:create_router"
SUCCESS = ("SUCCESS",)
_PAGE = 500


def add(commands: Any) -> None:
    """Register ``verify`` on the ``eventbus`` sub-parsers."""
    verify = commands.add_parser("verify", help="run stored (or archived) events through the "
                                                "current code in a sandbox; exit 1 if they emit "
                                                "otherwise")
    verify.add_argument("--app", help=f"{APP_HELP} (default $EVENTBUS_APP, else "
                                      f"{DEFAULT_APP})")
    source = verify.add_mutually_exclusive_group()
    source.add_argument("--sample", type=Path, help="a recorded sample (JSON lines) instead "
                                                   "of the store")
    source.add_argument("--record-sample", type=positive, metavar="N",
                        help="verify N stored events and write them as a sample on stdout")
    source.add_argument("--from-archive", metavar="PATH",
                        help="verify the events of an archive (a directory or "
                             "gs://bucket/prefix of the Cloud Storage subscription's Avro "
                             "files): against the stored record while there is one, else "
                             "against the children the archive holds")
    verify.add_argument("--type", dest="event_type", help="only this event_type")
    verify.add_argument("--partner", help="only this entity_metadata.partnerId")
    verify.add_argument("--entity-type", help="only this entity_metadata.entity_type")
    verify.add_argument("--entity-id", help="only this entity_metadata.entity_id")
    verify.add_argument("--since", type=since, help="created (with --from-archive: "
                                                    "published) since: 2h, 7d or an ISO time")
    verify.add_argument("--until", type=since, help="created (published) before: 2h, 7d or "
                                                    "an ISO time")
    verify.add_argument("--keys", type=Path, help="a file of idempotency keys, one per line")
    verify.add_argument("--limit", type=positive, default=1000,
                        help="at most N events, the newest (default 1000)")
    verify.add_argument("--settle", type=duration, default=SETTLE,
                        help="with --from-archive: an event with no stored record counts as "
                             "having emitted only the children archived when the archive "
                             "runs this long after it (default 1h; 90m, 2h, 0), else it is "
                             "unverifiable")
    verify.add_argument("--allow-unverifiable", action="store_true",
                        help="exit 0 even when some events cannot be verified")
    add_json(verify)
    verify.set_defaults(run=cmd_verify)


def cmd_verify(args: argparse.Namespace, tools: Tools) -> int:
    """Verify the sample or the selected stored events; print the report."""
    router = app_router(args.app or tools.ops.app or DEFAULT_APP)
    if args.from_archive is not None:
        return _print(from_archive(args, tools, router), args, tools)
    if args.sample is not None:
        sample = parse_sample(_read(args.sample), str(args.sample))
        with Verifier(router, sample.lookups, tools.settings) as verifier:
            report = verifier.run(sample.items)
        return _print(report, args, tools)
    store = tools.store()
    lookups = StoreLookups(store)
    records, missing = select(args, store)
    with Verifier(router, lookups, tools.settings) as verifier:
        report = verifier.run(records)
    report.verdicts[:0] = [Verdict(key, "unverifiable", reason="no stored record")
                           for key in missing]
    if args.record_sample is not None:
        for line in sample_lines(records, {k: r for k, r in lookups.events.items()
                                           if k not in {_key(r) for r in records}},
                                 lookups.side_effects):
            print(line, file=tools.out)
        return _print(report, args, tools, out=tools.err)
    return _print(report, args, tools)


def from_archive(args: argparse.Namespace, tools: Tools, router: Router) -> Report:
    """The report of ``--from-archive``: the archive's problems, then each selected event."""
    from eventbus.rebuild.archive import ArchiveError, read_archive

    try:
        index = index_archive(read_archive(args.from_archive))
    except ArchiveError as exc:
        raise UsageError(str(exc)) from None
    keys = _keys(args.keys) if args.keys is not None else []
    events, missing = select_archived(index, query(args), keys=keys, limit=args.limit)
    store = tools.store()
    stored: dict[str, Mapping[str, Any]] = {}
    chosen = [event.key for event in events]
    for start in range(0, len(chosen), _PAGE):
        stored.update({_key(r): r for r in store.get_many(chosen[start:start + _PAGE])})
    with Verifier(router, ArchiveLookups(StoreLookups(store), index),
                  tools.settings) as verifier:
        checker = ArchiveVerifier(verifier, index, stored, settle=args.settle)
        report = Report(list(checker.verify(events)))
    report.verdicts[:0] = [Verdict(key, "unverifiable", reason="not in the archive")
                           for key in missing]
    return report


def app_router(spec: str) -> Router:
    """The router ``--app`` names (``load_router``, as every command); ``UsageError`` if none."""
    return load_router(spec)


def query(args: argparse.Namespace) -> EventQuery:
    """The ``EventQuery`` of the filters: SUCCESS events only (the others recorded nothing)."""
    return EventQuery(statuses=SUCCESS, event_type=args.event_type, partner_id=args.partner,
                      entity_type=args.entity_type, entity_id=args.entity_id,
                      since=args.since, until=args.until)


def select(args: argparse.Namespace, store: Any) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The records to verify, oldest first, and the ``--keys`` that have none."""
    limit = args.record_sample or args.limit
    wanted = query(args)
    if args.keys is not None:
        keys = list(dict.fromkeys(_keys(args.keys)))[:limit]
        found = {_key(r): r for r in store.get_many(keys)}
        # A key the file names is verified whatever its status: it is skipped with the reason.
        chosen = [found[k] for k in keys if k in found
                  and matches(found[k], _without_status(wanted))]
        return _oldest_first(chosen), [k for k in keys if k not in found]
    return _oldest_first(store.find_events(wanted, limit=limit)), []


def _without_status(wanted: EventQuery) -> EventQuery:
    return EventQuery(**{**wanted.__dict__, "statuses": ()})


def _oldest_first(records: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    # Events run in the order they first did, so handlers' own effects build up as they did.
    return sorted(records, key=_created)


def _created(record: Mapping[str, Any]) -> str:
    created = record.get("created")
    return created if isinstance(created, str) else ""


def _key(record: Mapping[str, Any]) -> str:
    return str(record.get("idempotency_key"))


def _keys(path: Path) -> list[str]:
    """The keys of a ``--keys`` file: one per line; blank lines and ``#`` comments skipped."""
    try:
        text = _read(path).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text (byte {exc.start})") from None
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None


def _print(report: Report, args: argparse.Namespace, tools: Tools,
           out: Any = None) -> int:
    code = report.exit_code(allow_unverifiable=args.allow_unverifiable)
    stream = out or tools.out
    if args.json:
        print(to_json({**report.to_json(), "exit": code}), file=stream)
    else:
        print(report_text(report), file=stream)
    return code


def report_text(report: Report) -> str:
    """The report: one line per difference, per unverifiable and unreadable event; a summary."""
    rows: list[list[Any]] = []
    for verdict in report.verdicts:
        if verdict.state == "different":
            rows += [["DIFFERENT", verdict.key, difference.child, difference.text()]
                     for difference in verdict.differences]
        elif verdict.state in ("unverifiable", "unreadable"):
            rows.append([verdict.state.upper(), verdict.key, "", verdict.reason])
    counts = report.counts()
    summary = (f"verified {sum(counts.values())} events: {counts['same']} same, "
               f"{counts['different']} different, {counts['unverifiable']} unverifiable, "
               f"{counts['unreadable']} unreadable, {counts['skipped']} skipped")
    bases = [verdict.basis for verdict in report.verdicts if verdict.basis]
    if bases:
        summary += (f" ({bases.count('record')} against their stored record, "
                    f"{bases.count('archive')} against the archive)")
    if not rows:
        return summary
    # One line per difference, whole (it is grepped for): not cut to a width.
    return table(["verdict", "key", "child", "what"], rows, whole=("key", "child", "what"),
                 total=None) + \
        "\n\n" + safe(summary)


__all__ = ["add", "app_router", "cmd_verify", "from_archive", "query", "report_text", "select"]
