"""``eventbus rebuild``: run handlers again over stored SUCCESS events (``rebuild.runner``).

Every input is checked before the store is touched, and every problem is one
line and exit status 2, never a traceback: a keys file that cannot be read
(missing, not UTF-8, a key that is not printable text), a time range whose
start is not before its end, a reason that is not text, an archive path that
cannot be listed (a bad file or record in it is one failure of the report).

``--from-archive PATH`` rebuilds from an archive's messages instead of the
store's records (``ArchiveSource``): filters and ``--keys`` narrow it and are
optional; an event with no record here is stored as a new record (SUCCESS,
its audit entry ``source: archive, new_record: true``), its guarded calls
refused without ``--allow-new-calls`` unless their results outlived it.
"""

from __future__ import annotations

import argparse
import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from eventbus.model.delivery import Delivery
from eventbus.model.rebuild_policy import Replay
from eventbus.model.router import Router
from eventbus.ops import jsonfile
from eventbus.ops.commands.common import (
    APP_HELP,
    Tools,
    UsageError,
    add_table_options,
    load_router,
    positive,
    rate,
    since,
    width_of,
)
from eventbus.ops.render import safe, table
from eventbus.processor.intake import Intake, Located
from eventbus.rebuild.mode import ReplayProcessor
from eventbus.rebuild.runner import (
    ArchiveSource,
    Rebuild,
    Report,
    Selection,
    Source,
    StoredSource,
    new_run,
)
from eventbus.rebuild.store import runs_beside
from eventbus.store.base import Record
from eventbus.store.operator_queries import EventQuery
from eventbus.workers.rate import RateLimit

_MAX_KEY = 1024
_MAX_KEYS_BYTES = 8 * 1024 * 1024
"""The most the selection's keys may take in the run document (one MongoDB document holds
16 MB, and ``--resume`` needs the keys): a bigger file is refused before anything runs."""


def add(commands: Any) -> None:
    """Register ``rebuild`` on the ``eventbus`` sub-parsers."""
    rebuild = commands.add_parser(
        "rebuild", help="run handlers again over stored SUCCESS events (replay mode)")
    rebuild.add_argument("--type", dest="event_type", help="only this event_type")
    rebuild.add_argument("--partner", help="only this entity_metadata.partnerId")
    rebuild.add_argument("--entity-type", help="only this entity_metadata.entity_type")
    rebuild.add_argument("--entity-id", help="only this entity_metadata.entity_id")
    rebuild.add_argument("--since", type=since, help="created since: 3d or an ISO time")
    rebuild.add_argument("--until", type=since,
                         help="created before: 1d or an ISO time (default: the start)")
    rebuild.add_argument("--keys", metavar="FILE",
                         help="a file of idempotency keys, one per line (- for stdin)")
    rebuild.add_argument("--resume", metavar="ID", help="go on with an interrupted rebuild")
    rebuild.add_argument("--from-archive", metavar="PATH",
                         help="rebuild from an archive's messages (a directory or "
                              "gs://bucket/prefix) instead of the stored records")
    rebuild.add_argument("--why", default="", help="the reason, kept in every audit entry")
    rebuild.add_argument("--dry-run", action="store_true", help="list what would run")
    rebuild.add_argument("--rate", type=rate, help="at most N events per second, e.g. 50/s")
    rebuild.add_argument("--batch", type=positive, default=100, help="events per batch")
    rebuild.add_argument("--allow-new-calls", action="store_true",
                         help="let guarded calls that never succeeded, and partner calls "
                              "outside the guard, run")
    rebuild.add_argument("--emit-new", action="store_true",
                         help="store and publish the children that are new")
    rebuild.add_argument("--forward", action="store_true",
                         help="publish the public-topic forwards again")
    rebuild.add_argument("--app", help=f"{APP_HELP} (default $EVENTBUS_APP)")
    add_table_options(rebuild)
    rebuild.set_defaults(run=cmd_rebuild)


def cmd_rebuild(args: argparse.Namespace, tools: Tools) -> int:
    """Plan, dry-run or run a rebuild; exit 1 when some event could not be rebuilt."""
    why = _text(args.why, "--why")
    started = tools.now()
    if args.resume is not None:
        return _resume(args, tools, _text(args.resume, "--resume"))
    archive = _opt(args.from_archive, "--from-archive")
    selection = _selection(args, started, archive is not None)
    router = _router(args, tools)
    store = tools.store()
    flags = {"new_calls": args.allow_new_calls, "emit_new": args.emit_new,
             "forward": args.forward}
    if args.dry_run:
        source = _source(store, selection, archive, Intake(store, router).locate)
        return _dry_run(args, tools, _planned(source), router)
    run = new_run(by=tools.ops.operator, why=why or "rebuilt from the command line",
                  started=store.now(), selection=selection, flags=flags, archive=archive)
    return _run(args, tools, router, run)


