"""The Pulumi stack under Pulumi's mocks: every piece of wiring, offline, in about a second.

``record(config)`` runs ``stack.build`` with mocks that record every resource (type, name,
inputs). ``check_wiring(resources, config)`` names each expected piece of wiring that the
recorded resources lack, so a test can delete one resource and see exactly what breaks.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import runpy
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

INSTALL = "pip install -r infra/deploy/pulumi/requirements.txt"


def in_ci() -> bool:
    """True under ``CI=true``, where a missing prerequisite fails instead of skipping."""
    return os.environ.get("CI", "").lower() == "true"


try:
    import pulumi
except ImportError as exc:
    if in_ci():
        raise ImportError(f"pulumi is not installed (CI=true fails, never skips): {INSTALL}") \
            from exc
    pytest.skip(f"pulumi is not installed: {INSTALL}", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[4]
DEPLOY = ROOT / "infra" / "deploy"
PROGRAM = DEPLOY / "pulumi"
PROJECT_NUMBER = "123456789012"
AGENT = f"serviceAccount:service-{PROJECT_NUMBER}@gcp-sa-pubsub.iam.gserviceaccount.com"
PUBLIC = ("allUsers", "allAuthenticatedUsers")
# pulumi_gcp warns about its own deprecated lookups when its modules load.
pytestmark = pytest.mark.filterwarnings("ignore:.*deprecated in favor of:DeprecationWarning")


def _load_stack() -> ModuleType:
    # stack.py imports its sibling worker.py, as it does when Pulumi runs the program.
    if str(PROGRAM) not in sys.path:
        sys.path.insert(0, str(PROGRAM))
    spec = importlib.util.spec_from_file_location("eventbus_deploy_stack", PROGRAM / "stack.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


stack = _load_stack()
RUN = stack.DeployConfig(project="acme-prod", region="europe-west1",
                         image="europe-docker.pkg.dev/acme-prod/eventbus/handler:abc",
                         notification_channels=("projects/acme-prod/notificationChannels/42",))
FUNCTION = replace(RUN, target="function", function_source="/tmp/source-abc123.zip")
PULL = replace(RUN, consumer="pull")
FULFILMENT = "serviceAccount:fulfilment@acme-prod.iam.gserviceaccount.com"
BOTH = replace(RUN, consumer="both", pull_event_types=("PARTNER_NOTIFY", "OR_MGMT"),
               pull_exactly_once=True,
               public_consumers=(f"fulfilment:order-status:v2:{FULFILMENT}",
                                 "audit:order-status:*:group:audit@acme.example"))
ARCHIVE = replace(RUN, archive=True)
CONFIGS = {"run": RUN, "function": FUNCTION, "pull": PULL, "both": BOTH, "archive": ARCHIVE}


# -- recording under mocks ------------------------------------------------------------------

@dataclass(frozen=True)
class Recorded:
    """One resource as the program declared it."""

    type: str
    name: str
    inputs: dict[str, Any]


def _physical_id(args: pulumi.runtime.MockResourceArgs) -> str:
    project, name = args.inputs.get("project"), args.inputs.get("name")
    kinds = {"gcp:pubsub/topic:Topic": "topics",
             "gcp:pubsub/subscription:Subscription": "subscriptions"}
    if args.typ in kinds:
        return f"projects/{project}/{kinds[args.typ]}/{name}"
    return f"{args.name}-id"


def _computed(args: pulumi.runtime.MockResourceArgs) -> dict[str, Any]:
    """The outputs the provider would compute: emails, URLs."""
    inputs = args.inputs
    if args.typ == "gcp:serviceaccount/account:Account":
        email = f"{inputs['accountId']}@{inputs['project']}.iam.gserviceaccount.com"
        return {"email": email, "member": f"serviceAccount:{email}",
                "name": f"projects/{inputs['project']}/serviceAccounts/{email}"}
    if args.typ == "gcp:cloudrunv2/service:Service":
        return {"uri": run_uri(inputs["name"])}
    if args.typ == "gcp:cloudfunctionsv2/function:Function":
        return {"url": f"https://{inputs['location']}-{inputs['project']}.cloudfunctions.net/"
                       f"{inputs['name']}"}
    return {}


def run_uri(service: str) -> str:
    return f"https://{service}-abc123-ew.a.run.app"


class RecordingMocks(pulumi.runtime.Mocks):
    """Records every resource; answers the one lookup the stack makes (the project number)."""

    def __init__(self) -> None:
        self.resources: list[Recorded] = []

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str, dict[str, Any]]:
        self.resources.append(Recorded(args.typ, args.name, dict(args.inputs)))
        return _physical_id(args), {**args.inputs, **_computed(args)}

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[str, Any], list[Any]]:
        if args.token == "gcp:organizations/getProject:getProject":
            return {"number": PROJECT_NUMBER, "projectId": args.args.get("projectId")}, []
        return {}, []


def run_under_mocks(declare: Callable[[], Any], project: str = "project") -> list[Recorded]:
    mocks = RecordingMocks()
    pulumi.runtime.set_mocks(mocks, project=project, preview=False)
    pulumi.runtime.test(declare)()
    return mocks.resources


def record(config: Any) -> list[Recorded]:
    def declare() -> pulumi.Output[list[str]]:
        return pulumi.Output.all(*(r.urn for r in stack.build(config).values()))

    return run_under_mocks(declare)


_cache: dict[Any, list[Recorded]] = {}


def recorded(config: Any) -> list[Recorded]:
    if config not in _cache:
        _cache[config] = record(config)
    return list(_cache[config])


# -- what must be there ------------------------------------------------------------------------

Check = Callable[[list[Recorded]], bool]


def dig(value: Any, path: str) -> Any:
    for key in path.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def of_type(resources: Iterable[Recorded], kind: str) -> list[dict[str, Any]]:
    return [r.inputs for r in resources if r.type == f"gcp:{kind}"]


def some(kind: str, expected: dict[str, Any], where: Callable[[dict[str, Any]], bool] | None = None
         ) -> Check:
    """Some resource of ``kind`` has every dotted input path equal to ``expected``."""
    def check(resources: list[Recorded]) -> bool:
        return any(all(dig(i, path) == value for path, value in expected.items())
                   and (where is None or where(i)) for i in of_type(resources, kind))
    return check


def email(account_id: str, config: Any) -> str:
    return f"{account_id}@{config.project}.iam.gserviceaccount.com"


def member(account_id: str, config: Any) -> str:
    return f"serviceAccount:{email(account_id, config)}"


def topic_path(config: Any, name: str) -> str:
    return f"projects/{config.project}/topics/{name}"


def env_of(envs: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Cloud Run ``envs`` as name -> plain value (a secret reference shows as a dict)."""
    return {e["name"]: e.get("value", e.get("valueSource")) for e in envs or []}


