"""The pull worker on Google Cloud: ``eventbus worker`` in a Cloud Run worker pool.

``stack.build`` calls ``declare`` when the stack's ``consumer`` is ``pull`` or ``both``. It adds:

* the worker's pull subscription ``<topic>-pull`` on the event topic: the push subscription's
  ack deadline, retry policy, dead-letter policy, retention and no expiry; exactly-once
  delivery when ``pullExactlyOnce`` is set; message ordering when ``pullOrdered`` is;
  with ``pullEventTypes`` (``consumer: both``) a filter that takes those event types,
  while the push subscription takes the rest;
* the Pub/Sub service agent's subscriber role on it, which dead-lettering needs;
* the worker's own service account, with least privilege: consume and read its one
  subscription, publish to the event topic (the cascades' relay), read the MongoDB secret.
  Nothing project-wide, no other subscription, no dead-letter topic;
* the worker pool (no URL, no port): ``python -m eventbus worker`` with the subscription, the
  batch and rate options, the service's environment and ``MONGODB_URI`` from Secret Manager;
* a log-based count of events the worker stored FAILED for good, and alerts on it and on the
  age of the subscription's oldest unacknowledged message.

The config fields it reads are declared in ``stack.DeployConfig`` (``consumer``, ``pull*``,
``worker*``, ``backlogAlertSeconds``); ``config_problems`` holds their rules.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_gcp as gcp

if TYPE_CHECKING:
    from stack import DeployConfig, _Stack

CONSUMERS = ("push", "pull", "both")
#: Event types a filter may name: they are written into the filter between double quotes.
EVENT_TYPE = re.compile(r"[A-Za-z0-9_.:\-]+")
#: Pub/Sub's limit on a subscription filter.
MAX_FILTER_BYTES = 256
WORKER_LOG = (
    'resource.type="cloud_run_worker_pool" AND resource.labels.worker_pool_name="{pool}"'
)
FAILED_FOR_GOOD = (
    ' AND jsonPayload.logType="REQUEST_INBOUND" AND jsonPayload.outcome="rejected"'
    " AND severity>=ERROR"
)
OLDEST_UNACKED = (
    'metric.type="pubsub.googleapis.com/subscription/oldest_unacked_message_age" '
    'AND resource.type="pubsub_subscription" AND resource.label.subscription_id="{name}"'
)


# -- config ------------------------------------------------------------------------------------

def pull_filter(c: DeployConfig) -> str | None:
    """The pull subscription's filter: the event types routed to the worker, or none."""
    if not c.pull_event_types:
        return None
    return " OR ".join(f'attributes.event_type = "{t}"' for t in c.pull_event_types)


def push_filter(c: DeployConfig) -> str | None:
    """The push subscription's filter: the complement of ``pull_filter``, or none.

    Written with ``NOT`` on each comparison, so a message without an ``event_type`` attribute
    (poison) matches it and is pushed, stored FAILED and acked, never acked unread.
    """
    if not c.pull_event_types:
        return None
    return " AND ".join(f'NOT attributes.event_type = "{t}"' for t in c.pull_event_types)


def config_problems(c: DeployConfig) -> list[str]:
    """The rules of the worker's fields; ``stack.config_problems`` adds them to its own."""
    types_ok = all(EVENT_TYPE.fullmatch(t) for t in c.pull_event_types)
    filters = [f for f in (pull_filter(c), push_filter(c)) if f] if types_ok else []
    rules = {
        f"consumer must be one of {CONSUMERS}": c.consumer in CONSUMERS,
        # With one subscription only, a filter would have Pub/Sub ack the other events unread.
        "pullEventTypes needs consumer both": not c.pull_event_types or c.consumer == "both",
        "pullEventTypes: letters, digits and _ . : - only": types_ok,
        f"pullEventTypes: a subscription filter is at most {MAX_FILTER_BYTES} bytes":
            all(len(f.encode()) <= MAX_FILTER_BYTES for f in filters),
        "pullExactlyOnce needs consumer pull or both": not c.pull_exactly_once or c.pull_enabled,
        "pullOrdered needs consumer pull or both": not c.pull_ordered or c.pull_enabled,
        "workerInstances must be >= 0": c.worker_instances >= 0,
        "workerBatchSize must be >= 1": c.worker_batch_size >= 1,
        "workerConcurrency and workerRate must be >= 0 (0: the worker's default, no ceiling)":
            c.worker_concurrency >= 0 and c.worker_rate >= 0,
        "backlogAlertSeconds must be >= 60": c.backlog_alert_seconds >= 60,
    }
    return [rule for rule, holds in rules.items() if not holds]