def _resume(args: argparse.Namespace, tools: Tools, rebuild_id: str) -> int:
    run = runs_beside(tools.store(), tools.settings).rebuild_get(rebuild_id)
    if run is None:
        raise UsageError(f"no rebuild {safe(rebuild_id)!r} (see the console's Rebuilds)")
    return _run(args, tools, _router(args, tools), run)


def _source(store: Any, selection: Selection, archive: str | None,
            locate: Callable[[Delivery], Located]) -> Source:
    if archive is None:
        return StoredSource(store, selection)
    return ArchiveSource(store, archive, locate, selection=selection)


class _Planned:
    """A source whose plan was read once already (the archive is listed before the run)."""

    def __init__(self, source: Source) -> None:
        self.source, self.keys = source, source.plan()

    def plan(self) -> list[str]:
        """The plan read at start."""
        return list(self.keys)

    def load(self, keys: Sequence[str]) -> list[tuple[Delivery, Record | None]]:
        """The source's ``load``."""
        return self.source.load(keys)

    @property
    def missing(self) -> list[str]:
        """The source's ``missing``."""
        return self.source.missing

    @property
    def unreadable(self) -> list[tuple[str, str]]:
        """The source's ``unreadable``."""
        return self.source.unreadable


def _planned(source: Source) -> _Planned:
    """``source`` planned now: an archive that cannot be listed is one line, exit 2."""
    from eventbus.rebuild.archive import ArchiveError

    try:
        return _Planned(source)
    except ArchiveError as exc:
        raise UsageError(str(exc)) from None


def _run(args: argparse.Namespace, tools: Tools, router: Router, run: dict[str, Any]) -> int:
    store, flags = tools.store(), run.get("flags") or {}
    selection = Selection.from_json(run.get("selection") or {})
    archive = run.get("archive")
    replay = Replay(str(run["rebuild_id"]), str(run["by"]), str(run["why"]), run["started"],
                    new_calls=bool(flags.get("new_calls")), emit_new=bool(flags.get("emit_new")),
                    forward=bool(flags.get("forward")))
    relay = None
    if replay.emit_new or replay.forward:
        from eventbus.outbox.relay import Relay

        relay = Relay(store, tools.publisher(), now=store.now)
    processor = ReplayProcessor(store, router, tools.settings, store.now, replay,
                                after_success=relay)
    try:
        source = _planned(_source(store, selection, str(archive) if archive else None,
                                  processor.locate))
    except UsageError:
        processor.close()
        raise
    job = Rebuild(runs_beside(store, tools.settings), processor, source, run, batch=args.batch,
                  limit=RateLimit(args.rate, burst=1) if args.rate else RateLimit(None),
                  progress=lambda report: _progress(tools, report))
    print(f"rebuild {safe(replay.rebuild_id)} (resume with --resume {safe(replay.rebuild_id)})",
          file=tools.err, flush=True)
    try:
        report = job.run()
    finally:
        processor.close()
    print(file=tools.err)
    _report(args, tools, report, source)
    return 0 if not report.failures and not source.missing else 1