def secret_only(envs: list[dict[str, Any]] | None, config: Any) -> bool:
    """MONGODB_URI is there, and only as a Secret Manager reference, never a plain value."""
    uri = [e for e in envs or [] if e["name"] == "MONGODB_URI"]
    ref = {"secret": config.mongodb_secret_id, "version": config.mongodb_secret_version}
    return bool(uri) and all(dig(e, "valueSource.secretKeyRef") == ref and not e.get("value")
                             for e in uri)


def app_env(config: Any) -> dict[str, str]:
    """The plain variables the handler needs: auth on, names, gunicorn's concurrency."""
    return {"EVENTBUS_AUTH": "true",
            "EVENTBUS_AUTH_SERVICE_ACCOUNTS": email(config.push_service_account_id, config),
            "EVENTBUS_AUTH_AUDIENCE": config.push_audience,
            "GOOGLE_CLOUD_PROJECT": config.project, "PUBSUB_TOPIC": config.topic,
            "EVENTBUS_DEAD_LETTER_TOPIC": config.dead_letter_topic,
            "WEB_CONCURRENCY": str(config.workers), "GUNICORN_THREADS": str(config.threads)}


def has_env(env: dict[str, Any], expected: dict[str, str]) -> bool:
    return all(env.get(k) == v for k, v in expected.items())


def nothing_public(resources: list[Recorded]) -> bool:
    return not any(r.inputs.get("member") in PUBLIC or set(r.inputs.get("members") or ()) &
                   set(PUBLIC) for r in resources)


def messaging_checks(c: Any) -> dict[str, Check]:
    push_sa, dlq = email(c.push_service_account_id, c), topic_path(c, c.dead_letter_topic)
    on_topic = {"topic": topic_path(c, c.topic), "name": c.push_subscription}
    shared = {
        "topic": some("pubsub/topic:Topic", {"name": c.topic}),
        "dead-letter topic": some("pubsub/topic:Topic", {"name": c.dead_letter_topic}),
        "dead-letter topic has a pull subscription": some(
            "pubsub/subscription:Subscription",
            {"topic": dlq, "messageRetentionDuration": f"{c.retention_seconds}s"},
            where=lambda i: not i.get("pushConfig")),
    }
    if not c.push_enabled:
        return shared
    return {
        **shared,
        "push subscription: filter leaves the worker's event types to it": some(
            "pubsub/subscription:Subscription", {**on_topic},
            where=lambda i: i.get("filter") == stack.worker.push_filter(c)),
        "push subscription: OIDC token of the push service account, audience": some(
            "pubsub/subscription:Subscription",
            {**on_topic, "pushConfig.oidcToken.serviceAccountEmail": push_sa,
             "pushConfig.oidcToken.audience": c.push_audience}),
        "push subscription: retry policy": some("pubsub/subscription:Subscription", {
            **on_topic, "retryPolicy.minimumBackoff": f"{c.min_backoff_seconds}s",
            "retryPolicy.maximumBackoff": f"{c.max_backoff_seconds}s"}),
        "push subscription: dead-letter policy": some("pubsub/subscription:Subscription", {
            **on_topic, "deadLetterPolicy.deadLetterTopic": dlq,
            "deadLetterPolicy.maxDeliveryAttempts": c.max_delivery_attempts}),
        "push subscription: ack deadline and retention": some(
            "pubsub/subscription:Subscription",
            {**on_topic, "ackDeadlineSeconds": c.ack_deadline_seconds,
             "messageRetentionDuration": f"{c.retention_seconds}s"}),
    }


def grant_checks(c: Any) -> dict[str, Check]:
    runtime = member(c.runtime_service_account_id, c)
    push_sa_path = f"projects/{c.project}/serviceAccounts/{email(c.push_service_account_id, c)}"
    topic, sub = "pubsub/topicIAMMember:TopicIAMMember", "pubsub/subscriptionIAMMember:" \
                                                         "SubscriptionIAMMember"
    publisher, subscriber = "roles/pubsub.publisher", "roles/pubsub.subscriber"
    accounts = {c.runtime_service_account_id, c.scheduler_service_account_id}
    accounts |= {c.push_service_account_id} if c.push_enabled else set()
    accounts |= {c.worker_service_account_id} if c.pull_enabled else set()
    push = {
        "Pub/Sub service agent: roles/pubsub.subscriber on the push subscription": some(
            sub, {"subscription": c.push_subscription, "role": subscriber, "member": AGENT}),
        "Pub/Sub service agent: token creator on the push service account": some(
            "serviceaccount/iAMMember:IAMMember",
            {"serviceAccountId": push_sa_path, "member": AGENT,
             "role": "roles/iam.serviceAccountTokenCreator"}),
    } if c.push_enabled else {}
    return {
        "Pub/Sub service agent: roles/pubsub.publisher on the dead-letter topic": some(
            topic, {"topic": c.dead_letter_topic, "role": publisher, "member": AGENT}),
        **push,
        "runtime: secretAccessor on the MongoDB secret": some(
            "secretmanager/secretIamMember:SecretIamMember",
            {"secretId": c.mongodb_secret_id, "member": runtime,
             "role": "roles/secretmanager.secretAccessor"}),
        "runtime: publisher on the topic": some(
            topic, {"topic": c.topic, "role": publisher, "member": runtime}),
        "runtime: publisher on the dead-letter topic": some(
            topic, {"topic": c.dead_letter_topic, "role": publisher, "member": runtime}),
        "runtime: subscriber on the dead-letter subscription": some(
            sub, {"subscription": c.dead_letter_subscription, "role": subscriber,
                  "member": runtime}),
        "service accounts: push, runtime, scheduler, worker (as deployed)": lambda rs: {
            i["accountId"] for i in of_type(rs, "serviceaccount/account:Account")} == accounts,
        "nothing granted to allUsers or allAuthenticatedUsers": nothing_public,
    }


