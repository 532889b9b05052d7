"""Idempotent topics, push and pull subscriptions on a Pub/Sub emulator.

``Admin`` talks to one emulator address over a plaintext gRPC channel with no
credentials. It never reads ``PUBSUB_EMULATOR_HOST`` and never falls back to
Google's endpoint, so a mistake here cannot create resources in a real project.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Literal

import grpc
from google.api_core import exceptions as api_exceptions
from google.pubsub_v1 import PublisherClient, SubscriberClient, types
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from infra.pubsub.config import PushPolicy

State = Literal["created", "existed", "updated"]

# Every admin call is bounded: an emulator that hangs must fail the caller, not stall it.
RPC_TIMEOUT = 15.0


class ResourceConflict(RuntimeError):
    """A resource exists with a shape that cannot be changed in place (e.g. another topic)."""


@dataclass(frozen=True)
class Outcome:
    """One row of what ``ensure_*`` did: resource kind, id, details and state."""

    resource: str
    name: str
    details: str
    state: State


class Admin:
    """Publisher and subscriber clients bound to one emulator and one project.

    These are the plain GAPIC clients, not google-cloud-pubsub's batching
    wrappers: every call is one synchronous RPC and no thread is left behind.
    """

    def __init__(self, host: str, project: str) -> None:
        self.host = host
        self.project = project
        self.publisher = PublisherClient(
            transport=PublisherGrpcTransport(channel=grpc.insecure_channel(host))
        )
        self.subscriber = SubscriberClient(
            transport=SubscriberGrpcTransport(channel=grpc.insecure_channel(host))
        )

    def __enter__(self) -> Admin:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close both gRPC channels."""
        self.publisher.transport.close()
        self.subscriber.transport.close()

    def topic_path(self, topic: str) -> str:
        """``projects/<project>/topics/<topic>``."""
        return f"projects/{self.project}/topics/{topic}"

    def subscription_path(self, subscription: str) -> str:
        """``projects/<project>/subscriptions/<subscription>``."""
        return f"projects/{self.project}/subscriptions/{subscription}"

    def ensure_topic(self, topic: str) -> Outcome:
        """Create the topic unless it exists."""
        try:
            self.publisher.create_topic(name=self.topic_path(topic), timeout=RPC_TIMEOUT)
            state: State = "created"
        except api_exceptions.AlreadyExists:
            state = "existed"
        return Outcome("topic", topic, "-", state)

    def ensure_push_subscription(
        self,
        subscription: str,
        topic: str,
        endpoint: str,
        policy: PushPolicy,
        dead_letter_topic: str | None = None,
        no_wrapper: bool = False,
    ) -> Outcome:
        """Create the push subscription, or bring an existing one to this endpoint and policy.

        The push config changes through ``modify_push_config``; ack deadline,
        retry and dead-letter policy through ``update_subscription``. Only the
        topic cannot change: that raises ResourceConflict.
        """
        wanted = self._push_subscription(
            subscription, topic, endpoint, policy, dead_letter_topic, no_wrapper
        )
        details = f"{topic} -> {endpoint}; {policy.describe()}"
        if dead_letter_topic and policy.dead_lettering:
            details += f" to {dead_letter_topic}"
        return self._ensure("push subscription", wanted, details)

    def ensure_pull_subscription(
        self, subscription: str, topic: str, ack_deadline: int = 60
    ) -> Outcome:
        """Create a pull subscription on ``topic`` unless it exists."""
        wanted = types.Subscription(
            name=self.subscription_path(subscription),
            topic=self.topic_path(topic),
            ack_deadline_seconds=ack_deadline,
        )
        details = f"on {topic}; ack {ack_deadline}s"
        current = self._get_subscription(wanted.name)
        if current is None:
            self.subscriber.create_subscription(request=wanted, timeout=RPC_TIMEOUT)
            return Outcome("pull subscription", subscription, details, "created")
        self._check_topic(current, wanted)
        return Outcome("pull subscription", subscription, details, "existed")

    def ensure_worker_subscription(
        self,
        subscription: str,
        topic: str,
        policy: PushPolicy,
        dead_letter_topic: str | None = None,
        ordered: bool = False,
    ) -> Outcome:
        """Create the worker's pull subscription, or bring an existing one to this policy.

        A pull subscription with the push subscription's ack deadline, retry
        policy (a nack waits the backoff, as a push answered 503 does) and
        dead-letter policy, and with ``ordered``, message ordering; a push
        config found on it is removed. Neither the topic nor the ordering can
        change (Pub/Sub fixes both at creation): that raises ResourceConflict.
        """
        wanted = self._push_subscription(
            subscription, topic, "", policy, dead_letter_topic, no_wrapper=False
        )
        wanted.enable_message_ordering = ordered
        current = self._get_subscription(wanted.name)
        if current is not None and current.enable_message_ordering != ordered:
            raise ResourceConflict(
                f"subscription {subscription} exists with message ordering "
                f"{'on' if current.enable_message_ordering else 'off'}; delete it to change it"
            )
        details = f"on {topic}; {policy.describe()}" + ("; ordered" if ordered else "")
        if dead_letter_topic and policy.dead_lettering:
            details += f" to {dead_letter_topic}"
        return self._ensure("pull subscription", wanted, details)

    def delete_subscription(self, subscription: str) -> None:
        """Delete the subscription; a missing one is fine."""
        with contextlib.suppress(api_exceptions.NotFound):
            self.subscriber.delete_subscription(
                subscription=self.subscription_path(subscription), timeout=RPC_TIMEOUT
            )

    def delete_topic(self, topic: str) -> None:
        """Delete the topic; a missing one is fine."""
        with contextlib.suppress(api_exceptions.NotFound):
            self.publisher.delete_topic(topic=self.topic_path(topic), timeout=RPC_TIMEOUT)

    def publish(self, topic: str, data: bytes, attributes: dict[str, str]) -> str:
        """Publish one message and return its message id once the emulator has it."""
        response = self.publisher.publish(
            topic=self.topic_path(topic),
            messages=[types.PubsubMessage(data=data, attributes=attributes)],
            timeout=RPC_TIMEOUT,
        )
        message_id: str = response.message_ids[0]
        return message_id

    def pull(self, subscription: str, max_messages: int = 10) -> list[types.ReceivedMessage]:
        """Pull what is waiting on a pull subscription and ack it."""
        path = self.subscription_path(subscription)
        response = self.subscriber.pull(
            subscription=path, max_messages=max_messages, timeout=RPC_TIMEOUT
        )
        received = list(response.received_messages)
        if received:
            self.subscriber.acknowledge(
                subscription=path, ack_ids=[m.ack_id for m in received], timeout=RPC_TIMEOUT
            )
        return received

    def topics(self) -> list[str]:
        """The project's topic ids, sorted."""
        listed = self.publisher.list_topics(project=f"projects/{self.project}", timeout=RPC_TIMEOUT)
        return sorted(t.name.rsplit("/", 1)[1] for t in listed)

    def subscriptions(self) -> list[types.Subscription]:
        """The project's subscriptions, sorted by name."""
        listed = self.subscriber.list_subscriptions(
            project=f"projects/{self.project}", timeout=RPC_TIMEOUT
        )
        return sorted(listed, key=lambda s: s.name)

    def _push_subscription(
        self,
        subscription: str,
        topic: str,
        endpoint: str,
        policy: PushPolicy,
        dead_letter_topic: str | None,
        no_wrapper: bool,
    ) -> types.Subscription:
        # An empty endpoint makes a pull subscription (an empty push config).
        push_config = types.PushConfig(push_endpoint=endpoint)
        if no_wrapper:
            # write_metadata puts messageId, publishTime, ... into x-goog-* headers.
            push_config.no_wrapper = types.PushConfig.NoWrapper(write_metadata=True)
        wanted = types.Subscription(
            name=self.subscription_path(subscription),
            topic=self.topic_path(topic),
            push_config=push_config,
            ack_deadline_seconds=policy.ack_deadline,
            retry_policy=types.RetryPolicy(
                minimum_backoff=timedelta(seconds=policy.min_backoff),
                maximum_backoff=timedelta(seconds=policy.max_backoff),
            ),
        )
        if policy.dead_lettering:
            if not dead_letter_topic:
                raise ValueError("a dead-letter policy needs a dead_letter_topic")
            wanted.dead_letter_policy = types.DeadLetterPolicy(
                dead_letter_topic=self.topic_path(dead_letter_topic),
                max_delivery_attempts=policy.max_delivery_attempts,
            )
        return wanted

    def _ensure(self, kind: str, wanted: types.Subscription, details: str) -> Outcome:
        """Create ``wanted``, or reconcile the existing subscription of its name with it."""
        subscription = wanted.name.rsplit("/", 1)[-1]
        current = self._get_subscription(wanted.name)
        if current is None:
            self.subscriber.create_subscription(request=wanted, timeout=RPC_TIMEOUT)
            return Outcome(kind, subscription, details, "created")
        self._check_topic(current, wanted)
        changed = self._reconcile(current, wanted)
        if changed:
            return Outcome(kind, subscription, f"{details} (changed: {', '.join(changed)})",
                           "updated")
        return Outcome(kind, subscription, details, "existed")

    def _get_subscription(self, path: str) -> types.Subscription | None:
        try:
            return self.subscriber.get_subscription(subscription=path, timeout=RPC_TIMEOUT)
        except api_exceptions.NotFound:
            return None

    @staticmethod
    def _check_topic(current: types.Subscription, wanted: types.Subscription) -> None:
        if current.topic != wanted.topic:
            raise ResourceConflict(
                f"subscription {wanted.name} exists on {current.topic}, not {wanted.topic}; "
                "delete it or choose another PUBSUB_SUBSCRIPTION"
            )

    def _reconcile(self, current: types.Subscription, wanted: types.Subscription) -> list[str]:
        """Apply what differs between ``current`` and ``wanted``; return the changed fields."""
        changed: list[str] = []
        if current.push_config != wanted.push_config:
            self.subscriber.modify_push_config(
                subscription=wanted.name, push_config=wanted.push_config, timeout=RPC_TIMEOUT
            )
            changed.append("push_config")
        fields = [
            name
            for name in ("ack_deadline_seconds", "retry_policy", "dead_letter_policy")
            if getattr(current, name) != getattr(wanted, name)
        ]
        if fields:
            self.subscriber.update_subscription(
                request={"subscription": wanted, "update_mask": {"paths": fields}},
                timeout=RPC_TIMEOUT,
            )
            changed.extend(fields)
        return changed


def describe_subscription(subscription: types.Subscription) -> str:
    """One line: kind, topic, endpoint and policies, as ``list`` prints it."""
    topic = subscription.topic.rsplit("/", 1)[-1]
    endpoint = subscription.push_config.push_endpoint
    parts = [f"push {topic} -> {endpoint}" if endpoint else f"pull on {topic}"]
    if endpoint and "no_wrapper" in subscription.push_config:
        parts.append("unwrapped")
    parts.append(f"ack {subscription.ack_deadline_seconds}s")
    if "retry_policy" in subscription:
        retry = subscription.retry_policy
        low = retry.minimum_backoff.total_seconds()
        high = retry.maximum_backoff.total_seconds()
        parts.append(f"backoff {low:g}s..{high:g}s")
    if "dead_letter_policy" in subscription:
        dead = subscription.dead_letter_policy
        dead_topic = dead.dead_letter_topic.rsplit("/", 1)[-1]
        parts.append(f"dead letter after {dead.max_delivery_attempts} attempts to {dead_topic}")
    return "; ".join(parts)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces."""
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in (headers, *rows)
    ]
    return "\n".join(lines)
