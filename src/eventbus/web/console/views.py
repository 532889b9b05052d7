"""The console's pages: a Flask blueprint over ``eventbus.ops.reports`` and ``replay``."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import flask

from eventbus.model.errors import Forbidden, InvalidEvent, PublishError, Unauthenticated
from eventbus.model.event import json_object
from eventbus.ops import correct
from eventbus.ops import reports as ops
from eventbus.ops.render import duration, moment, to_json
from eventbus.ops.replay import Replayer, ReplayResult, fetch, replayable, spaced
from eventbus.partners import view as partner_view
from eventbus.rebuild.runner import run_views
from eventbus.rebuild.store import runs_beside
from eventbus.web.console import Console, charts
from eventbus.web.console.access import (
    COOKIE,
    IAP_HEADER,
    csrf_token,
    csrf_valid,
    loopback,
    same_token,
)

blueprint = flask.Blueprint("console", __name__, template_folder="templates",
                            static_folder="static", static_url_path="/static")
# CSP: no inline script, no third-party origin; styles and the one script are ours.
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; "
                               "img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
                               "base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    # same-origin, not no-referrer: with no-referrer, Chromium sends `Origin: null` on POSTs.
    "Referrer-Policy": "same-origin",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}
MAX_REPLAY = 1000


def console() -> Console:
    """Return the console of the current app."""
    found: Console = flask.current_app.extensions["eventbus.console"]
    return found


# -- who is asking -------------------------------------------------------------------------

@blueprint.before_request
def authenticate() -> Any:
    """Let an operator in, or answer 401/403; a local first visit trades its token for a cookie."""
    config = console().config
    try:
        if config.auth == "local":
            return _local()
        header = (flask.request.headers.get(IAP_HEADER, "") if config.auth == "iap"
                  else flask.request.headers.get("Authorization", ""))
        flask.g.operator = console().verifier.verify(header)
    except Unauthenticated as exc:
        return _refused(401, str(exc))
    except Forbidden as exc:
        return _refused(403, str(exc))
    return None


def _local() -> Any:
    request, token = flask.request, console().config.token
    if not loopback(request.host):
        raise Forbidden("the local console answers on 127.0.0.1 only")
    if "token" in request.args:
        if not same_token(request.args.get("token"), token):
            raise Unauthenticated("wrong console token")
        response = flask.redirect(_without_token())
        response.set_cookie(COOKIE, token, httponly=True, samesite="Strict",
                            path=flask.url_for("console.overview"))
        return response
    if not same_token(request.cookies.get(COOKIE), token):
        raise Unauthenticated("open the console with the URL `eventbus console` printed "
                              "(it carries ?token=)")
    flask.g.operator = console().config.local_operator
    return None


def _without_token() -> str:
    args: dict[str, Any] = {k: v for k, v in flask.request.args.items() if k != "token"}
    args.update(flask.request.view_args or {})
    return flask.url_for(flask.request.endpoint or "console.overview", **args)


def _refused(status: int, reason: str) -> tuple[str, int]:
    return flask.render_template("refused.html", status=status, reason=reason), status


@blueprint.after_request
def harden(response: flask.Response) -> flask.Response:
    """Add the security headers to every console response."""
    response.headers.update(SECURITY_HEADERS)
    return response


@blueprint.app_context_processor
def common() -> dict[str, Any]:
    """Give every template the operator, the CSRF token and the formatting helpers."""
    if "eventbus.console" not in flask.current_app.extensions:
        return {}
    config = console().config
    operator = flask.g.get("operator", "")
    return {"operator": operator, "read_only": config.read_only, "moment": moment,
            "duration": duration, "status_label": ops.status_label,
            "csrf": csrf_token(config.secret, operator) if operator else ""}


# -- pages ---------------------------------------------------------------------------------

@blueprint.get("/")
def overview() -> str:
    """Counts by status and type, and the throughput chart of the last hours."""
    store, config = console().store, console().config
    counts = ops.overview_counts(store)
    buckets = ops.throughput(store, console().now(), config.hours)
    return flask.render_template("overview.html", counts=counts,
                                 columns=ops.labels(counts.values()),
                                 chart=charts.throughput(buckets), hours=config.hours,
                                 total=sum(b.total for b in buckets),
                                 failed=sum(b.failed for b in buckets))


@blueprint.get("/failed")
def failed() -> str:
    """The failed groups, with filters; one group's events when ``group`` is given."""
    query = _failed_query(flask.request.args)
    report = ops.failed_groups(console().store, query)
    wanted = flask.request.args.get("group", "")
    group = ops.find_group(report, wanted) if wanted else None
    records = [r for r in report.records if group and r["idempotency_key"] in group.keys]
    filters = {name: value for name, value in flask.request.args.items() if name != "group"}
    return flask.render_template("failed.html", report=report, group=group, records=records,
                                 args=flask.request.args, filters=filters)