def service_checks(c: Any) -> dict[str, Check]:
    kind, name = "cloudrunv2/service:Service", {"name": c.service}

    def container(check: Callable[[dict[str, Any]], bool]) -> Check:
        return some(kind, name, where=lambda i: check(dig(i, "template")["containers"][0]))

    return {
        "push subscription: pushes to the service": some(
            "pubsub/subscription:Subscription",
            {"name": c.push_subscription, "pushConfig.pushEndpoint": run_uri(c.service) + "/"}),
        "service: image and runtime service account": some(kind, {
            **name, "template.serviceAccount": email(c.runtime_service_account_id, c)},
            where=lambda i: dig(i, "template")["containers"][0]["image"] == c.image),
        "service: MONGODB_URI only from Secret Manager": container(
            lambda ct: secret_only(ct.get("envs"), c)),
        "service: auth on, names and gunicorn settings in env": container(
            lambda ct: has_env(env_of(ct.get("envs")), app_env(c))),
        "service: accepts the push audience": some(
            kind, name, where=lambda i: c.push_audience in (i.get("customAudiences") or [])),
        "service: concurrency = workers x threads": some(
            kind, {**name, "template.maxInstanceRequestConcurrency": c.workers * c.threads}),
        "service: min and max instances": some(kind, {
            **name, "template.scaling.minInstanceCount": c.min_instances,
            "template.scaling.maxInstanceCount": c.max_instances}),
        "service: internal ingress": some(
            kind, {**name, "ingress": stack.INGRESS[c.ingress][0]}),
        "push service account: run.invoker on the service": some(
            "cloudrunv2/serviceIamMember:ServiceIamMember",
            {**name, "role": "roles/run.invoker",
             "member": member(c.push_service_account_id, c)}),
    }


def uploaded_source(resources: list[Recorded], function: dict[str, Any]) -> bool:
    source = dig(function, "buildConfig.source.storageSource") or {}
    objects = of_type(resources, "storage/bucketObject:BucketObject")
    buckets = of_type(resources, "storage/bucket:Bucket")
    return any(o["bucket"] == source.get("bucket") and o["name"] == source.get("object")
               for o in objects) and any(b["name"] == source.get("bucket") for b in buckets)


def function_checks(c: Any) -> dict[str, Check]:
    kind, name, push_sa = "cloudfunctionsv2/function:Function", {"name": c.service}, member(
        c.push_service_account_id, c)
    url = f"https://{c.region}-{c.project}.cloudfunctions.net/{c.service}"
    secret = {"key": "MONGODB_URI", "secret": c.mongodb_secret_id,
              "version": c.mongodb_secret_version, "projectId": c.project}

    def config(check: Callable[[dict[str, Any]], bool]) -> Check:
        return some(kind, name, where=lambda i: check(i.get("serviceConfig") or {}))

    def with_source(resources: list[Recorded]) -> bool:
        return any(uploaded_source(resources, f) for f in of_type(resources, kind))

    return {
        "push subscription: pushes to the function, audience = its URL": some(
            "pubsub/subscription:Subscription",
            {"name": c.push_subscription, "pushConfig.pushEndpoint": url,
             "pushConfig.oidcToken.audience": url}),
        "function: pubsub_push on python311, HTTP (no --trigger-topic)": some(kind, {
            **name, "buildConfig.entryPoint": "pubsub_push", "buildConfig.runtime": "python311"},
            where=lambda i: not i.get("eventTrigger")),
        "function: built from the uploaded source": with_source,
        "function: runtime service account": config(
            lambda s: s.get("serviceAccountEmail") == email(c.runtime_service_account_id, c)),
        "function: MONGODB_URI only from Secret Manager": config(
            lambda s: secret in (s.get("secretEnvironmentVariables") or [])
            and "MONGODB_URI" not in (s.get("environmentVariables") or {})),
        "function: auth on, names and gunicorn settings in env": config(
            lambda s: has_env(s.get("environmentVariables") or {}, app_env(c))),
        "function: concurrency = workers x threads": config(
            lambda s: s.get("maxInstanceRequestConcurrency") == c.workers * c.threads
            and has_env(s.get("environmentVariables") or {},
                        {"WORKERS": str(c.workers), "THREADS": str(c.threads)})),
        "function: min and max instances": config(
            lambda s: (s.get("minInstanceCount"), s.get("maxInstanceCount"))
            == (c.min_instances, c.max_instances)),
        "function: internal ingress": config(
            lambda s: s.get("ingressSettings") == stack.INGRESS[c.ingress][1]),
        "push service account: cloudfunctions.invoker on the function": some(
            "cloudfunctionsv2/functionIamMember:FunctionIamMember",
            {"cloudFunction": c.service, "role": "roles/cloudfunctions.invoker",
             "member": push_sa}),
        "push service account: run.invoker on the function's service": some(
            "cloudrunv2/serviceIamMember:ServiceIamMember",
            {**name, "role": "roles/run.invoker", "member": push_sa}),
    }