def _progress(tools: Tools, report: Report) -> None:
    bar = "#" * (30 * report.done // max(report.total, 1))
    counts = " ".join(f"{name} {count}" for name, count in report.counts.items() if count)
    print(f"\r  [{bar:<30}] {report.done}/{report.total}  {counts}", end="", file=tools.err,
          flush=True)


def _report(args: argparse.Namespace, tools: Tools, report: Report, source: Source) -> None:
    lines = [f"rebuild {report.rebuild_id}: " + ", ".join(
        f"{count} {name}" for name, count in report.counts.items())]
    if report.failures:
        lines += ["", table(["key", "reason"], [[f["key"], f["reason"]]
                                                for f in report.failures],
                            total=width_of(args))]
    if report.new_children:
        lines += ["", table(["parent", "new child", "published"],
                            [[c["parent"], c["key"], "yes" if c["emitted"] else "no (--emit-new)"]
                             for c in report.new_children],
                            whole=("parent", "new child"), total=width_of(args))]
    lines += [f"no event with idempotency key {safe(key)!r}" for key in source.missing]
    tools.emit({**report.to_json(), "missing": source.missing}, "\n".join(lines), args)


def _dry_run(args: argparse.Namespace, tools: Tools, source: _Planned,
             router: Router) -> int:
    keys = source.plan()
    archived = isinstance(source.source, ArchiveSource)
    rows = []
    for start in range(0, len(keys), 500):
        chunk = keys[start:start + 500]
        for key, (_delivery, record) in zip(chunk, source.load(chunk), strict=False):
            if archived:
                assert isinstance(source.source, ArchiveSource)
                event_type = source.source.event_types.get(key, "")
            else:
                assert record is not None
                key, event_type = str(record.get("idempotency_key")), \
                    str(record.get("event_type"))
            route = _route(router, event_type)
            would = "skip (replay=\"skip\")" if route == "skip" else \
                "no handler" if route is None else "run"
            if would == "run" and archived and record is None:
                would = "run (new record)"
            elif would == "run" and record is not None and \
                    record.get("event_status") != "SUCCESS":
                would = f"skip ({safe(str(record.get('event_status')))})"
            rows.append([key, event_type, would])
    rows += [[key, "", f"cannot be rebuilt: {why}"] for key, why in source.unreadable]
    running = sum(str(row[2]).startswith("run") for row in rows)
    text = (table(["key", "event_type", "would"], rows, total=width_of(args)) if rows
            else "nothing to rebuild") + \
        f"\n\n{running} events would run again"
    text += "".join(f"\nno event with idempotency key {safe(key)!r}" for key in source.missing)
    tools.emit({"dry_run": True,
                "keys": [row[0] for row in rows if str(row[2]).startswith("run")],
                "missing": source.missing}, text, args)
    return 1 if source.missing else 0


def _route(router: Router, event_type: str) -> str | None:
    try:
        return router.route_for_type(event_type).replay
    except KeyError:
        return None


def _selection(args: argparse.Namespace, started: dt.datetime, archive: bool) -> Selection:
    if args.since is not None and args.until is not None and args.since >= args.until:
        raise UsageError(f"--since ({args.since.isoformat()}) must be before --until "
                         f"({args.until.isoformat()})")
    filters = any(value is not None for value in (args.event_type, args.partner,
                                                  args.entity_type, args.entity_id, args.since,
                                                  args.until))
    if args.keys is None and not filters and not archive:
        raise UsageError("rebuild needs --keys FILE or at least one filter (--type, --partner, "
                         "--entity-type/--entity-id, --since/--until)")
    # The end is pinned at the start, so a resumed rebuild plans the same events.
    query = EventQuery(event_type=_opt(args.event_type, "--type"),
                       partner_id=_opt(args.partner, "--partner"),
                       entity_type=_opt(args.entity_type, "--entity-type"),
                       entity_id=_opt(args.entity_id, "--entity-id"),
                       since=args.since, until=args.until or started)
    keys = _keys(args.keys) if args.keys is not None else ()
    return Selection(query, keys)


def _keys(source: str) -> tuple[str, ...]:
    try:
        text = jsonfile.read_text(source)
    except jsonfile.Unreadable as exc:
        raise UsageError(str(exc)) from None
    keys = []
    for number, line in enumerate(text.splitlines(), 1):
        key = line.strip()
        if not key or key.startswith("#"):
            continue
        if len(key) > _MAX_KEY or not key.isprintable():
            raise UsageError(f"{safe(source)} line {number}: not an idempotency key "
                             f"({safe(key[:60])!r})")
        keys.append(key)
    if not keys:
        raise UsageError(f"{safe(source)} holds no keys")
    unique = tuple(dict.fromkeys(keys))
    size = sum(len(key.encode("utf-8")) + 16 for key in unique)  # BSON's per-entry cost
    if size > _MAX_KEYS_BYTES:
        raise UsageError(f"{safe(source)} holds {len(unique)} keys ({size // 1_000_000} MB): "
                         f"more than a rebuild's run document keeps "
                         f"({_MAX_KEYS_BYTES // 1_000_000} MB); split the file and rebuild "
                         "each part")
    return unique


def _text(value: str, option: str) -> str:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{option} is not UTF-8 text") from None
    return value


def _opt(value: str | None, option: str) -> str | None:
    return None if value is None else _text(value, option)


def _router(args: argparse.Namespace, tools: Tools) -> Router:
    spec = args.app or tools.ops.app
    if not spec:
        raise UsageError("rebuild needs the app's handlers: --app MODULE:ATTR or $EVENTBUS_APP")
    return load_router(spec)