def worker_args(c: DeployConfig) -> list[str]:
    """``eventbus worker`` and its options, after ``cli`` (``python -m eventbus``)."""
    args = ["worker", "--subscription", c.pull_subscription,
            "--batch-size", str(c.worker_batch_size)]
    if c.worker_concurrency:
        args += ["--concurrency", str(c.worker_concurrency)]
    if c.worker_rate:
        args += ["--rate", f"{c.worker_rate:g}"]
    return [*args, *c.worker_args]


def exports(c: DeployConfig) -> dict[str, Any]:
    """What ``pulumi stack output`` adds for the worker."""
    if not c.pull_enabled:
        return {}
    return {"pullSubscription": c.pull_subscription, "workerPool": c.worker_pool,
            "pullEventTypes": list(c.pull_event_types)}


# -- resources ---------------------------------------------------------------------------------

def declare(stack: _Stack) -> None:
    """Declare the worker's subscription, identity, grants, worker pool and alerts on ``stack``."""
    _Worker(stack).declare()


class _Worker:
    """The worker's resources, added to the stack's own through its helpers."""

    def __init__(self, stack: _Stack) -> None:
        self.s, self.c = stack, stack.c

    def declare(self) -> None:
        self.subscription()
        self.identity()
        self.pool()
        self.alerts()

    def subscription(self) -> None:
        c, s = self.c, self.s
        self.pull = s.add(gcp.pubsub.Subscription(
            "pull-subscription", project=c.project, name=c.pull_subscription,
            topic=s.topic.id, ack_deadline_seconds=c.ack_deadline_seconds,
            message_retention_duration=f"{c.retention_seconds}s",
            expiration_policy=gcp.pubsub.SubscriptionExpirationPolicyArgs(ttl=""),
            # A nack waits the backoff, as a push answered 503 does.
            retry_policy=gcp.pubsub.SubscriptionRetryPolicyArgs(
                minimum_backoff=f"{c.min_backoff_seconds}s",
                maximum_backoff=f"{c.max_backoff_seconds}s"),
            dead_letter_policy=gcp.pubsub.SubscriptionDeadLetterPolicyArgs(
                dead_letter_topic=s.dead_letter.id,
                max_delivery_attempts=c.max_delivery_attempts),
            enable_exactly_once_delivery=c.pull_exactly_once,
            enable_message_ordering=c.pull_ordered,
            filter=pull_filter(c)))
        # Dead-lettering from this subscription: the agent acks what it forwards.
        s.subscription_grant("agent-acks-pull-subscription", self.pull,
                             "roles/pubsub.subscriber", s.pubsub_agent())

    def identity(self) -> None:
        """The worker's account and its four grants, each on one resource."""
        c, s = self.c, self.s
        self.sa = s.account("worker-sa", c.worker_service_account_id,
                            f"{c.service} pull worker")
        member = self.sa.member
        self.grants: list[pulumi.Resource] = [s.add(gcp.secretmanager.SecretIamMember(
            "worker-reads-mongodb-secret", project=c.project, secret_id=c.mongodb_secret_id,
            role="roles/secretmanager.secretAccessor", member=member))]
        s.subscription_grant("worker-pulls-subscription", self.pull,
                             "roles/pubsub.subscriber", member)
        # Read its own subscription's settings (that it exists, exactly-once) at start.
        s.subscription_grant("worker-views-subscription", self.pull, "roles/pubsub.viewer",
                             member)
        s.topic_grant("worker-publishes-events", s.topic, "roles/pubsub.publisher", member)
        self.grants += [s.out[name] for name in (
            "worker-pulls-subscription", "worker-views-subscription", "worker-publishes-events")]

    def envs(self) -> list[gcp.cloudrunv2.WorkerPoolTemplateContainerEnvArgs]:
        c, run = self.c, gcp.cloudrunv2
        plain = {"GOOGLE_CLOUD_PROJECT": c.project, "PUBSUB_TOPIC": c.topic,
                 "EVENTBUS_DEAD_LETTER_TOPIC": c.dead_letter_topic,
                 "EVENTBUS_PULL_SUBSCRIPTION": c.pull_subscription}
        secret = run.WorkerPoolTemplateContainerEnvValueSourceSecretKeyRefArgs(
            secret=c.mongodb_secret_id, version=c.mongodb_secret_version)
        return [*(run.WorkerPoolTemplateContainerEnvArgs(name=k, value=v)
                  for k, v in plain.items()),
                run.WorkerPoolTemplateContainerEnvArgs(
                    name="MONGODB_URI",
                    value_source=run.WorkerPoolTemplateContainerEnvValueSourceArgs(
                        secret_key_ref=secret))]

    def pool(self) -> None:
        """The worker pool: a fixed number of instances (worker pools do not autoscale)."""
        c, run = self.c, gcp.cloudrunv2
        self.s.add(run.WorkerPool(
            "worker-pool", project=c.project, location=c.region, name=c.worker_pool,
            deletion_protection=False,
            scaling=run.WorkerPoolScalingArgs(
                scaling_mode="MANUAL", manual_instance_count=c.worker_instances),
            template=run.WorkerPoolTemplateArgs(
                service_account=self.sa.email,
                containers=[run.WorkerPoolTemplateContainerArgs(
                    image=c.image, commands=list(c.cli), args=worker_args(c),
                    envs=self.envs(),
                    resources=run.WorkerPoolTemplateContainerResourcesArgs(
                        limits={"cpu": c.worker_cpu, "memory": c.worker_memory}))]),
            # Started before its grants, the worker would fail its first pulls.
            opts=pulumi.ResourceOptions(depends_on=self.grants)))

    def alerts(self) -> None:
        """Events the worker failed for good (> 0 in 5 min), and a backlog that grows old."""
        c, s = self.c, self.s
        metric = s.add(gcp.logging.Metric(
            "worker-failed-for-good-metric", project=c.project,
            name=f"{c.worker_pool}-failed-for-good",
            description="Events the pull worker stored FAILED for good (acked, never retried).",
            filter=WORKER_LOG.format(pool=c.worker_pool) + FAILED_FOR_GOOD,
            metric_descriptor=gcp.logging.MetricMetricDescriptorArgs(
                metric_kind="DELTA", value_type="INT64", unit="1")))
        failed = metric.name.apply(lambda name: (
            f'metric.type="logging.googleapis.com/user/{name}" '
            'AND resource.type="cloud_run_worker_pool"'))
        s.alert("alert-worker-failed-for-good", f"{c.worker_pool}: events failed for good",
                s.threshold(failed, "ALIGN_DELTA", 0),
                "The pull worker stored events FAILED for good. List them with `eventbus` "
                "(failed events) and replay them once the cause is fixed.")
        s.alert("alert-worker-backlog", f"{c.worker_pool}: oldest unacked message",
                s.threshold(OLDEST_UNACKED.format(name=c.pull_subscription), "ALIGN_MAX",
                            c.backlog_alert_seconds),
                f"A message on {c.pull_subscription} has waited longer than "
                f"{c.backlog_alert_seconds} s: the worker is stopped, too slow (more "
                "instances, a higher --rate) or nacking one event again and again (its logs).")