def job_checks(c: Any, spec: Any) -> dict[str, Check]:
    job = f"{c.service}-{spec.name}"
    api = f"https://run.googleapis.com/v2/projects/{c.project}/locations/{c.region}/jobs/{job}:run"
    scheduler = email(c.scheduler_service_account_id, c)

    def runs(i: dict[str, Any]) -> bool:
        ct = dig(i, "template.template")["containers"][0]
        return (ct["commands"] + ct["args"] == [*c.cli, *spec.args] and ct["image"] == c.image
                and secret_only(ct.get("envs"), c))

    return {
        f"job {spec.name}: runs `eventbus {' '.join(spec.args)}` with MONGODB_URI from the "
        "secret": some("cloudrunv2/job:Job", {
            "name": job, "template.template.serviceAccount": email(
                c.runtime_service_account_id, c)}, where=runs),
        f"schedule {spec.name}: POSTs the Run Jobs API with the scheduler's OAuth token": some(
            "cloudscheduler/job:Job",
            {"schedule": spec.schedule, "httpTarget.uri": api, "httpTarget.httpMethod": "POST",
             "httpTarget.oauthToken.serviceAccountEmail": scheduler}),
        f"scheduler: run.invoker on job {spec.name}": some(
            "cloudrunv2/jobIamMember:JobIamMember",
            {"name": job, "role": "roles/run.invoker", "member": f"serviceAccount:{scheduler}"}),
    }


def alert_checks(c: Any) -> dict[str, Check]:
    log_match = ('jsonPayload.outcome="rejected"', 'jsonPayload.logType="REQUEST_INBOUND"',
                 "severity>=ERROR", f'service_name="{c.service}"')
    five_xx = ('metric.type="run.googleapis.com/request_count"',
               'metric.label.response_code_class="5xx"', f'service_name="{c.service}"')
    channels = {"notificationChannels": list(c.notification_channels)}

    def alert_on(parts: Callable[[list[Recorded]], Iterable[str]], aligner: str) -> Check:
        def check(rs: list[Recorded]) -> bool:
            return any(
                all(p in dig(i, "conditions")[0]["conditionThreshold"]["filter"]
                    for p in parts(rs))
                and dig(i, "conditions")[0]["conditionThreshold"]["comparison"] == "COMPARISON_GT"
                and dig(i, "conditions")[0]["conditionThreshold"]["aggregations"][0]
                == {"alignmentPeriod": "300s", "perSeriesAligner": aligner,
                    "crossSeriesReducer": "REDUCE_SUM"}
                for i in of_type(rs, "monitoring/alertPolicy:AlertPolicy")
                if i["notificationChannels"] == channels["notificationChannels"])
        return check

    def metric_types(rs: list[Recorded]) -> list[str]:
        names = [m["name"] for m in of_type(rs, "logging/metric:Metric")
                 if m["name"] == f"{c.service}-failed-for-good"]
        return [f'logging.googleapis.com/user/{names[0]}"'] if names else ["<no metric>"]

    return {
        "log metric counts events failed for good": some(
            "logging/metric:Metric", {"metricDescriptor.metricKind": "DELTA"},
            where=lambda i: all(p in i["filter"] for p in log_match)),
        "alert: events failed for good > 0 over 5 min": alert_on(metric_types, "ALIGN_DELTA"),
        "alert: 5xx rate of the handler": alert_on(lambda rs: five_xx, "ALIGN_RATE"),
        "alert: oldest unacked message on the push subscription": pubsub_alert(
            c, "subscription/oldest_unacked_message_age", c.push_subscription,
            "COMPARISON_GT", c.backlog_alert_seconds,
            {"alignmentPeriod": "300s", "perSeriesAligner": "ALIGN_MAX",
             "crossSeriesReducer": "REDUCE_SUM"}),
        "alert: the push subscription's delivery-latency health score below threshold":
            pubsub_alert(
                c, "subscription/delivery_latency_health_score", c.push_subscription,
                "COMPARISON_LT", c.delivery_health_threshold,
                {"alignmentPeriod": "300s", "perSeriesAligner": "ALIGN_FRACTION_TRUE",
                 "crossSeriesReducer": "REDUCE_MIN",
                 "groupByFields": ["metric.label.criteria"]}),
    }


def pubsub_alert(c: Any, metric: str, subscription: str, comparison: str, value: float,
                 aggregation: dict[str, Any]) -> Check:
    """An alert policy on a Pub/Sub metric of one subscription, to the stack's channels."""
    expected = (f'metric.type="pubsub.googleapis.com/{metric}" '
                'AND resource.type="pubsub_subscription" '
                f'AND resource.label.subscription_id="{subscription}"')

    def check(rs: list[Recorded]) -> bool:
        return any(
            (cond := dig(i, "conditions")[0]["conditionThreshold"])["filter"] == expected
            and cond["comparison"] == comparison and cond["thresholdValue"] == value
            and cond["aggregations"] == [aggregation]
            and i["notificationChannels"] == list(c.notification_channels)
            and subscription in i["documentation"]["content"]
            for i in of_type(rs, "monitoring/alertPolicy:AlertPolicy"))
    return check


def dead_letter_checks(c: Any) -> dict[str, Check]:
    """The alert on dead letters waiting on the dead-letter subscription (every consumer)."""
    return {"alert: dead letters waiting on the dead-letter subscription": pubsub_alert(
        c, "subscription/num_undelivered_messages", c.dead_letter_subscription,
        "COMPARISON_GT", c.dead_letter_alert_messages,
        {"alignmentPeriod": "300s", "perSeriesAligner": "ALIGN_MAX",
         "crossSeriesReducer": "REDUCE_SUM"})}


def breaker_checks(c: Any) -> dict[str, Check]:
    """The alert on a partner's breaker left open (every consumer)."""
    def check(rs: list[Recorded]) -> bool:
        return any(
            dig(i, "conditions")[0]["conditionThreshold"]["filter"]
            == f'metric.type="{c.breaker_metric}"'
            and dig(i, "conditions")[0]["conditionThreshold"]["thresholdValue"]
            == c.breaker_alert_seconds
            and dig(i, "conditions")[0]["conditionThreshold"]["aggregations"][0][
                "perSeriesAligner"] == "ALIGN_MAX"
            and i["notificationChannels"] == list(c.notification_channels)
            for i in of_type(rs, "monitoring/alertPolicy:AlertPolicy"))

    return {"alert: a partner's breaker open past breakerAlertSeconds": check}


