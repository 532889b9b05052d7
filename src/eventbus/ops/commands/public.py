"""Public topics: ``eventbus contracts write|check`` and ``eventbus peek TOPIC``.

* ``contracts check [--app main:app] [--dir docs/contracts]``: exit 0 when the
  checked-in contract files are what the app's router declares; 1 with the
  files to rewrite (``contracts write``); 2 when a change would break a
  published version (a removed or retyped field, a new required field).
* ``contracts write``: rewrite what is out of date; refuses a breaking change.
* ``peek TOPIC [--max N] [--ack] [--wait S]``: what arrived on a public topic, read from
  its pull subscription (``<topic>-local``, which ``pubsub-emulator.sh start``
  creates). Without ``--ack`` the messages are handed back (a nack) and stay.
  An empty subscription holds the pull for ``--wait`` seconds (default 10).

``--app`` is the service app (``main:app``), a ``Router``, or a function
returning one; only its forwards are read.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from eventbus.contracts import files
from eventbus.model.contract import ContractError
from eventbus.model.errors import EventBusError
from eventbus.model.router import Router
from eventbus.ops.commands.common import (
    APP_HELP,
    Tools,
    UsageError,
    add_table_options,
    load_router,
    positive,
    wait_seconds,
    width_of,
)
from eventbus.ops.render import table


def add(commands: Any) -> None:
    """Register ``contracts`` and ``peek``."""
    contracts = commands.add_parser("contracts", help="public contract files: write or check")
    contracts.add_argument("action", choices=("write", "check"))
    contracts.add_argument("--app", default="main:app",
                           help=f"{APP_HELP} (default main:app)")
    contracts.add_argument("--dir", type=Path, default=Path("docs/contracts"),
                           help="where the contract files live (default docs/contracts)")
    contracts.set_defaults(run=cmd_contracts)
    peek = commands.add_parser("peek", help="what arrived on a public topic")
    peek.add_argument("topic", help="the public topic")
    peek.add_argument("--subscription", help="default <topic>-local")
    peek.add_argument("--max", type=positive, default=20, help="messages at most (default 20)")
    peek.add_argument("--ack", action="store_true", help="acknowledge what is shown")
    peek.add_argument("--wait", type=wait_seconds, default=10.0,
                      help="seconds an empty subscription is waited on (default 10)")
    add_table_options(peek)
    peek.set_defaults(run=cmd_peek)


def router_of(spec: str) -> Router:
    """The router of ``spec``: an app from ``create_app``, a ``Router``, or a factory of one.

    An app's router was checked when the app was built; a bare ``Router`` may
    be a fragment (its forwards without the handlers), so only its forwards'
    own rules apply.
    """
    try:
        return load_router(spec)
    except ContractError as exc:
        raise UsageError(f"the app's public topics are refused: {exc}") from None


def cmd_contracts(args: argparse.Namespace, tools: Tools) -> int:
    """Check or write the contract files; see the module docstring for the exit codes."""
    forwards = router_of(args.app).forwards
    if args.action == "write":
        try:
            written = files.write(forwards, args.dir)
        except files.UnreadableContract as exc:
            raise UsageError(f"contracts: {exc}") from None
        except files.BreakingChange as exc:
            print(f"eventbus contracts: refused, it would break a published version: {exc}. "
                  "Declare the change as a new version instead.", file=tools.err)
            return 2
        print(f"eventbus contracts: {len(written)} file(s) written in {args.dir}"
              + "".join(f"\n  {name}" for name in written), file=tools.out)
        return 0
    try:
        report = files.check(forwards, args.dir)
    except files.UnreadableContract as exc:
        raise UsageError(f"contracts: {exc}") from None
    for problem in report.breaking:
        print(f"breaking: {problem}", file=tools.err)
    for name in report.stale:
        print(f"out of date: {args.dir / name}", file=tools.err)
    if report.current:
        print(f"eventbus contracts: {args.dir} is current", file=tools.out)
    elif not report.breaking:
        print("run `eventbus contracts write` to update them", file=tools.err)
    return 2 if report.breaking else 0 if report.current else 1


def cmd_peek(args: argparse.Namespace, tools: Tools) -> int:
    """Print up to ``--max`` messages of the topic's pull subscription."""
    from google.api_core import exceptions
    from google.cloud import pubsub_v1

    client = pubsub_v1.SubscriberClient()
    path = client.subscription_path(tools.settings.project_id,
                                    args.subscription or f"{args.topic}-local")
    try:
        # A pull on an empty subscription is held until about its deadline: --wait.
        received = list(client.pull(request={"subscription": path, "max_messages": args.max},
                                    timeout=args.wait).received_messages)
        _settle(client, path, [m.ack_id for m in received], args.ack)
    except exceptions.DeadlineExceeded:
        received = []  # nothing came within --wait
    except exceptions.NotFound:
        raise UsageError(f"no subscription {path}: `pubsub-emulator.sh start` makes it "
                         "locally, or pass --subscription") from None
    except exceptions.GoogleAPICallError as exc:
        raise EventBusError(f"cannot pull {path}: {exc}") from None
    finally:
        client.close()
    messages = [{"message_id": m.message.message_id,
                 "published": m.message.publish_time.isoformat(),
                 "attributes": dict(m.message.attributes),
                 "data": m.message.data.decode("utf-8", "backslashreplace")} for m in received]
    rows = [[m["message_id"], m["published"], m["attributes"].get("contract_version", ""),
             m["attributes"].get("idempotency_key", ""), m["data"]] for m in messages]
    headers = ["message id", "published", "version", "idempotency_key", "data"]
    # The key is what a consumer copies: kept whole where it fits; the body is cut to the
    # width (--wide or --json shows it whole).
    text = table(headers, rows, whole=("idempotency_key",), total=width_of(args)) if rows \
        else f"nothing waiting on {path}"
    tools.emit({"subscription": path, "messages": messages}, text, args)
    return 0


def _settle(client: Any, path: str, ack_ids: list[str], ack: bool) -> None:
    if not ack_ids:
        return
    if ack:
        client.acknowledge(request={"subscription": path, "ack_ids": ack_ids}, timeout=10)
    else:  # hand them back at once: peeking again shows them again
        client.modify_ack_deadline(request={"subscription": path, "ack_ids": ack_ids,
                                            "ack_deadline_seconds": 0}, timeout=10)
