"""``python -m infra.pubsub ping|check|ensure|list``: the Python half of pubsub-emulator.sh.

- ``ping [HOST:PORT]``: exit 0 when a Pub/Sub emulator answers there, 1 when
  nothing listens, 2 when something else does.
- ``check``: validate the environment's settings (exit 2 with one line if bad).
- ``ensure``: create or update the topic, dead-letter topic, push subscription,
  the worker's pull subscription and the dead-letter pull subscription, and
  each public topic of the app (``docs/contracts/topics.json``, or
  ``$EVENTBUS_CONTRACTS_DIR/topics.json``) with a pull subscription
  ``<topic>-local`` that ``eventbus peek TOPIC`` reads; print a table of what it did.
- ``list``: print the project's topics and subscriptions.

Settings come from the environment (see pubsub-emulator.sh); the google
client is imported only by ``ensure`` and ``list`` so the probes stay fast.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from infra.pubsub.config import DEFAULT_HOST, ConfigError, Layout
from infra.pubsub.probe import ping

PROG = "pubsub-emulator"
CONTRACTS = Path(__file__).resolve().parents[2] / "docs" / "contracts"


def public_topics(environ: dict[str, str] | None = None) -> list[str]:
    """The app's public topics, from the checked-in manifest (none when there is none)."""
    directory = Path((environ or dict(os.environ)).get("EVENTBUS_CONTRACTS_DIR") or CONTRACTS)
    try:
        manifest = json.loads((directory / "topics.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    return sorted(manifest.get("topics", {}))


def ensure(layout: Layout) -> None:
    """Create or update every resource and print one table row per resource."""
    from infra.pubsub.resources import Admin, format_table

    with Admin(layout.host, layout.project) as admin:
        outcomes = [admin.ensure_topic(layout.topic)]
        if layout.policy.dead_lettering:
            outcomes.append(admin.ensure_topic(layout.dead_letter_topic))
        outcomes.append(
            admin.ensure_push_subscription(
                layout.push_subscription,
                layout.topic,
                layout.endpoint,
                layout.policy,
                dead_letter_topic=layout.dead_letter_topic,
            )
        )
        outcomes.append(
            admin.ensure_worker_subscription(
                layout.pull_subscription,
                layout.topic,
                layout.policy,
                dead_letter_topic=layout.dead_letter_topic,
                ordered=layout.pull_ordered,
            )
        )
        if layout.policy.dead_lettering:
            outcomes.append(
                admin.ensure_pull_subscription(
                    layout.dead_letter_subscription,
                    layout.dead_letter_topic,
                    layout.policy.ack_deadline,
                )
            )
        for topic in public_topics():
            outcomes.append(admin.ensure_topic(topic))
            outcomes.append(admin.ensure_pull_subscription(f"{topic}-local", topic))
    print(f"project {layout.project} on emulator {layout.host}")
    # State before details: details are long, and the state is what a re-run changes.
    rows = [(o.resource, o.name, o.state, o.details) for o in outcomes]
    print(format_table(("RESOURCE", "NAME", "STATE", "DETAILS"), rows))


def list_resources(layout: Layout) -> None:
    """Print the project's topics and subscriptions, one per line."""
    from infra.pubsub.resources import Admin, describe_subscription, format_table

    with Admin(layout.host, layout.project) as admin:
        topics = admin.topics()
        subscriptions = admin.subscriptions()
    rows = [("topic", topic, "") for topic in topics]
    rows += [
        ("subscription", s.name.rsplit("/", 1)[-1], describe_subscription(s)) for s in subscriptions
    ]
    if not rows:
        print(f"no topics or subscriptions in project {layout.project}")
        return
    print(format_table(("RESOURCE", "NAME", "DETAILS"), rows))


def _with_layout(action: Callable[[Layout], None]) -> Callable[[list[str]], int]:
    def run(args: list[str]) -> int:
        action(Layout.from_env(os.environ))
        return 0

    return run


def _ping(args: list[str]) -> int:
    return ping(args[0] if args else os.environ.get("PUBSUB_EMULATOR_HOST") or DEFAULT_HOST)


COMMANDS: dict[str, Callable[[list[str]], int]] = {
    "ping": _ping,
    "check": _with_layout(lambda layout: None),
    "ensure": _with_layout(ensure),
    "list": _with_layout(list_resources),
}


def main(argv: list[str]) -> int:
    """Run one command; errors become one line on stderr and a non-zero exit."""
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python -m infra.pubsub {'|'.join(COMMANDS)}", file=sys.stderr)
        return 2
    try:
        return COMMANDS[argv[0]](argv[1:])
    except ConfigError as exc:
        print(f"{PROG}: bad setting: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # one readable line for the shell script, not a traceback
        message = getattr(exc, "message", None) or str(exc)
        first = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
        print(f"{PROG}: {argv[0]} failed: {type(exc).__name__}: {first}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