def worker_checks(c: Any) -> dict[str, Check]:
    """The pull worker's wiring (worker.py): subscription, grants, worker pool, alerts."""
    kind, sub = "pubsub/subscription:Subscription", {"name": c.pull_subscription}
    grant = "pubsub/subscriptionIAMMember:SubscriptionIAMMember"
    worker, pool = member(c.worker_service_account_id, c), "cloudrunv2/workerPool:WorkerPool"

    def container(check: Callable[[dict[str, Any]], bool]) -> Check:
        return some(pool, {"name": c.worker_pool},
                    where=lambda i: check(dig(i, "template")["containers"][0]))

    def runs(ct: dict[str, Any]) -> bool:
        return (ct["commands"] + ct["args"] == [*c.cli, *stack.worker.worker_args(c)]
                and ct["image"] == c.image)

    return {
        "pull subscription: on the topic, pull, ack deadline, retention, no expiry": some(
            kind, {**sub, "topic": topic_path(c, c.topic), "expirationPolicy.ttl": "",
                   "ackDeadlineSeconds": c.ack_deadline_seconds,
                   "messageRetentionDuration": f"{c.retention_seconds}s"},
            where=lambda i: not i.get("pushConfig")),
        "pull subscription: retry policy": some(kind, {
            **sub, "retryPolicy.minimumBackoff": f"{c.min_backoff_seconds}s",
            "retryPolicy.maximumBackoff": f"{c.max_backoff_seconds}s"}),
        "pull subscription: dead-letter policy": some(kind, {
            **sub, "deadLetterPolicy.deadLetterTopic": topic_path(c, c.dead_letter_topic),
            "deadLetterPolicy.maxDeliveryAttempts": c.max_delivery_attempts}),
        "pull subscription: exactly-once delivery as configured": some(
            kind, {**sub, "enableExactlyOnceDelivery": c.pull_exactly_once}),
        "pull subscription: filter as configured": some(
            kind, sub, where=lambda i: i.get("filter") == stack.worker.pull_filter(c)),
        "Pub/Sub service agent: roles/pubsub.subscriber on the pull subscription": some(
            grant, {"subscription": c.pull_subscription, "role": "roles/pubsub.subscriber",
                    "member": AGENT}),
        "worker: subscriber on its subscription": some(grant, {
            "subscription": c.pull_subscription, "role": "roles/pubsub.subscriber",
            "member": worker}),
        "worker: viewer of its subscription": some(grant, {
            "subscription": c.pull_subscription, "role": "roles/pubsub.viewer",
            "member": worker}),
        "worker: publisher on the topic": some(
            "pubsub/topicIAMMember:TopicIAMMember",
            {"topic": c.topic, "role": "roles/pubsub.publisher", "member": worker}),
        "worker: secretAccessor on the MongoDB secret": some(
            "secretmanager/secretIamMember:SecretIamMember",
            {"secretId": c.mongodb_secret_id, "member": worker,
             "role": "roles/secretmanager.secretAccessor"}),
        "worker pool: `eventbus worker` on its subscription, as the worker's account": some(
            pool, {"name": c.worker_pool, "location": c.region,
                   "template.serviceAccount": email(c.worker_service_account_id, c)},
            where=lambda i: runs(dig(i, "template")["containers"][0])),
        "worker pool: MONGODB_URI only from Secret Manager": container(
            lambda ct: secret_only(ct.get("envs"), c)),
        "worker pool: project, topic and subscription in env, no push settings": container(
            lambda ct: has_env(env_of(ct.get("envs")), {
                "GOOGLE_CLOUD_PROJECT": c.project, "PUBSUB_TOPIC": c.topic,
                "EVENTBUS_PULL_SUBSCRIPTION": c.pull_subscription})
            and "EVENTBUS_AUTH" not in env_of(ct.get("envs"))),
        "worker pool: manual scaling to workerInstances": some(pool, {
            "name": c.worker_pool, "scaling.scalingMode": "MANUAL",
            "scaling.manualInstanceCount": c.worker_instances}),
        "log metric counts the worker's events failed for good": some(
            "logging/metric:Metric", {"metricDescriptor.metricKind": "DELTA"},
            where=lambda i: 'resource.type="cloud_run_worker_pool"' in i["filter"]
            and f'worker_pool_name="{c.worker_pool}"' in i["filter"]
            and 'jsonPayload.outcome="rejected"' in i["filter"]),
        "alert: the worker's events failed for good": some(
            "monitoring/alertPolicy:AlertPolicy",
            {"displayName": f"{c.worker_pool}: events failed for good",
             "notificationChannels": list(c.notification_channels)}),
        "alert: oldest unacked message on the pull subscription": some(
            "monitoring/alertPolicy:AlertPolicy",
            {"notificationChannels": list(c.notification_channels)},
            where=lambda i: f'subscription_id="{c.pull_subscription}"'
            in dig(i, "conditions")[0]["conditionThreshold"]["filter"]
            and dig(i, "conditions")[0]["conditionThreshold"]["thresholdValue"]
            == c.backlog_alert_seconds),
    }


def public_checks(c: Any) -> dict[str, Check]:
    """Each public topic of the manifest: schema, topic, publishers; each consumer's own."""
    grant, checks = "pubsub/topicIAMMember:TopicIAMMember", {}
    publishers = [member(c.runtime_service_account_id, c)] + (
        [member(c.worker_service_account_id, c)] if c.pull_enabled else [])
    for topic, spec in stack.public.manifest(c).items():
        definition = (stack.public.contracts_dir(c) / spec["schema"]).read_text()
        checks[f"public {topic}: a PROTOCOL_BUFFER schema of the checked-in .proto"] = some(
            "pubsub/schema:Schema", {"name": f"{topic}-schema", "type": "PROTOCOL_BUFFER",
                                     "definition": definition})
        checks[f"public {topic}: the topic validates JSON against the schema"] = some(
            "pubsub/topic:Topic", {"name": topic, "schemaSettings.encoding": "JSON",
                                   "schemaSettings.schema": f"public-schema-{topic}-id"})
        for who in publishers:
            checks[f"public {topic}: {who} publishes"] = some(
                grant, {"topic": topic, "role": "roles/pubsub.publisher", "member": who})
    for consumer in stack.public.consumers(c):
        path = topic_path(c, consumer.topic)
        checks[f"consumer {consumer.name}: its subscription"] = some(
            "pubsub/subscription:Subscription",
            {"name": consumer.subscription, "topic": path, "filter": consumer.filter})
        checks[f"consumer {consumer.name}: subscriber on its subscription only"] = some(
            "pubsub/subscriptionIAMMember:SubscriptionIAMMember",
            {"subscription": consumer.subscription, "role": "roles/pubsub.subscriber",
             "member": consumer.member})
    return checks