def _failed_query(args: Mapping[str, str]) -> Any:
    hours = args.get("hours", "")
    since = (console().now() - dt.timedelta(hours=float(hours))
             if hours.replace(".", "", 1).isdigit() else None)
    retryable = {"retrying": True, "final": False}.get(args.get("which", ""))
    return ops.failed_query(event_type=args.get("type") or None,
                            partner_id=args.get("partner") or None, since=since,
                            retryable=retryable)


@blueprint.get("/event")
def event() -> Any:
    """One event: document, attempt timeline, error, replays, forwards, cascade."""
    key = flask.request.args.get("key", "")
    view = ops.event_view(console().store, key)
    if view is None:
        return flask.render_template("missing.html", key=key), 404
    return flask.render_template("event.html", view=view, record=view.record,
                                 chart=charts.timeline(view.attempts),
                                 document=to_json(view.record),
                                 forwards=ops.forwarded(view.record),
                                 replayable=replayable(view.record))


@blueprint.get("/partner")
def partner() -> str:
    """A partner's history, newest first (seed 002)."""
    partner_id = flask.request.args.get("id", "")
    limit = min(int(flask.request.args.get("limit", "100") or 100), 1000)
    records = ops.history(console().store, partner_id, limit) if partner_id else []
    return flask.render_template("partner.html", partner_id=partner_id, records=records)


@blueprint.get("/partners")
def partners() -> str:
    """Each partner's breaker, why it opened, failures, slow calls, parked events, rate and
    bulkhead, with this process's calls in flight when mounted in the service
    (``eventbus partners``)."""
    app = console()
    return flask.render_template("partners.html", local=app.partners is not None,
                                 partners=partner_view.views(app.partner_store(), app.settings,
                                                             app.now(), app.partners))


@blueprint.get("/rebuilds")
def rebuilds() -> str:
    """Running and finished rebuilds with their counts and progress (read-only)."""
    runs = runs_beside(console().store, console().settings)
    # The checkpoints are stamped on the store's clock: their age is read on it too.
    return flask.render_template("rebuilds.html", runs=run_views(runs, runs.now()))


@blueprint.post("/partners")
def steer_partner() -> Any:
    """Hold a breaker open or close it: CSRF-checked, with a reason, audited."""
    config, form = console().config, flask.request.form
    if config.read_only:
        return _refused(403, "this console is read-only")
    if not _same_origin() or not csrf_valid(config.secret, flask.g.operator, form.get("csrf")):
        return _refused(403, "the form is missing its CSRF token or came from elsewhere")
    action, why = form.get("action", ""), form.get("why", "").strip()
    if action not in ("open", "close") or not why or not form.get("name"):
        return _refused(400, "say which partner, open or close, and why")
    try:
        partner_view.steer(console().partner_store(), form["name"], hold_open=action == "open",
                           why=why, by=str(flask.g.operator), now=console().now(),
                           settings=console().settings)
    except partner_view.SteerError as exc:
        return _refused(409, str(exc))
    return flask.redirect(flask.url_for("console.partners"), code=303)


