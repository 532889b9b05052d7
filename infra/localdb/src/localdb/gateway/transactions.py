"""Transactions as commands see them: routing into a transaction, commit, abort.

A command belongs to a transaction when it carries `autocommit: false` (with
`lsid` and `txnNumber`); the first also carries `startTransaction: true`.
MongoDB aborts a transaction on any error inside it, and labels the errors
after which retrying the whole transaction can succeed; so does this.
"""

from __future__ import annotations

import time
from typing import Any

from localdb.gateway.context import Context, Handler, Reply
from localdb.gateway.errors import (
    TRANSIENT_IN_TRANSACTION,
    TRANSIENT_LABEL,
    Code,
    MongoError,
)
from localdb.gateway.failures import from_pg
from localdb.gateway.pg import PgError
from localdb.gateway.sessions import Transaction, TxnState, no_such_transaction

UNKNOWN_COMMIT_LABEL = "UnknownTransactionCommitResult"
CONTROL_COMMANDS = frozenset({"commitTransaction", "abortTransaction"})


def in_transaction(body: dict[str, Any]) -> bool:
    """True for a command that runs inside a multi-document transaction."""
    return body.get("autocommit") is False


def _ids(body: dict[str, Any]) -> tuple[bytes, int]:
    """(session key, txnNumber) of a transaction command."""
    lsid, number = body.get("lsid"), body.get("txnNumber")
    if not isinstance(lsid, dict) or not isinstance(lsid.get("id"), bytes):
        raise MongoError(Code.InvalidOptions, "a transaction needs a session (lsid)")
    if not isinstance(number, int) or isinstance(number, bool):
        raise MongoError(Code.InvalidOptions, "a transaction needs a txnNumber")
    return bytes(lsid["id"]), number


def run_in_transaction(ctx: Context, handler: Handler) -> Reply:
    """Run `handler` on the transaction's session; an error aborts the transaction."""
    key, number = _ids(ctx.body)
    registry = ctx.state.transactions
    txn = registry.begin(key, number) if ctx.body.get("startTransaction") else (
        registry.find(key, number))
    with txn.lock:
        if txn.state is not TxnState.ACTIVE:  # the reaper got there first
            raise no_such_transaction(number, f"has been {txn.state.value}")
        ctx.txn = txn
        reply = _guarded(ctx, txn, handler)
        txn.last_used = time.monotonic()
    return reply


def _guarded(ctx: Context, txn: Transaction, handler: Handler) -> Reply:
    """Call the handler; abort on an error or on write errors in its reply."""
    try:
        reply = handler(ctx)
    except (MongoError, PgError) as exc:
        error = from_pg(ctx, exc) if isinstance(exc, PgError) else exc
        ctx.state.transactions.abort(txn)
        if error.code in TRANSIENT_IN_TRANSACTION:
            error.add_label(TRANSIENT_LABEL)
        raise error from exc
    except BaseException:
        ctx.state.transactions.abort(txn)
        raise
    if isinstance(reply, dict) and reply.get("writeErrors"):
        ctx.state.transactions.abort(txn)
        _raise_transient(reply["writeErrors"])
    return reply


def _raise_transient(write_errors: list[dict[str, Any]]) -> None:
    """A write conflict inside a transaction fails the command, labelled for retry.

    The engine reports a row lock it could not get as a per-statement write
    error; MongoDB reports it as a command error with TransientTransactionError,
    which is what makes with_transaction retry.
    """
    for error in write_errors:
        if error.get("code") in TRANSIENT_IN_TRANSACTION:
            raise MongoError(error["code"], error.get("errmsg", "write conflict"),
                             labels=(TRANSIENT_LABEL,))


def commit_transaction(ctx: Context) -> Reply:
    """commitTransaction; committing again (a driver retry) succeeds again."""
    key, number = _ids(ctx.body)
    txn = ctx.state.transactions.latest(key, number)
    if txn is None:
        raise no_such_transaction(number)
    with txn.lock:
        if txn.state is TxnState.ABORTED:
            raise no_such_transaction(number, "has been aborted")
        if txn.state is TxnState.ACTIVE:
            _commit(ctx, txn)
    return {"ok": 1.0}


def _commit(ctx: Context, txn: Transaction) -> None:
    """COMMIT, labelling a failure the way drivers decide whether to retry."""
    try:
        ctx.state.transactions.commit(txn)
    except PgError as exc:
        error = from_pg(ctx, exc)
        lost = error.code == Code.HostUnreachable  # the outcome is unknown
        error.add_label(UNKNOWN_COMMIT_LABEL if lost else TRANSIENT_LABEL)
        raise error from exc


def abort_transaction(ctx: Context) -> Reply:
    """abortTransaction; aborting twice is fine, aborting a committed one is not."""
    key, number = _ids(ctx.body)
    txn = ctx.state.transactions.latest(key, number)
    if txn is None:
        raise MongoError(Code.NoSuchTransaction, f"Transaction with txnNumber {number} not found")
    with txn.lock:
        if txn.state is TxnState.COMMITTED:
            raise MongoError(Code.TransactionCommitted, "Cannot abort a committed transaction")
        ctx.state.transactions.abort(txn)
    return {"ok": 1.0}


HANDLERS: dict[str, Handler] = {
    "commitTransaction": commit_transaction,
    "abortTransaction": abort_transaction,
}
