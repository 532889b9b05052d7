"""start / stop / status / uri of the local MongoDB-compatible server.

Library use (tests/conftest.py): `ensure_started()` returns the URI and records
the caller's claim (`localdb.claims`: by default the calling process); `stop()`
releases that claim and stops what `ensure_started` started once no other live
claim remains. The CLI in `__main__` wraps these.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from localdb import chroot, claims, documentdb, mongod, postgres, provision, state, stats
from localdb.claims import Claim
from localdb.config import Backend, Config, choose_backend
from localdb.errors import LocalDBError
from localdb.hooks import Note, Record
from localdb.probes import mongo_ping, pg_error
from localdb.servers import adopted, ping_local, stop_process
from localdb.state import Component, State

# Long enough to wait for another process's first provisioning, yet bounded.
START_LOCK_TIMEOUT = 1800.0
STOP_LOCK_TIMEOUT = 120.0
EXTERNAL_TIMEOUT = 5.0

Starter = Callable[[Config, State, Record, Note], None]
STARTERS: dict[Backend, Starter] = {
    Backend.MONGOD: mongod.start,
    Backend.DOCUMENTDB: documentdb.start,
}


def to_stderr(message: str) -> None:
    """Default progress printer: one "localdb: ..." line on stderr."""
    print(f"localdb: {message}", file=sys.stderr, flush=True)


def uri(config: Config | None = None) -> str:
    """MONGODB_URI when set, else the local server's URI (whether running or not)."""
    config = config or Config.from_env()
    return config.mongodb_uri or config.local_uri


def ensure_started(
    config: Config | None = None, note: Note = to_stderr, claim: Claim | None = None
) -> str:
    """Make the server answer and return its URI; a fast no-op when it already does.

    Records `claim` (default: this process, held while it runs) as a user of the
    server, so another user's `stop` leaves it running. MONGODB_URI's server is
    someone else's: no claim is recorded for it.
    """
    config = config or Config.from_env()
    backend = choose_backend(config)
    if backend is Backend.EXTERNAL:
        return _check_external(config)
    claim = claim or claims.for_process()
    with state.locked(config.run_dir, START_LOCK_TIMEOUT):
        previous = _usable_previous(config, backend)
        claims.prune(config.run_dir)
        # Before anything starts: a failed start leaves this claim's user a `stop` to run.
        claims.add(config.run_dir, claim)
        if previous is not None and _healthy(previous, config):
            return previous.uri
        current = _carry_over(backend, config, previous)
        try:
            STARTERS[backend](config, current, _recorder(config, current), note)
        finally:
            claims.mark_managed(config.run_dir)
        return current.uri


def _carry_over(backend: Backend, config: Config, previous: State | None) -> State:
    """A new state holding what an earlier start made that is still ours and alive.

    Saved before anything else happens, so a failure cannot make us forget a
    PostgreSQL, a mount or a temp dir that `stop` must clean up.
    """
    current = State(backend.value, config.local_uri)
    if previous is not None:
        current.components = [c for c in previous.components if c.owned and c.running()]
        current.mounts = [m for m in previous.mounts if m in chroot.mount_points()]
        current.tmpdir = previous.tmpdir
    return current


def _check_external(config: Config) -> str:
    """Ping MONGODB_URI; it is someone else's server, so only check it answers."""
    external = config.mongodb_uri or ""
    error = mongo_ping(external, timeout=EXTERNAL_TIMEOUT)
    if error is not None:
        raise LocalDBError(f"MONGODB_URI={redact(external)} does not answer ping ({error}); "
                           "start that server or unset MONGODB_URI")
    return external


def _usable_previous(config: Config, backend: Backend) -> State | None:
    """The saved state if it describes this backend and URI; else clean it up and None."""
    previous = state.load(config.run_dir)
    if previous is None or (previous.backend, previous.uri) == (backend.value, config.local_uri):
        return previous
    if _healthy(previous, config):
        raise LocalDBError(f"localdb already runs {previous.backend} at {previous.uri}; run "
                           "`python -m localdb stop` first to switch port or backend")
    _stop_owned(previous, config)  # dead leftovers of another setup
    state.clear(config.run_dir)
    return None


