"""Command dispatch: name -> handler, transactions, and errors turned into replies.

`execute` never raises for a failing command: every failure becomes an
error reply document, so one bad request cannot take a connection (or the
gateway) down.
"""

from __future__ import annotations

import logging

from localdb.gateway import admin, ddl, queries, transactions, wire, writes
from localdb.gateway.context import Client, Context, GatewayState, Handler, Reply
from localdb.gateway.errors import Code, MongoError, command_not_found
from localdb.gateway.failures import from_pg
from localdb.gateway.pg import PgError
from localdb.gateway.wire import Request

log = logging.getLogger(__name__)

HANDLERS: dict[str, Handler] = {
    **admin.HANDLERS,
    **writes.HANDLERS,
    **queries.HANDLERS,
    **ddl.HANDLERS,
    **transactions.HANDLERS,
}


def execute(state: GatewayState, client: Client, request: Request) -> bytes:
    """Run one command; its reply document, BSON-encoded."""
    ctx = Context(state, client, request)
    try:
        reply = dispatch(ctx)
    except MongoError as exc:
        reply = exc.to_document()
    except PgError as exc:
        reply = from_pg(ctx, exc).to_document()
    except Exception as exc:  # a gateway bug: report it, keep serving
        log.exception("command %r failed", request.name)
        reply = MongoError(Code.InternalError, f"{type(exc).__name__}: {exc}").to_document()
    finally:
        ctx.release()
    return reply if isinstance(reply, bytes) else _encode(reply)


def dispatch(ctx: Context) -> Reply:
    """Find the handler and run it, inside the session's transaction if there is one."""
    name = ctx.request.name
    handler = HANDLERS.get(name)
    if handler is None:
        raise command_not_found(name)
    _inline_sequences(ctx.request)
    if transactions.in_transaction(ctx.body) and name not in transactions.CONTROL_COMMANDS:
        return transactions.run_in_transaction(ctx, handler)
    return handler(ctx)


def _inline_sequences(request: Request) -> None:
    """Move document sequences into the body unless the engine takes them as they are.

    insert/update/delete pass their one sequence to the engine as a
    bsonsequence; any other command (or sequence) is folded into the body,
    which is then re-encoded.
    """
    if not request.sequences:
        return
    native = writes.SEQUENCE_FIELDS.get(request.name)
    foreign = {k: v for k, v in request.sequences.items() if k != native}
    if not foreign:
        return
    for field, sequence in foreign.items():
        if field in request.body:
            raise MongoError(Code.BadValue, f"{field!r} given both inline and as a sequence")
        request.body[field] = sequence.documents
        del request.sequences[field]
    request.raw_body = wire.encode(request.body)


def _encode(reply: dict[str, object]) -> bytes:
    """Encode a reply; a reply that cannot be encoded becomes an error reply."""
    try:
        return wire.encode(reply)
    except Exception as exc:  # a value BSON cannot hold: still answer
        log.exception("cannot encode a reply")
        return wire.encode(MongoError(Code.InternalError, f"cannot encode reply: {exc}")
                           .to_document())