def archive_checks(c: Any) -> dict[str, Check]:
    """The archive: a bucket of Avro files, a BigQuery table, and what Pub/Sub may do to them."""
    archive, sub = stack.archive, "pubsub/subscription:Subscription"
    bucket, grant = archive.bucket_name(c), "storage/bucketIAMMember:BucketIAMMember"
    location = c.archive_location or c.region
    on_topic = {"topic": topic_path(c, c.topic), "expirationPolicy.ttl": "",
                "messageRetentionDuration": f"{c.retention_seconds}s"}

    def backlog(subscription: str) -> Check:
        return some("monitoring/alertPolicy:AlertPolicy",
                    {"notificationChannels": list(c.notification_channels)},
                    where=lambda i: f'subscription_id="{subscription}"'
                    in dig(i, "conditions")[0]["conditionThreshold"]["filter"])

    checks = {
        "archive bucket: private, deleted after archiveDays": some(
            "storage/bucket:Bucket", {"name": bucket, "location": location,
                                      "uniformBucketLevelAccess": True,
                                      "publicAccessPrevention": "enforced"},
            where=lambda i: i.get("lifecycleRules") == [
                {"action": {"type": "Delete"}, "condition": {"age": c.archive_days}}]),
        "archive subscription: Avro with metadata, not the topic's schema, into the bucket": some(
            sub, {**on_topic, "name": archive.storage_subscription(c),
                  "cloudStorageConfig.bucket": bucket,
                  "cloudStorageConfig.filenamePrefix": f"{c.topic}/",
                  "cloudStorageConfig.avroConfig.writeMetadata": True,
                  "cloudStorageConfig.avroConfig.useTopicSchema": False}),
        "archive subscription: a file per archiveFileSeconds, within its ack deadline": some(
            sub, {"name": archive.storage_subscription(c),
                  "cloudStorageConfig.maxDuration": f"{c.archive_file_seconds}s",
                  "ackDeadlineSeconds": c.archive_file_seconds}),
        "Pub/Sub service agent: objectCreator on the archive bucket": some(
            grant, {"bucket": bucket, "role": "roles/storage.objectCreator", "member": AGENT}),
        "Pub/Sub service agent: legacyBucketReader on the archive bucket": some(
            grant, {"bucket": bucket, "role": "roles/storage.legacyBucketReader",
                    "member": AGENT}),
        "runtime: objectViewer on the archive bucket": some(
            grant, {"bucket": bucket, "role": "roles/storage.objectViewer",
                    "member": member(c.runtime_service_account_id, c)}),
        "alert: the archive subscription's backlog": backlog(archive.storage_subscription(c)),
    }
    if not c.archive_bigquery:
        return checks
    dataset, table = archive.dataset_id(c), f"{c.project}.{archive.dataset_id(c)}.messages"
    return {
        **checks,
        "archive dataset": some("bigquery/dataset:Dataset",
                                {"datasetId": dataset, "location": location}),
        "archive table: the metadata columns, partitioned by publish time": some(
            "bigquery/table:Table",
            {"datasetId": dataset, "tableId": "messages", "deletionProtection": True,
             "timePartitioning.field": "publish_time",
             "timePartitioning.expirationMs": c.archive_days * 86_400_000},
            where=lambda i: [(f["name"], f["type"]) for f in json.loads(i["schema"])] == [
                ("subscription_name", "STRING"), ("message_id", "STRING"),
                ("publish_time", "TIMESTAMP"), ("data", "BYTES"), ("attributes", "JSON")]),
        "BigQuery subscription: metadata, not the topic's schema, into the table": some(
            sub, {**on_topic, "name": archive.bigquery_subscription(c),
                  "bigqueryConfig.table": table, "bigqueryConfig.writeMetadata": True,
                  "bigqueryConfig.useTopicSchema": False}),
        "Pub/Sub service agent: dataEditor on the archive table": some(
            "bigquery/iamMember:IamMember",
            {"datasetId": dataset, "tableId": "messages", "role": "roles/bigquery.dataEditor",
             "member": AGENT}),
        "alert: the BigQuery subscription's backlog": backlog(archive.bigquery_subscription(c)),
    }


def expectations(config: Any) -> dict[str, Check]:
    """Every piece of wiring a deployment of ``config`` must have, by description."""
    jobs = [job_checks(config, spec) for spec in config.jobs]
    checks = {**messaging_checks(config), **grant_checks(config), **public_checks(config),
              **breaker_checks(config), **dead_letter_checks(config),
              **{k: v for checks in jobs for k, v in checks.items()}}
    if config.push_enabled:
        target = service_checks(config) if config.target == "run" else function_checks(config)
        checks |= {**target, **alert_checks(config)}
    if config.pull_enabled:
        checks |= worker_checks(config)
    if config.archive:
        checks |= archive_checks(config)
    return checks


def check_wiring(resources: list[Recorded], config: Any) -> list[str]:
    """The pieces of wiring missing from ``resources``; empty when all is there."""
    return [name for name, holds in expectations(config).items() if not holds(resources)]


def without(resources: list[Recorded], name: str) -> list[Recorded]:
    kept = [r for r in resources if r.name != name]
    assert len(kept) == len(resources) - 1, f"no resource named {name}"
    return kept