# -- replay --------------------------------------------------------------------------------

@blueprint.get("/replay")
def confirm() -> Any:
    """The confirmation step: what would be replayed, and the POST form."""
    if console().config.read_only:
        return _refused(403, "this console is read-only")
    records, title = _chosen(flask.request.args)
    chosen = [r for r in records if replayable(r)]
    key = flask.request.args.get("key", "")
    editable = key and len(chosen) == 1 and correct.refused(chosen[0])
    return flask.render_template("confirm.html", records=chosen, title=title, key=key,
                                 group=flask.request.args.get("group", ""),
                                 correction=_draft(chosen[0]) if editable else None)


@blueprint.post("/replay")
def replay() -> Any:
    """Replay after confirmation: CSRF-checked, audited, rate-limited."""
    config, form = console().config, flask.request.form
    if config.read_only:
        return _refused(403, "this console is read-only")
    if not _same_origin() or not csrf_valid(config.secret, flask.g.operator, form.get("csrf")):
        return _refused(403, "the replay form is missing its CSRF token or came from elsewhere")
    records, title = _chosen(form)
    why = form.get("why", "") or "replayed from the console"
    try:
        if form.get("data") is not None and form.get("key"):
            return _replay_corrected(records, form["data"], why, title)
        results = _replay([r for r in records if replayable(r)][:MAX_REPLAY], why)
    except PublishError as exc:  # no publisher here (credentials, project): say so
        return _refused(503, f"nothing was replayed: {exc}")
    return flask.render_template("replayed.html", results=results, title=title)


def _draft(record: Mapping[str, Any]) -> str:
    """The text the correction form starts from: the refused payload as it was kept."""
    raw = record.get("raw_payload")
    return raw if isinstance(raw, str) else to_json({name: record.get(name) for name in (
        "event_type", "event_version", "entity_metadata", "entity_data")})


def _replay_corrected(records: list[dict[str, Any]], text: str, why: str,
                      title: str) -> Any:
    """Edit and retry (``eventbus.ops.correct``): the corrected event under the record's key."""
    if len(records) != 1:
        return _refused(404, "no such event")
    try:
        body = json_object(text.encode("utf-8", "surrogatepass"))
    except InvalidEvent as exc:
        return _refused(400, f"the corrected event is not readable JSON: {exc}")
    worker = _replayer(why)
    try:
        result = worker.replay_with_data(records[0], body)
    except correct.NotCorrectable as exc:
        return _refused(409, str(exc))
    return flask.render_template("replayed.html", results=[result], title=title)


def _same_origin() -> bool:
    origin = flask.request.headers.get("Origin")
    if origin is None:
        return True  # no origin sent: the CSRF token alone decides
    # Hosts only: behind a TLS-terminating proxy the scheme seen here differs.
    return urlsplit(origin).netloc == flask.request.host


def _chosen(args: Mapping[str, str]) -> tuple[list[dict[str, Any]], str]:
    store = console().store
    if args.get("key"):
        records, _ = fetch(store, [args["key"]])
        return records, f"event {args['key']}"
    report = ops.failed_groups(store, ops.failed_query())
    group = ops.find_group(report, args.get("group", "")) if args.get("group") else None
    if group is None:
        return [], "nothing chosen"
    records, _ = fetch(store, group.keys)
    return records, f"group {group.id}: {group.event_type} {group.error_type}"


def _replayer(why: str) -> Replayer:
    app = console()
    return Replayer(app.store, app.publisher(), app.now, by=str(flask.g.operator), why=why,
                    locate=app.locate, limit=spaced(app.config.replay_rate),
                    redrive_after=timedelta(seconds=app.settings.redrive_after_seconds))


def _replay(records: list[dict[str, Any]], why: str) -> list[ReplayResult]:
    worker = _replayer(why)
    return [worker.replay(record) for record in records]