def _healthy(saved: State, config: Config) -> bool:
    """Everything we started still runs, the URI answers ping, and PostgreSQL answers."""
    if not all(c.running() for c in saved.components if c.owned) or not saved.components:
        return False
    if ping_local(saved.uri) is not None:
        return False
    return saved.backend != Backend.DOCUMENTDB.value or pg_error(config.pg_dsn) is None


def _recorder(config: Config, current: State) -> Record:
    """A Record that appends a component to `current` and saves the state file."""
    def record(comp: Component | None) -> None:
        if comp is not None:
            current.components = [c for c in current.components if c.name != comp.name]
            current.components.append(comp)
        state.save(config.run_dir, current)
    return record


def stop(
    config: Config | None = None, claim: Claim | None = None, force: bool = False
) -> list[str]:
    """Release `claim` (default: this process's); stop the server if no one else uses it.

    What `ensure_started` started (and only that) is stopped when `claim` was recorded
    and no other live claim remains, or with `force` (whoever uses it). One message per
    thing done or left alone.
    """
    config = config or Config.from_env()
    claim = claim or claims.for_process()
    with state.locked(config.run_dir, STOP_LOCK_TIMEOUT):
        held = claims.remove(config.run_dir, claim)
        others = claims.prune(config.run_dir)
        saved = state.load(config.run_dir)
        if saved is None:
            return [_nothing_to_stop(config)]
        if not force:
            kept = _kept_for(saved, config, claim, held, others)
            if kept:
                return kept
        messages = _stop_owned(saved, config)
        state.clear(config.run_dir)
        claims.clear(config.run_dir)
        if force and others:
            messages.append(f"--force: stopped although used by {claims.describe(others)}")
        return messages or [_nothing_to_stop(config)]


def _kept_for(
    saved: State, config: Config, claim: Claim, held: bool, others: list[Claim]
) -> list[str]:
    """Why `stop` leaves the server running for `claim`'s user, or [] when it may stop it."""
    released = [f"released the claim of {claim.owner}"] if held else []
    where = f"at {saved.uri}"
    if others:
        return [*released, f"left running {where}: used by {claims.describe(others)}"]
    if not any(c.owned and c.running() for c in saved.components):
        return []  # nothing of ours runs: stopping only tidies up (and says what it left)
    if not held:
        return [f"left running {where}: {claim.owner} holds no claim on it (its users' "
                "claims are released); `python -m localdb stop --force` stops it"]
    if not claims.managed(config.run_dir):
        return [*released, f"left running {where}: started by a localdb that records no "
                "claims (an older checkout?), so it may still be in use; "
                "`python -m localdb stop --force` stops it"]
    return []


def _nothing_to_stop(config: Config) -> str:
    """The message when no state exists; with MONGODB_URI, also whether it answers."""
    if not config.mongodb_uri:
        return "nothing to stop (localdb has not started anything)"
    error = mongo_ping(config.mongodb_uri, timeout=EXTERNAL_TIMEOUT)
    reach = "answers ping" if error is None else f"does not answer ping: {error}"
    return f"nothing to stop: MONGODB_URI is not managed by localdb ({reach})"


def _stop_owned(saved: State, config: Config) -> list[str]:
    """Stop owned processes (newest first), then unmount and delete what we created."""
    messages = [_stop_component(c) for c in reversed(saved.components)]
    messages += _unmount(saved.mounts, config)
    if saved.tmpdir:
        mongod.remove_tmpdir(saved.tmpdir)
        messages.append(f"removed {saved.tmpdir}")
    return messages


def _stop_component(comp: Component) -> str:
    """Stop one component if we started it and it runs; say what happened."""
    if not comp.owned:
        return f"left {comp.name} running (pid {comp.pid or '?'}; not started by localdb)"
    if not comp.running():
        return f"{comp.name} (pid {comp.pid}) had already exited"
    if comp.name == "postgres":
        postgres.stop(comp)
    else:
        stop_process(comp, comp.name)
    return f"stopped {comp.name} (pid {comp.pid})"


def _unmount(mounts: list[str], config: Config) -> list[str]:
    """Unmount our chroot mounts unless something still runs inside the chroot."""
    if not mounts:
        return []
    inside = chroot.processes_inside(config.chroot)
    if inside:
        return [f"left {', '.join(mounts)} mounted (processes {inside[:3]} run in the chroot)"]
    failed = chroot.unmount(mounts)
    if failed:
        return [f"could not unmount {', '.join(failed)} (busy?); umount them by hand"]
    return [f"unmounted {', '.join(mounts)}"]


