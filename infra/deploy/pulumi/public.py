"""Public topics on Google Cloud: each with its schema, its consumers' subscriptions and grants.

The app declares which events it forwards to which public topic under which contract
(``Router.forward``); ``eventbus contracts write`` puts the result in ``docs/contracts/``:
``topics.json`` (topic -> contract, versions, schema file, message) and one ``.proto`` per
topic. ``stack.build`` calls ``declare``, which reads that manifest (``publicContracts``,
default the repository's ``docs/contracts``) and adds, per public topic:

* a Pub/Sub schema (Protocol Buffers) with the topic's ``.proto`` as its definition. A new
  contract version changes the definition, which the provider applies to the same schema;
* the topic, validating every message against that schema (JSON encoding);
* ``roles/pubsub.publisher`` on it for the identities that run the relay: the service's and
  jobs' account, and the pull worker's when there is one;
* per consumer declared in ``publicConsumers`` (``NAME:TOPIC:VERSION:MEMBER``, ``VERSION`` ``*``
  for every version): a subscription ``<topic>-<name>`` on the public topic, filtered on
  ``attributes.contract_version`` when a version is named, and ``roles/pubsub.subscriber`` on
  that one subscription for ``MEMBER``. Nothing on the event bus topic, nothing project-wide:
  a consumer reads its own subscription and nothing else.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pulumi_gcp as gcp

if TYPE_CHECKING:
    from stack import DeployConfig, _Stack

DEFAULT_CONTRACTS = Path(__file__).resolve().parents[3] / "docs" / "contracts"
NAME = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
VERSION = re.compile(r"^(\*|v[1-9][0-9]{0,3})$")
MEMBER = re.compile(r"^(serviceAccount|group|user|domain|principal|principalSet):\S+$")


@dataclass(frozen=True)
class Consumer:
    """One consuming service: its name, the topic, the version it reads (or ``*``), who it is."""

    name: str
    topic: str
    version: str
    member: str

    @property
    def subscription(self) -> str:
        """The consumer's own subscription on the public topic."""
        return f"{self.topic}-{self.name}"

    @property
    def filter(self) -> str | None:
        """Only its contract version, when it named one."""
        return None if self.version == "*" else \
            f'attributes.contract_version = "{self.version}"'


def contracts_dir(c: DeployConfig) -> Path:
    """Where the contract files are: ``publicContracts``, else the repository's."""
    return Path(c.public_contracts) if c.public_contracts else DEFAULT_CONTRACTS


def manifest(c: DeployConfig) -> dict[str, Any]:
    """``topics.json``'s topics: name -> contract, versions, schema file; {} without one."""
    try:
        text = (contracts_dir(c) / "topics.json").read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    topics: dict[str, Any] = json.loads(text).get("topics", {})
    return topics


def consumers(c: DeployConfig) -> list[Consumer]:
    """The ``publicConsumers`` entries, parsed (``config_problems`` says which are bad)."""
    parsed = []
    for item in c.public_consumers:
        parts = item.split(":", 3)
        if len(parts) == 4:
            parsed.append(Consumer(*parts))
    return parsed


def config_problems(c: DeployConfig) -> list[str]:
    """Every rule the public-topic settings break."""
    topics, problems = manifest(c), []
    if c.public_contracts and not (contracts_dir(c) / "topics.json").exists():
        problems.append(f"publicContracts: no topics.json in {c.public_contracts}")
    for item in c.public_consumers:
        if len(item.split(":", 3)) != 4:
            problems.append(f"publicConsumers: {item!r} is not NAME:TOPIC:VERSION:MEMBER")
    for consumer in consumers(c):
        problems += _consumer_problems(consumer, topics)
    return problems


def _consumer_problems(consumer: Consumer, topics: dict[str, Any]) -> list[str]:
    where = f"publicConsumers {consumer.name}"
    served = topics.get(consumer.topic, {}).get("versions", [])
    rules = {
        f"{where}: the name is lowercase letters, digits and '-'": NAME.match(consumer.name),
        f"{where}: {consumer.topic!r} is not a public topic of the app": consumer.topic in topics,
        f"{where}: version {consumer.version!r} is not served":
            VERSION.match(consumer.version) and consumer.version in ("*", *served),
        f"{where}: the member is serviceAccount:, group:, user:, domain: or principal:...":
            MEMBER.match(consumer.member),
    }
    return [rule for rule, holds in rules.items() if not holds]


def declare(stack: _Stack) -> None:
    """Declare every public topic, its schema, its publishers and its consumers on ``stack``."""
    c = stack.c
    for topic, spec in manifest(c).items():
        definition = (contracts_dir(c) / spec["schema"]).read_text(encoding="utf-8")
        schema = stack.add(gcp.pubsub.Schema(
            f"public-schema-{topic}", project=c.project, name=f"{topic}-schema",
            type="PROTOCOL_BUFFER", definition=definition))
        public = stack.add(gcp.pubsub.Topic(
            f"public-topic-{topic}", project=c.project, name=topic,
            message_retention_duration=f"{c.retention_seconds}s",
            schema_settings=gcp.pubsub.TopicSchemaSettingsArgs(schema=schema.id,
                                                               encoding="JSON")))
        stack.topic_grant(f"runtime-publishes-{topic}", public, "roles/pubsub.publisher",
                          stack.runtime_sa.member)
        worker = stack.out.get("worker-sa")
        if worker is not None:
            stack.topic_grant(f"worker-publishes-{topic}", public, "roles/pubsub.publisher",
                              worker.member)
        for consumer in (k for k in consumers(c) if k.topic == topic):
            _consumer(stack, public, consumer)


def _consumer(stack: _Stack, public: gcp.pubsub.Topic, consumer: Consumer) -> None:
    c = stack.c
    subscription = stack.add(gcp.pubsub.Subscription(
        f"public-{consumer.subscription}", project=c.project, name=consumer.subscription,
        topic=public.id, ack_deadline_seconds=c.ack_deadline_seconds,
        message_retention_duration=f"{c.retention_seconds}s",
        expiration_policy=gcp.pubsub.SubscriptionExpirationPolicyArgs(ttl=""),
        filter=consumer.filter))
    stack.subscription_grant(f"{consumer.name}-reads-{consumer.subscription}", subscription,
                             "roles/pubsub.subscriber", consumer.member)