# -- the wiring is complete --------------------------------------------------------------------

@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_every_piece_of_wiring_is_declared(config: Any) -> None:
    assert check_wiring(recorded(config), config) == []


@pytest.mark.parametrize("config", CONFIGS.values(), ids=CONFIGS.keys())
def test_removing_any_one_resource_is_reported(config: Any) -> None:
    resources = recorded(config)
    unnoticed = [r.name for r in resources
                 if not check_wiring(without(resources, r.name), config)]
    assert unnoticed == []


def test_removing_the_dead_letter_subscription_is_reported() -> None:
    missing = check_wiring(without(recorded(RUN), "dead-letter-pull"), RUN)
    assert missing == ["dead-letter topic has a pull subscription"]


def test_removing_a_service_agent_grant_is_reported() -> None:
    for config in (RUN, FUNCTION):
        missing = check_wiring(without(recorded(config), "agent-publishes-dead-letters"), config)
        assert missing == ["Pub/Sub service agent: roles/pubsub.publisher on the dead-letter topic"]


def test_removing_the_function_invoker_grant_is_reported() -> None:
    missing = check_wiring(without(recorded(FUNCTION), "push-invokes-function-service"), FUNCTION)
    assert missing == ["push service account: run.invoker on the function's service"]


def _edit_service_env(resources: list[Recorded], envs: list[dict[str, Any]]) -> list[Recorded]:
    (service,) = [r for r in resources if r.name == "service"]
    template = dict(service.inputs["template"])
    template["containers"] = [{**template["containers"][0], "envs": envs}]
    edited = Recorded(service.type, service.name, {**service.inputs, "template": template})
    return [edited if r is service else r for r in resources]


def _service_envs(resources: list[Recorded]) -> list[dict[str, Any]]:
    (service,) = [r for r in resources if r.name == "service"]
    return list(service.inputs["template"]["containers"][0]["envs"])


def test_a_plain_mongodb_uri_is_reported() -> None:
    resources = recorded(RUN)
    envs = [*_service_envs(resources), {"name": "MONGODB_URI", "value": "mongodb://leak"}]
    missing = check_wiring(_edit_service_env(resources, envs), RUN)
    assert missing == ["service: MONGODB_URI only from Secret Manager"]


def test_auth_off_is_reported() -> None:
    resources = recorded(RUN)
    envs = [{**e, "value": "false"} if e["name"] == "EVENTBUS_AUTH" else e
            for e in _service_envs(resources)]
    missing = check_wiring(_edit_service_env(resources, envs), RUN)
    assert missing == ["service: auth on, names and gunicorn settings in env"]


# -- particular inputs ---------------------------------------------------------------------------

def inputs(resources: list[Recorded], name: str) -> dict[str, Any]:
    (found,) = [r.inputs for r in resources if r.name == name]
    return found


def test_concurrency_is_workers_times_threads() -> None:
    config = replace(RUN, workers=3, threads=5)
    resources = recorded(config)
    assert inputs(resources, "service")["template"]["maxInstanceRequestConcurrency"] == 15
    assert check_wiring(resources, config) == []


def test_the_push_subscription_dead_letters_to_the_kept_topic() -> None:
    resources = recorded(RUN)
    push, pull = inputs(resources, "push-subscription"), inputs(resources, "dead-letter-pull")
    assert push["deadLetterPolicy"]["deadLetterTopic"] == pull["topic"]
    assert pull["topic"] == "projects/acme-prod/topics/partner-events-dlq"
    assert push["expirationPolicy"] == pull["expirationPolicy"] == {"ttl": ""}


def test_the_function_is_pushed_to_with_auth_not_triggered_by_the_topic() -> None:
    resources = recorded(FUNCTION)
    function = inputs(resources, "function")
    push = inputs(resources, "push-subscription")
    assert "eventTrigger" not in function
    assert function["serviceConfig"]["environmentVariables"]["EVENTBUS_AUTH"] == "true"
    assert push["pushConfig"]["oidcToken"]["audience"] == push["pushConfig"]["pushEndpoint"]
    assert not [r for r in resources if r.type == "gcp:cloudrunv2/service:Service"]


def test_one_scheduled_job_each_for_relay_redrive_and_drain() -> None:
    resources = recorded(RUN)
    jobs = [r.inputs["template"]["template"]["containers"][0]["args"] for r in resources
            if r.type == "gcp:cloudrunv2/job:Job"]
    assert sorted(jobs) == [["dlq", "drain"], ["redrive", "--once"], ["relay", "--once"]]
    assert len(of_type(resources, "cloudscheduler/job:Job")) == 3


# -- the config ----------------------------------------------------------------------------------

@pytest.mark.parametrize("change, rule", [
    ({"target": "gke"}, "target must be one of"),
    ({"max_delivery_attempts": 4}, "maxDeliveryAttempts must be 5..100"),
    ({"max_delivery_attempts": 101}, "maxDeliveryAttempts must be 5..100"),
    ({"breaker_alert_seconds": 30}, "breakerAlertSeconds must be >= 60"),
    ({"backlog_alert_seconds": 30}, "backlogAlertSeconds must be >= 60"),
    ({"dead_letter_alert_messages": -1}, "deadLetterAlertMessages must be >= 0"),
    ({"delivery_health_threshold": 0.0}, "deliveryHealthThreshold must be in (0, 1]"),
    ({"delivery_health_threshold": 1.5}, "deliveryHealthThreshold must be in (0, 1]"),
    ({"max_backoff_seconds": 601}, "backoff"),
    ({"min_backoff_seconds": 700}, "backoff"),
    ({"retention_seconds": 32 * 86400}, "retention"),
    ({"workers": 0}, "workers and threads"),
    ({"min_instances": 5, "max_instances": 2}, "minInstances"),
    ({"request_timeout_seconds": 30}, "requestTimeoutSeconds"),
    ({"target": "function"}, "functionSource"),
    ({"ingress": "public"}, "ingress"),
])
def test_a_config_that_cannot_work_is_refused(change: dict[str, Any], rule: str) -> None:
    with pytest.raises(ValueError, match=re.escape(rule)):
        replace(RUN, **change)