@dataclass
class Status:
    """What `status` found: up or down, and lines describing each part."""

    up: bool
    backend: str
    uri: str
    lines: list[str] = field(default_factory=list)


def status(config: Config | None = None) -> Status:
    """Where the server is: backend, URI, pids, ports, logs, up/down (by pymongo ping)."""
    config = config or Config.from_env()
    backend = choose_backend(config)
    if backend is Backend.EXTERNAL and config.mongodb_uri:
        error = mongo_ping(config.mongodb_uri, timeout=EXTERNAL_TIMEOUT)
        return Status(error is None, backend.value, config.mongodb_uri,
                      [f"not managed by localdb (MONGODB_URI); ping: {error or 'ok'}"])
    saved = state.load(config.run_dir)
    target = saved.uri if saved else config.local_uri
    error = ping_local(target)
    report = Status(error is None, saved.backend if saved else backend.value, target)
    report.lines = (_component_lines(saved, config, backend) + _claim_lines(saved, config)
                    + _path_lines(config, report, error))
    return report


def _claim_lines(saved: State | None, config: Config) -> list[str]:
    """Who uses the server (the live claims), and whether stop can see every user."""
    found = claims.live(config.run_dir)
    lines = [f"used by: {c.owner} (since {c.since})" for c in found] or ["used by: no claim"]
    if saved is not None and not claims.managed(config.run_dir):
        lines.append("claims: started by a localdb that records none; `stop` leaves it "
                     "running (`stop --force` stops it)")
    return lines


def _component_lines(saved: State | None, config: Config, backend: Backend) -> list[str]:
    """One line per server process, from the state file or, without one, from the ports."""
    comps = saved.components if saved else _discover(config, backend)
    if not comps:
        return ["no server process found"]
    return [_describe(c) for c in comps]


def _discover(config: Config, backend: Backend) -> list[Component]:
    """Servers that run without our state file (started by someone else)."""
    found = []
    if backend is Backend.DOCUMENTDB:
        pm = postgres.running_postmaster(config.chroot)
        if pm is not None:
            proc, port = pm
            found.append(Component("postgres", proc.pid, proc.start_ticks, False, port,
                                   postgres.log_of(proc.pid, config)))
    if ping_local(config.local_uri, timeout=1.0) is None:
        name = "gateway" if backend is Backend.DOCUMENTDB else "mongod"
        found.append(adopted(name, config.port))
    return found


def _describe(comp: Component) -> str:
    """e.g. "gateway: up, pid 123, port 27018, started by localdb, log /x/gateway.log"."""
    alive = "up" if comp.running() else "down"
    who = "started by localdb" if comp.owned else "not started by localdb"
    log = f", log {comp.log}" if comp.log else ""
    return f"{comp.name}: {alive}, pid {comp.pid or '?'}, port {comp.port}, {who}{log}"


def _path_lines(config: Config, report: Status, error: str | None) -> list[str]:
    """The ping result and where logs, state and the chroot live."""
    lines = [f"ping: {error or 'ok'}", f"logs: {config.logs_dir}", f"state: {config.run_dir}"]
    if report.backend == Backend.DOCUMENTDB.value:
        lines.insert(1, f"postgres query: {pg_error(config.pg_dsn) or 'ok'}")
        done = "provisioned" if provision.is_provisioned(config.chroot) else "not provisioned"
        lines.append(f"chroot: {config.chroot} ({done})")
        lines += _statistics_lines(config) if error is None else []
    return lines


def _statistics_lines(config: Config) -> list[str]:
    """Planner statistics of the largest collections (``localdb.stats``), one line each."""
    try:
        found = stats.largest(config.pg_dsn)
    except psycopg.Error as exc:
        return [f"statistics: unreadable ({type(exc).__name__}: {str(exc).strip()[:200]})"]
    if not found:
        return ["statistics: no collections yet"]
    return [f"statistics: {entry.describe()}" for entry in found]


def redact(uri: str) -> str:
    """The URI with any password replaced by ***, for messages."""
    scheme, sep, rest = uri.partition("://")
    creds, at, host = rest.rpartition("@")
    if not at or ":" not in creds:
        return uri
    return f"{scheme}{sep}{creds.split(':', 1)[0]}:***@{host}"
