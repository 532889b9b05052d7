"""The partner event bus on Google Cloud, declared by one pure function of a ``DeployConfig``.

``build(config)`` declares every resource and returns them by logical name. ``__main__``
reads the stack configuration and calls it; ``tests/deploy`` calls it under Pulumi's mocks.

What it wires (see ``infra/deploy/README.md``):

* the event topic, a dead-letter topic and a pull subscription that keeps the dead letters;
* the push subscription: OIDC-signed pushes, retry backoff, dead-letter policy;
* the Pub/Sub service agent's grants that dead-lettering and OIDC signing need;
* the handler, as a Cloud Run service or a Cloud Functions (gen2) function, authenticated,
  with ``MONGODB_URI`` read from Secret Manager;
* Cloud Run jobs for the outbox relay, the store-driven redrive and the dead-letter drain,
  each run by Cloud Scheduler;
* a log-based metric of events failed for good, and alerts on it, on the 5xx rate, on the
  push subscription's oldest unacked message and on its delivery-latency health score;
* an alert when dead letters wait on the dead-letter subscription (every consumer);
* an alert when a partner's breaker stays open past ``breakerAlertSeconds`` (the
  ``eventbus.partner.open_for`` gauge, exported with ``EVENTBUS_METRICS_EXPORTER=otlp``);
* with ``consumer`` ``pull`` or ``both``, the pull worker beside or instead of the push
  handler: its subscription, identity, worker pool and alerts (``worker.py``);
* the app's public topics with their schemas, and each declared consumer's own
  subscription and grant (``public.py``);
* with ``archive`` on, the archive past retention: a bucket of Avro files written by a Cloud
  Storage subscription, a BigQuery table written by a BigQuery subscription, and the Pub/Sub
  service agent's grants on them (``archive.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any, TypeVar

import archive
import public
import pulumi
import pulumi_gcp as gcp
import worker

Resources = dict[str, pulumi.CustomResource]
R = TypeVar("R", bound=pulumi.CustomResource)

TARGETS = ("run", "function")
#: ``ingress`` setting -> (Cloud Run ingress, Cloud Functions ingress). Pub/Sub push and Cloud
#: Scheduler of the same project count as internal traffic.
INGRESS = {
    "internal": ("INGRESS_TRAFFIC_INTERNAL_ONLY", "ALLOW_INTERNAL_ONLY"),
    "all": ("INGRESS_TRAFFIC_ALL", "ALLOW_ALL"),
}
PUBSUB_AGENT = "serviceAccount:service-{number}@gcp-sa-pubsub.iam.gserviceaccount.com"
RUN_JOB_API = "https://run.googleapis.com/v2/projects/{project}/locations/{region}/jobs/{job}:run"
CLOUD_PLATFORM_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
FAILED_FOR_GOOD_LOG = (
    'resource.type="cloud_run_revision" AND resource.labels.service_name="{service}" '
    'AND jsonPayload.logType="REQUEST_INBOUND" AND jsonPayload.outcome="rejected" '
    "AND severity>=ERROR"
)
BREAKER_OPEN_FOR = 'metric.type="{metric}"'
PUBSUB_SUBSCRIPTION = (
    'resource.type="pubsub_subscription" AND resource.label.subscription_id="{name}"'
)
#: Messages kept on a subscription, not yet acked (GAUGE, INT64).
UNDELIVERED = ('metric.type="pubsub.googleapis.com/subscription/num_undelivered_messages" AND '
               + PUBSUB_SUBSCRIPTION)
#: Pub/Sub's own verdict on a subscription over a 10-minute rolling window (GAUGE, BOOL): one
#: series per ``criteria`` (ack_latency, expired_ack_deadlines, nack_requests, seek_requests,
#: utilization), true while that criterion is healthy.
HEALTH_SCORE = ('metric.type="pubsub.googleapis.com/subscription/delivery_latency_health_score"'
                ' AND ' + PUBSUB_SUBSCRIPTION)
FIVE_XX = (
    'metric.type="run.googleapis.com/request_count" AND resource.type="cloud_run_revision" '
    'AND resource.label.service_name="{service}" AND metric.label.response_code_class="5xx"'
)


@dataclass(frozen=True)
class DeployConfig:
    """Everything that differs between deployments.

    The defaults follow ``gunicorn.conf.py`` (2 workers x 4 threads) and the Pub/Sub facts of
    DESIGN.md (ack deadline 60 s, backoff 10..600 s, 100 delivery attempts, 7 days' retention).
    """

    project: str
    region: str
    image: str
    target: str = "run"
    service: str = "partner-eventbus"
    topic: str = "partner-events"
    push_service_account_id: str = "pubsub-push"
    runtime_service_account_id: str = "eventbus-runtime"
    scheduler_service_account_id: str = "eventbus-scheduler"
    mongodb_secret_id: str = "mongodb-uri"
    mongodb_secret_version: str = "latest"
    min_instances: int = 0
    max_instances: int = 10
    workers: int = 2
    threads: int = 4
    request_timeout_seconds: int = 120
    ack_deadline_seconds: int = 60
    min_backoff_seconds: int = 10
    max_backoff_seconds: int = 600
    max_delivery_attempts: int = 100
    retention_seconds: int = 7 * 24 * 3600
    audience: str = ""
    ingress: str = "internal"
    notification_channels: tuple[str, ...] = ()
    relay_schedule: str = "*/5 * * * *"
    redrive_schedule: str = "*/10 * * * *"
    drain_schedule: str = "*/15 * * * *"
    time_zone: str = "Etc/UTC"
    error_rate_threshold: float = 0.5
    function_source: str = ""
    cli: tuple[str, ...] = ("python", "-m", "eventbus")
    # The pull worker (worker.py): push, pull or both; see infra/deploy/README.md.
    consumer: str = "push"
    pull_event_types: tuple[str, ...] = ()
    pull_exactly_once: bool = False
    pull_ordered: bool = False
    """Message ordering on the worker's subscription: per-ordering-key serial delivery."""
    worker_service_account_id: str = "eventbus-worker"
    worker_instances: int = 1
    worker_cpu: str = "1"
    worker_memory: str = "1Gi"
    worker_batch_size: int = 100
    worker_concurrency: int = 0
    worker_rate: float = 0.0
    worker_args: tuple[str, ...] = ()
    backlog_alert_seconds: int = 3600
    # Partner breakers: the gauge as Cloud Monitoring names it (OTLP metrics land under
    # workload.googleapis.com/), and how long one may stay open before someone is told.
    breaker_metric: str = "workload.googleapis.com/eventbus.partner.open_for"
    breaker_alert_seconds: int = 1800
    # Pub/Sub's own alerts: dead letters waiting above this many (0: any) fire
    # alert-dead-letters; the push subscription's health score, as the fraction of 5 min in
    # which a criterion was healthy, below this fires alert-delivery-health (1: any dip).
    dead_letter_alert_messages: int = 0
    delivery_health_threshold: float = 1.0
    # Public topics (public.py): the contract files, and who consumes which topic.
    public_contracts: str = ""
    public_consumers: tuple[str, ...] = ()
    # The archive past retention (archive.py): opt-in; a bucket, and BigQuery unless turned off.
    archive: bool = False
    archive_days: int = 365
    """Days an archived message is kept: the bucket's lifecycle rule, the table's partitions."""
    archive_bucket: str = ""
    archive_location: str = ""
    archive_file_seconds: int = 300
    archive_bigquery: bool = True
    archive_dataset: str = ""

    def __post_init__(self) -> None:
        problems = config_problems(self)
        if problems:
            raise ValueError("bad deploy config: " + "; ".join(problems))

    @property
    def concurrency(self) -> int:
        """Requests one instance takes at once: gunicorn workers x threads."""
        return self.workers * self.threads

    @property
    def dead_letter_topic(self) -> str:
        """The dead-letter topic's name (the emulator script uses the same)."""
        return f"{self.topic}-dlq"

    @property
    def dead_letter_subscription(self) -> str:
        """The pull subscription that keeps dead letters until the drain stores them."""
        return f"{self.topic}-dlq-pull"

    @property
    def push_subscription(self) -> str:
        """The push subscription's name."""
        return f"{self.topic}-push"

    @property
    def push_audience(self) -> str:
        """The OIDC audience: known before the service exists, so the service can check it.

        Cloud Run: a custom audience the service accepts (``custom_audiences``). Functions:
        the function's fixed ``cloudfunctions.net`` URL, which is also where pushes go.
        """
        if self.audience:
            return self.audience
        if self.target == "function":
            return f"https://{self.region}-{self.project}.cloudfunctions.net/{self.service}"
        return f"https://pubsub-push/{self.project}/{self.region}/{self.service}"

    @property
    def push_enabled(self) -> bool:
        """True when the push handler (service or function) and its subscription are deployed."""
        return self.consumer in ("push", "both")

    @property
    def pull_enabled(self) -> bool:
        """True when the pull worker and its subscription are deployed."""
        return self.consumer in ("pull", "both")

    @property
    def pull_subscription(self) -> str:
        """The worker's pull subscription (the emulator script makes the same one)."""
        return f"{self.topic}-pull"

    @property
    def worker_pool(self) -> str:
        """The Cloud Run worker pool's name."""
        return f"{self.service}-worker"

    @property
    def jobs(self) -> tuple[JobSpec, ...]:
        """The scheduled Cloud Run jobs: outbox relay, store-driven redrive, dead-letter drain."""
        return (
            JobSpec("relay", ("relay", "--once"), self.relay_schedule),
            JobSpec("redrive", ("redrive", "--once"), self.redrive_schedule),
            JobSpec("dlq-drain", ("dlq", "drain"), self.drain_schedule),
        )


@dataclass(frozen=True)
class JobSpec:
    """One scheduled job: a name suffix, the ``eventbus`` arguments and a cron schedule."""

    name: str
    args: tuple[str, ...]
    schedule: str


def config_problems(c: DeployConfig) -> list[str]:
    """Every rule a config breaks; empty when the config can be deployed."""
    rules = {
        f"target must be one of {TARGETS}": c.target in TARGETS,
        "project, region and image are required": all((c.project, c.region, c.image)),
        f"ingress must be one of {tuple(INGRESS)}": c.ingress in INGRESS,
        "maxDeliveryAttempts must be 5..100": 5 <= c.max_delivery_attempts <= 100,
        "backoff must be 0 <= min <= max <= 600 s":
            0 <= c.min_backoff_seconds <= c.max_backoff_seconds <= 600,
        "ackDeadlineSeconds must be 10..600": 10 <= c.ack_deadline_seconds <= 600,
        "requestTimeoutSeconds must cover the ack deadline":
            c.request_timeout_seconds >= c.ack_deadline_seconds,
        "retention must be 10 min..31 days": 600 <= c.retention_seconds <= 31 * 86400,
        "workers and threads must be >= 1": min(c.workers, c.threads) >= 1,
        "need 0 <= minInstances <= maxInstances, maxInstances >= 1":
            0 <= c.min_instances <= c.max_instances and c.max_instances >= 1,
        "target function needs functionSource (a zip of the source)":
            c.target != "function" or bool(c.function_source),
        "breakerAlertSeconds must be >= 60": c.breaker_alert_seconds >= 60,
        "deadLetterAlertMessages must be >= 0": c.dead_letter_alert_messages >= 0,
        "deliveryHealthThreshold must be in (0, 1]": 0 < c.delivery_health_threshold <= 1,
    }
    return [rule for rule, holds in rules.items() if not holds] + worker.config_problems(c) + \
        public.config_problems(c) + archive.config_problems(c)


def camel(name: str) -> str:
    """The Pulumi config key of a field: ``max_instances`` -> ``maxInstances``."""
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _parse(field: dataclasses.Field[Any], raw: str) -> Any:
    default = field.default
    if isinstance(default, bool):  # before int: bool("false") would be True
        return _boolean(field.name, raw)
    if isinstance(default, tuple):
        return tuple(item.strip() for item in raw.split(",") if item.strip())
    if isinstance(default, int | float):
        return type(default)(raw)
    return raw


def _boolean(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ValueError(f"bad deploy config: {camel(name)} must be true or false, not {raw!r}")
    return value == "true"


def from_getter(get: Callable[[str], str | None]) -> DeployConfig:
    """A ``DeployConfig`` from string settings keyed by camelCase field name (Pulumi config)."""
    values = {}
    for field in dataclasses.fields(DeployConfig):
        raw = get(camel(field.name))
        if raw not in (None, ""):
            values[field.name] = _parse(field, str(raw))
    return DeployConfig(**values)


def build(config: DeployConfig) -> Resources:
    """Declare the whole deployment; returns every resource by its Pulumi logical name."""
    return _Stack(config).build()


class _Stack:
    """Declares the resources of one config in dependency order and keeps them by name."""

    def __init__(self, config: DeployConfig) -> None:
        self.c = config
        self.out: Resources = {}

    def add(self, resource: R) -> R:
        self.out[resource.pulumi_resource_name] = resource
        return resource

    def build(self) -> Resources:
        self.accounts()
        self.messaging()
        self.runtime_grants()
        if self.c.push_enabled:
            endpoint = self.service() if self.c.target == "run" else self.function()
            self.push_subscription(endpoint)
        self.agent_grants()
        if self.c.pull_enabled:
            worker.declare(self)
        public.declare(self)  # after the worker: its account publishes forwards too
        if self.c.archive:
            archive.declare(self)
        for spec in self.c.jobs:
            self.scheduled_job(spec)
        if self.c.push_enabled:
            self.alerts()
        self.breaker_alert()
        self.dead_letter_alert()
        return self.out

    # -- identities and messaging -------------------------------------------------------

    def account(self, name: str, account_id: str, title: str) -> gcp.serviceaccount.Account:
        return self.add(gcp.serviceaccount.Account(
            name, project=self.c.project, account_id=account_id, display_name=title))

    def accounts(self) -> None:
        c = self.c
        if c.push_enabled:
            self.push_sa = self.account(
                "push-sa", c.push_service_account_id, f"Pub/Sub push to {c.service}")
        self.runtime_sa = self.account(
            "runtime-sa", c.runtime_service_account_id, f"{c.service} service and jobs")
        self.scheduler_sa = self.account(
            "scheduler-sa", c.scheduler_service_account_id, f"Cloud Scheduler for {c.service}")

    def messaging(self) -> None:
        c = self.c
        self.topic = self.add(gcp.pubsub.Topic("topic", project=c.project, name=c.topic))
        self.dead_letter = self.add(gcp.pubsub.Topic(
            "dead-letter-topic", project=c.project, name=c.dead_letter_topic))
        # A topic with no subscription keeps nothing: this one keeps the dead letters.
        self.dead_letter_pull = self.add(gcp.pubsub.Subscription(
            "dead-letter-pull", project=c.project, name=c.dead_letter_subscription,
            topic=self.dead_letter.id, ack_deadline_seconds=c.ack_deadline_seconds,
            message_retention_duration=f"{c.retention_seconds}s",
            expiration_policy=gcp.pubsub.SubscriptionExpirationPolicyArgs(ttl="")))

    def push_subscription(self, endpoint: pulumi.Output[str]) -> None:
        c = self.c
        self.push = self.add(gcp.pubsub.Subscription(
            "push-subscription", project=c.project, name=c.push_subscription,
            topic=self.topic.id, ack_deadline_seconds=c.ack_deadline_seconds,
            message_retention_duration=f"{c.retention_seconds}s",
            expiration_policy=gcp.pubsub.SubscriptionExpirationPolicyArgs(ttl=""),
            push_config=gcp.pubsub.SubscriptionPushConfigArgs(
                push_endpoint=endpoint,
                oidc_token=gcp.pubsub.SubscriptionPushConfigOidcTokenArgs(
                    service_account_email=self.push_sa.email, audience=c.push_audience)),
            retry_policy=gcp.pubsub.SubscriptionRetryPolicyArgs(
                minimum_backoff=f"{c.min_backoff_seconds}s",
                maximum_backoff=f"{c.max_backoff_seconds}s"),
            dead_letter_policy=gcp.pubsub.SubscriptionDeadLetterPolicyArgs(
                dead_letter_topic=self.dead_letter.id,
                max_delivery_attempts=c.max_delivery_attempts),
            # With consumer both and pullEventTypes: every event the worker does not take.
            filter=worker.push_filter(c)))

    # -- grants ---------------------------------------------------------------------------

    def pubsub_agent(self) -> pulumi.Output[str]:
        """``serviceAccount:service-PROJECT_NUMBER@gcp-sa-pubsub.iam.gserviceaccount.com``."""
        project = gcp.organizations.get_project_output(project_id=self.c.project)
        return project.number.apply(lambda number: PUBSUB_AGENT.format(number=number))

    def topic_grant(self, name: str, topic: gcp.pubsub.Topic, role: str,
                    member: pulumi.Input[str]) -> None:
        self.add(gcp.pubsub.TopicIAMMember(
            name, project=self.c.project, topic=topic.name, role=role, member=member))

    def subscription_grant(self, name: str, subscription: gcp.pubsub.Subscription, role: str,
                           member: pulumi.Input[str]) -> None:
        self.add(gcp.pubsub.SubscriptionIAMMember(
            name, project=self.c.project, subscription=subscription.name, role=role,
            member=member))

    def agent_grants(self) -> None:
        """What Pub/Sub itself needs to dead-letter messages and to sign push tokens."""
        agent = self.pubsub_agent()
        self.topic_grant("agent-publishes-dead-letters", self.dead_letter,
                         "roles/pubsub.publisher", agent)
        if not self.c.push_enabled:
            return
        self.subscription_grant("agent-acks-push-subscription", self.push,
                                "roles/pubsub.subscriber", agent)
        self.add(gcp.serviceaccount.IAMMember(
            "agent-signs-push-tokens", service_account_id=self.push_sa.name,
            role="roles/iam.serviceAccountTokenCreator", member=agent))

    def runtime_grants(self) -> None:
        """The service's and jobs' identity: read the secret, publish, drain dead letters."""
        c, member = self.c, self.runtime_sa.member
        self.secret_grant = self.add(gcp.secretmanager.SecretIamMember(
            "runtime-reads-mongodb-secret", project=c.project, secret_id=c.mongodb_secret_id,
            role="roles/secretmanager.secretAccessor", member=member))
        self.topic_grant("runtime-publishes-events", self.topic, "roles/pubsub.publisher", member)
        self.topic_grant("runtime-publishes-dead-letters", self.dead_letter,
                         "roles/pubsub.publisher", member)
        self.subscription_grant("runtime-drains-dead-letters", self.dead_letter_pull,
                                "roles/pubsub.subscriber", member)

    # -- the handler -------------------------------------------------------------------------

    def env(self) -> dict[str, pulumi.Input[str]]:
        """Plain environment of the service, the function and the jobs (no secrets here)."""
        c = self.c
        env: dict[str, pulumi.Input[str]] = {
            "GOOGLE_CLOUD_PROJECT": c.project,
            "PUBSUB_TOPIC": c.topic,
            "EVENTBUS_DEAD_LETTER_TOPIC": c.dead_letter_topic,
            "PUBSUB_DEAD_LETTER_SUBSCRIPTION": c.dead_letter_subscription,
        }
        if not c.push_enabled:  # pull only: the jobs need none of the push handler's settings
            return env
        return {
            **env,
            "EVENTBUS_AUTH": "true",
            "EVENTBUS_AUTH_SERVICE_ACCOUNTS": self.push_sa.email,
            "EVENTBUS_AUTH_AUDIENCE": c.push_audience,
            "WEB_CONCURRENCY": str(c.workers),
            "GUNICORN_THREADS": str(c.threads),
            "GUNICORN_TIMEOUT": str(c.request_timeout_seconds),
        }

    def service_envs(self) -> list[gcp.cloudrunv2.ServiceTemplateContainerEnvArgs]:
        run = gcp.cloudrunv2
        secret = run.ServiceTemplateContainerEnvValueSourceSecretKeyRefArgs(
            secret=self.c.mongodb_secret_id, version=self.c.mongodb_secret_version)
        return [*(run.ServiceTemplateContainerEnvArgs(name=k, value=v)
                  for k, v in self.env().items()),
                run.ServiceTemplateContainerEnvArgs(
                    name="MONGODB_URI",
                    value_source=run.ServiceTemplateContainerEnvValueSourceArgs(
                        secret_key_ref=secret))]

    def service(self) -> pulumi.Output[str]:
        """The Cloud Run service; returns the push endpoint."""
        c, run = self.c, gcp.cloudrunv2
        service = self.add(run.Service(
            "service", project=c.project, location=c.region, name=c.service,
            ingress=INGRESS[c.ingress][0], custom_audiences=[c.push_audience],
            deletion_protection=False,
            template=run.ServiceTemplateArgs(
                service_account=self.runtime_sa.email,
                max_instance_request_concurrency=c.concurrency,
                timeout=f"{c.request_timeout_seconds}s",
                scaling=run.ServiceTemplateScalingArgs(
                    min_instance_count=c.min_instances, max_instance_count=c.max_instances),
                containers=[run.ServiceTemplateContainerArgs(
                    image=c.image, envs=self.service_envs())]),
            opts=pulumi.ResourceOptions(depends_on=[self.secret_grant])))
        self.add(run.ServiceIamMember(
            "push-invokes-service", project=c.project, location=c.region, name=service.name,
            role="roles/run.invoker", member=self.push_sa.member))
        return service.uri.apply(lambda uri: uri.rstrip("/") + "/")

    def function_source(self) -> gcp.cloudfunctionsv2.FunctionBuildConfigSourceArgs:
        c = self.c
        bucket = self.add(gcp.storage.Bucket(
            "function-source-bucket", project=c.project, location=c.region,
            name=f"{c.project}-{c.service}-source", uniform_bucket_level_access=True,
            force_destroy=True))
        archive = self.add(gcp.storage.BucketObject(
            "function-source", bucket=bucket.name, name=PurePath(c.function_source).name,
            source=pulumi.FileAsset(c.function_source)))
        return gcp.cloudfunctionsv2.FunctionBuildConfigSourceArgs(
            storage_source=gcp.cloudfunctionsv2.FunctionBuildConfigSourceStorageSourceArgs(
                bucket=bucket.name, object=archive.name))

    def function_service_config(self) -> gcp.cloudfunctionsv2.FunctionServiceConfigArgs:
        c, fn = self.c, gcp.cloudfunctionsv2
        # functions-framework runs gunicorn itself and reads WORKERS and THREADS.
        env = {**self.env(), "WORKERS": str(c.workers), "THREADS": str(c.threads)}
        return fn.FunctionServiceConfigArgs(
            service_account_email=self.runtime_sa.email, environment_variables=env,
            secret_environment_variables=[fn.FunctionServiceConfigSecretEnvironmentVariableArgs(
                key="MONGODB_URI", project_id=c.project, secret=c.mongodb_secret_id,
                version=c.mongodb_secret_version)],
            max_instance_request_concurrency=c.concurrency, available_cpu="1",
            available_memory="1Gi", min_instance_count=c.min_instances,
            max_instance_count=c.max_instances, timeout_seconds=c.request_timeout_seconds,
            ingress_settings=INGRESS[c.ingress][1], all_traffic_on_latest_revision=True)

    def function(self) -> pulumi.Output[str]:
        """The Cloud Functions (gen2) function; returns the push endpoint."""
        c, fn = self.c, gcp.cloudfunctionsv2
        function = self.add(fn.Function(
            "function", project=c.project, location=c.region, name=c.service,
            build_config=fn.FunctionBuildConfigArgs(
                runtime="python311", entry_point="pubsub_push", source=self.function_source()),
            service_config=self.function_service_config(),
            opts=pulumi.ResourceOptions(depends_on=[self.secret_grant])))
        self.add(fn.FunctionIamMember(
            "push-invokes-function", project=c.project, location=c.region,
            cloud_function=function.name, role="roles/cloudfunctions.invoker",
            member=self.push_sa.member))
        # A gen2 function is served by a Cloud Run service of the same name: that checks tokens.
        self.add(gcp.cloudrunv2.ServiceIamMember(
            "push-invokes-function-service", project=c.project, location=c.region,
            name=function.name, role="roles/run.invoker", member=self.push_sa.member))
        return function.url

    # -- scheduled jobs ----------------------------------------------------------------------

    def job_envs(self) -> list[gcp.cloudrunv2.JobTemplateTemplateContainerEnvArgs]:
        run = gcp.cloudrunv2
        secret = run.JobTemplateTemplateContainerEnvValueSourceSecretKeyRefArgs(
            secret=self.c.mongodb_secret_id, version=self.c.mongodb_secret_version)
        return [*(run.JobTemplateTemplateContainerEnvArgs(name=k, value=v)
                  for k, v in self.env().items()),
                run.JobTemplateTemplateContainerEnvArgs(
                    name="MONGODB_URI",
                    value_source=run.JobTemplateTemplateContainerEnvValueSourceArgs(
                        secret_key_ref=secret))]

    def job(self, spec: JobSpec) -> gcp.cloudrunv2.Job:
        c, run = self.c, gcp.cloudrunv2
        return self.add(run.Job(
            f"job-{spec.name}", project=c.project, location=c.region,
            name=f"{c.service}-{spec.name}", deletion_protection=False,
            template=run.JobTemplateArgs(task_count=1, template=run.JobTemplateTemplateArgs(
                service_account=self.runtime_sa.email, max_retries=1, timeout="600s",
                containers=[run.JobTemplateTemplateContainerArgs(
                    image=c.image, commands=list(c.cli), args=list(spec.args),
                    envs=self.job_envs())])),
            opts=pulumi.ResourceOptions(depends_on=[self.secret_grant])))

    def scheduled_job(self, spec: JobSpec) -> None:
        """A Cloud Run job, its Cloud Scheduler trigger, and the scheduler's right to run it."""
        c, job = self.c, self.job(spec)
        self.add(gcp.cloudrunv2.JobIamMember(
            f"scheduler-runs-{spec.name}", project=c.project, location=c.region, name=job.name,
            role="roles/run.invoker", member=self.scheduler_sa.member))
        uri = job.name.apply(
            lambda name: RUN_JOB_API.format(project=c.project, region=c.region, job=name))
        self.add(gcp.cloudscheduler.Job(
            f"schedule-{spec.name}", project=c.project, region=c.region,
            name=f"{c.service}-{spec.name}", schedule=spec.schedule, time_zone=c.time_zone,
            attempt_deadline="180s",
            http_target=gcp.cloudscheduler.JobHttpTargetArgs(
                http_method="POST", uri=uri,
                oauth_token=gcp.cloudscheduler.JobHttpTargetOauthTokenArgs(
                    service_account_email=self.scheduler_sa.email,
                    scope=CLOUD_PLATFORM_SCOPE))))

    # -- alerts ---------------------------------------------------------------------------------

    def threshold(self, filter_: pulumi.Input[str], aligner: str, value: float, *,
                  comparison: str = "COMPARISON_GT", reducer: str = "REDUCE_SUM",
                  group_by: list[str] | None = None,
                  ) -> gcp.monitoring.AlertPolicyConditionConditionThresholdArgs:
        """Fires when the 5-min aligned, reduced series compares to ``value`` (above by default)."""
        extra = {"group_by_fields": group_by} if group_by else {}
        return gcp.monitoring.AlertPolicyConditionConditionThresholdArgs(
            filter=filter_, comparison=comparison, threshold_value=value, duration="0s",
            aggregations=[gcp.monitoring.AlertPolicyConditionConditionThresholdAggregationArgs(
                alignment_period="300s", per_series_aligner=aligner,
                cross_series_reducer=reducer, **extra)])

    def alert(self, name: str, title: str,
              condition: gcp.monitoring.AlertPolicyConditionConditionThresholdArgs,
              doc: str) -> None:
        self.add(gcp.monitoring.AlertPolicy(
            name, project=self.c.project, display_name=title, combiner="OR",
            notification_channels=list(self.c.notification_channels),
            conditions=[gcp.monitoring.AlertPolicyConditionArgs(
                display_name=title, condition_threshold=condition)],
            documentation=gcp.monitoring.AlertPolicyDocumentationArgs(
                content=doc, mime_type="text/markdown")))

    def alerts(self) -> None:
        """The push handler's: events failed for good (> 0 in 5 min), its 5xx rate, and its
        subscription's oldest unacked message and delivery-latency health score."""
        c = self.c
        metric = self.add(gcp.logging.Metric(
            "failed-for-good-metric", project=c.project, name=f"{c.service}-failed-for-good",
            description="Events stored FAILED for good (ack'ed, never retried).",
            filter=FAILED_FOR_GOOD_LOG.format(service=c.service),
            metric_descriptor=gcp.logging.MetricMetricDescriptorArgs(
                metric_kind="DELTA", value_type="INT64", unit="1")))
        failed = metric.name.apply(lambda name: (
            f'metric.type="logging.googleapis.com/user/{name}" '
            'AND resource.type="cloud_run_revision"'))
        self.alert("alert-failed-for-good", f"{c.service}: events failed for good",
                   self.threshold(failed, "ALIGN_DELTA", 0),
                   "Events were stored FAILED for good. List them with `eventbus` "
                   "(failed events) and replay them once the cause is fixed.")
        self.alert("alert-5xx", f"{c.service}: 5xx rate",
                   self.threshold(FIVE_XX.format(service=c.service), "ALIGN_RATE",
                                  c.error_rate_threshold),
                   "The handler answers 5xx (retries or errors) above the threshold per "
                   "second over 5 minutes: check MongoDB and the service's logs.")
        self.alert("alert-push-backlog", f"{c.push_subscription}: oldest unacked message",
                   self.threshold(worker.OLDEST_UNACKED.format(name=c.push_subscription),
                                  "ALIGN_MAX", c.backlog_alert_seconds),
                   f"A message on {c.push_subscription} has waited longer than "
                   f"{c.backlog_alert_seconds} s for its ack: the handler is down or refuses "
                   "the pushes (the 5xx alert, `push_request_count` by response class: 4xx "
                   "is the push identity or audience), too slow (more instances), or one "
                   "event is answered 503 again and again (the service's logs; "
                   f"after {c.max_delivery_attempts} attempts it is dead-lettered). Pub/Sub "
                   f"drops what waits longer than {c.retention_seconds} s.")
        self.alert("alert-delivery-health", f"{c.push_subscription}: delivery latency unhealthy",
                   self.threshold(HEALTH_SCORE.format(name=c.push_subscription),
                                  "ALIGN_FRACTION_TRUE", c.delivery_health_threshold,
                                  comparison="COMPARISON_LT", reducer="REDUCE_MIN",
                                  group_by=["metric.label.criteria"]),
                   f"Pub/Sub rates {c.push_subscription} unhealthy on the criterion the "
                   "incident names (its `criteria` label) for more than the allowed part of "
                   "5 minutes: `nack_requests` are the handler's 503s (transient errors, a "
                   "lease held elsewhere), `expired_ack_deadlines` and `ack_latency` are "
                   f"handlers slower than the {c.ack_deadline_seconds} s ack deadline, "
                   "`utilization` is more outstanding pushes than the service takes "
                   "(instances x concurrency), `seek_requests` someone seeking. Deliveries "
                   "slow down until it recovers: check the 5xx alert and the service's logs.")

    def dead_letter_alert(self) -> None:
        """Dead letters waiting on the dead-letter subscription (push and pull alike)."""
        c = self.c
        name = c.dead_letter_subscription
        self.alert("alert-dead-letters", f"{name}: dead letters waiting",
                   self.threshold(UNDELIVERED.format(name=name), "ALIGN_MAX",
                                  c.dead_letter_alert_messages),
                   f"More than {c.dead_letter_alert_messages} messages wait on {name}: events "
                   f"Pub/Sub gave up on after {c.max_delivery_attempts} delivery attempts "
                   "(the handler or worker never acked them). The dead-letter drain job "
                   f"(`{c.service}-dlq-drain`, `eventbus dlq drain`) stores and acks them; "
                   "if this stays open, the job is failing (its executions' logs). Then "
                   "find why they were never acked and replay them with the `eventbus` "
                   f"operator commands. Pub/Sub drops them after {c.retention_seconds} s.")


    def breaker_alert(self) -> None:
        """A partner's breaker open longer than ``breakerAlertSeconds`` (push and pull alike)."""
        c = self.c
        condition = gcp.monitoring.AlertPolicyConditionConditionThresholdArgs(
            filter=BREAKER_OPEN_FOR.format(metric=c.breaker_metric), comparison="COMPARISON_GT",
            threshold_value=c.breaker_alert_seconds, duration="0s",
            aggregations=[gcp.monitoring.AlertPolicyConditionConditionThresholdAggregationArgs(
                alignment_period="300s", per_series_aligner="ALIGN_MAX",
                cross_series_reducer="REDUCE_MAX",
                group_by_fields=["metric.label.eventbus_partner"])])
        self.alert("alert-breaker-open", f"{c.service}: a partner's breaker stays open",
                   condition,
                   f"A partner's breaker has been open for more than {c.breaker_alert_seconds} "
                   "s: its events are parked (acked, kept in the store) until it answers. "
                   "See `eventbus partners`; `eventbus partners close NAME --why ...` "
                   "brings them back once the partner is fixed.")


def exports(config: DeployConfig, resources: Resources) -> dict[str, Any]:
    """What ``pulumi stack output`` shows: names, the push audience and the handler's URL."""
    common = {
        "topic": config.topic,
        "deadLetterTopic": config.dead_letter_topic,
        "deadLetterSubscription": config.dead_letter_subscription,
        "jobs": [f"{config.service}-{spec.name}" for spec in config.jobs],
        **worker.exports(config),
        "publicTopics": sorted(public.manifest(config)),
        "publicSubscriptions": [k.subscription for k in public.consumers(config)],
        **archive.exports(config),
    }
    if not config.push_enabled:
        return common
    handler: Any = resources.get("service") or resources.get("function")
    url = handler.uri if config.target == "run" else handler.url
    return {
        "url": url,
        **common,
        "pushSubscription": config.push_subscription,
        "pushAudience": config.push_audience,
    }