def test_the_defaults_follow_gunicorn_and_the_pubsub_facts() -> None:
    config = stack.DeployConfig(project="p", region="r", image="i")
    assert (config.workers, config.threads, config.concurrency) == (2, 4, 8)
    assert (config.ack_deadline_seconds, config.min_backoff_seconds,
            config.max_backoff_seconds) == (60, 10, 600)
    assert (config.max_delivery_attempts, config.retention_seconds) == (100, 7 * 86400)


def test_the_pubsub_alert_thresholds_come_from_the_config() -> None:
    config = stack.from_getter({
        "project": "p", "region": "r", "image": "i", "backlogAlertSeconds": "900",
        "deadLetterAlertMessages": "10", "deliveryHealthThreshold": "0.5",
        "notificationChannels": "projects/p/notificationChannels/7"}.get)
    assert (config.backlog_alert_seconds, config.dead_letter_alert_messages,
            config.delivery_health_threshold) == (900, 10, 0.5)
    assert check_wiring(recorded(config), config) == []
    resources = recorded(config)
    for name in ("alert-push-backlog", "alert-dead-letters", "alert-delivery-health"):
        assert inputs(resources, name)["notificationChannels"] == [
            "projects/p/notificationChannels/7"]
    # checked against the default thresholds, each of the three is reported as missing
    defaults = replace(config, backlog_alert_seconds=3600, dead_letter_alert_messages=0,
                       delivery_health_threshold=1.0)
    assert check_wiring(resources, defaults) == [
        "alert: dead letters waiting on the dead-letter subscription",
        "alert: oldest unacked message on the push subscription",
        "alert: the push subscription's delivery-latency health score below threshold"]


@pytest.mark.parametrize("name, missing", [
    ("alert-push-backlog", "alert: oldest unacked message on the push subscription"),
    ("alert-dead-letters", "alert: dead letters waiting on the dead-letter subscription"),
    ("alert-delivery-health",
     "alert: the push subscription's delivery-latency health score below threshold"),
])
def test_removing_a_pubsub_alert_is_reported(name: str, missing: str) -> None:
    assert check_wiring(without(recorded(RUN), name), RUN) == [missing]


def test_pulumi_config_keys_are_camel_case_fields() -> None:
    settings = {"project": "p", "region": "r", "image": "i", "maxInstances": "20",
                "errorRateThreshold": "2.5", "notificationChannels": "a, b",
                "target": "function", "functionSource": "/tmp/s.zip", "audience": ""}
    config = stack.from_getter(settings.get)
    assert (config.max_instances, config.error_rate_threshold) == (20, 2.5)
    assert config.notification_channels == ("a", "b")
    assert (config.target, config.audience) == ("function", "")


def test_the_program_reads_pulumi_config_and_declares_the_stack() -> None:
    config = {"project": "acme-prod", "region": "europe-west1", "image": RUN.image,
              "notificationChannels": ",".join(RUN.notification_channels)}

    def declare() -> None:
        pulumi.runtime.set_all_config({f"partner-eventbus:{k}": v for k, v in config.items()})
        try:
            runpy.run_path(str(PROGRAM), run_name="__main__")  # as Pulumi runs the program
        finally:
            pulumi.runtime.set_all_config({})
            if str(PROGRAM) in str(getattr(sys.modules.get("stack"), "__file__", "")):
                del sys.modules["stack"]

    assert check_wiring(run_under_mocks(declare, project="partner-eventbus"), RUN) == []


# -- files around the stack -----------------------------------------------------------------------

def test_requirements_pin_the_versions_the_tests_ran_with() -> None:
    lines = (PROGRAM / "requirements.txt").read_text().splitlines()
    pins = dict(line.split("==") for line in lines if line and not line.startswith("#"))
    assert {"pulumi", "pulumi-gcp"} <= set(pins)
    assert pins == {name: importlib.metadata.version(name) for name in pins}


def test_pulumi_project_runs_python() -> None:
    text = (PROGRAM / "Pulumi.yaml").read_text()
    assert re.search(r"^name: partner-eventbus$", text, re.M)
    assert re.search(r"^\s+name: python$", text, re.M)


def bash(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), **(env or {})}
    return subprocess.run(["bash", *args], capture_output=True, text=True, timeout=30,
                          env=clean, check=False)


@pytest.mark.parametrize("script", ["deploy.sh", "cloud-run.sh", "cloud-function.sh"])
def test_deploy_scripts_parse(script: str) -> None:
    assert bash("-n", str(DEPLOY / script)).returncode == 0


def test_deploy_help_lists_the_variables() -> None:
    result = bash(str(DEPLOY / "deploy.sh"), "--help")
    assert result.returncode == 0
    for variable in ("PROJECT", "REGION", "MONGODB_SECRET", "IMAGE", "TARGET"):
        assert variable in result.stdout


def test_deploy_refuses_to_start_without_a_project() -> None:
    result = bash(str(DEPLOY / "deploy.sh"), env={"REGION": "europe-west1"})
    assert result.returncode != 0
    assert "PROJECT" in result.stderr


@pytest.mark.parametrize("script, target", [("cloud-run.sh", "run"),
                                            ("cloud-function.sh", "function")])
def test_old_scripts_call_deploy_with_their_target(script: str, target: str) -> None:
    text = (DEPLOY / script).read_text()
    assert re.search(rf'TARGET={target}\b.*deploy\.sh', text)


def test_every_key_deploy_sets_is_a_config_field() -> None:
    text = (DEPLOY / "deploy.sh").read_text()
    block = text.split("CONFIG_KEYS=(", 1)[1].split("\n)", 1)[0]
    keys = {key for _, key in re.findall(r'"([A-Z_]+) (\w+)"', block)}
    fields = {stack.camel(f) for f in stack.DeployConfig.__dataclass_fields__}
    assert len(keys) >= 20
    assert keys <= fields
