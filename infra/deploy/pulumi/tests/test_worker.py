"""The pull worker in the stack (worker.py) under Pulumi's mocks: push, pull or both.

``test_stack.py`` checks that every piece of wiring of each consumer is there (and that
removing any one resource is noticed); these tests pin what the worker's wiring must not
have: no push parts in a pull-only stack, no grant beyond the worker's own subscription and
topic, a filter pair that leaves no event to nobody, and a config that cannot work refused.
"""

from __future__ import annotations

import re
import runpy
import sys
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
from siblings import sibling

_t = sibling("test_stack")
AGENT, BOTH, PROGRAM, PULL, RUN = _t.AGENT, _t.BOTH, _t.PROGRAM, _t.PULL, _t.RUN
check_wiring, inputs, member = _t.check_wiring, _t.inputs, _t.member
of_type, recorded, run_under_mocks, stack = _t.of_type, _t.recorded, _t.run_under_mocks, _t.stack
worker = stack.worker
pytestmark = pytest.mark.filterwarnings("ignore:.*deprecated in favor of:DeprecationWarning")
IAM_GRANTS = ("pubsub/subscriptionIAMMember:SubscriptionIAMMember",
              "pubsub/topicIAMMember:TopicIAMMember",
              "secretmanager/secretIamMember:SecretIamMember",
              "serviceaccount/iAMMember:IAMMember",
              "cloudrunv2/serviceIamMember:ServiceIamMember",
              "cloudrunv2/jobIamMember:JobIamMember",
              "cloudrunv2/workerPoolIamMember:WorkerPoolIamMember")


def names(resources: list[Any]) -> set[str]:
    return {r.name for r in resources}


def grants_to(resources: list[Any], who: str) -> set[tuple[str, str, str]]:
    """(resource kind, resource name, role) of every IAM grant to ``who``, whatever its kind."""
    found = set()
    for r in resources:
        if r.inputs.get("member") != who and who not in (r.inputs.get("members") or ()):
            continue
        target = next(str(r.inputs[k]) for k in (
            "subscription", "topic", "secretId", "serviceAccountId", "name", "project")
            if k in r.inputs)
        found.add((r.type.split(":")[-1], target, r.inputs["role"]))
    return found


def container(resources: list[Any]) -> dict[str, Any]:
    pool: dict[str, Any] = inputs(resources, "worker-pool")["template"]["containers"][0]
    return pool


# -- push, pull, both ---------------------------------------------------------------------------

def test_pull_only_has_no_push_handler_no_push_subscription_and_no_push_identity() -> None:
    resources = recorded(PULL)
    assert not of_type(resources, "cloudrunv2/service:Service")
    assert not of_type(resources, "cloudfunctionsv2/function:Function")
    assert PULL.push_subscription not in {
        i["name"] for i in of_type(resources, "pubsub/subscription:Subscription")}
    assert not {"push-sa", "agent-acks-push-subscription", "agent-signs-push-tokens",
                "alert-5xx", "alert-failed-for-good", "alert-push-backlog",
                "alert-delivery-health"} & names(resources)
    assert {"worker-pool", "pull-subscription", "job-relay", "job-redrive",
            "job-dlq-drain", "alert-dead-letters"} <= names(resources)


def test_pull_only_jobs_carry_no_push_auth_settings() -> None:
    resources = recorded(PULL)
    for job in of_type(resources, "cloudrunv2/job:Job"):
        env = {e["name"] for e in job["template"]["template"]["containers"][0]["envs"]}
        assert env >= {"GOOGLE_CLOUD_PROJECT", "PUBSUB_TOPIC", "MONGODB_URI"}
        assert not env & {"EVENTBUS_AUTH", "EVENTBUS_AUTH_SERVICE_ACCOUNTS", "WEB_CONCURRENCY"}


def test_push_only_stack_has_no_worker_and_keeps_its_resources() -> None:
    resources = recorded(RUN)
    assert not {"worker-pool", "pull-subscription", "worker-sa"} & names(resources)
    assert "filter" not in inputs(resources, "push-subscription")
    assert not of_type(resources, "cloudrunv2/workerPool:WorkerPool")


def test_both_without_event_types_delivers_every_event_to_both() -> None:
    config = replace(BOTH, pull_event_types=(), pull_exactly_once=False)
    resources = recorded(config)
    assert "filter" not in inputs(resources, "push-subscription")
    assert "filter" not in inputs(resources, "pull-subscription")
    assert {"service", "worker-pool"} <= names(resources)
    assert check_wiring(resources, config) == []


def test_both_with_event_types_splits_the_topic_between_push_and_pull() -> None:
    resources = recorded(BOTH)
    pull = inputs(resources, "pull-subscription")["filter"]
    push = inputs(resources, "push-subscription")["filter"]
    assert pull == ('attributes.event_type = "PARTNER_NOTIFY" OR '
                    'attributes.event_type = "OR_MGMT"')
    # NOT on each comparison: a message without event_type (poison) is pushed, never dropped.
    assert push == ('NOT attributes.event_type = "PARTNER_NOTIFY" AND '
                    'NOT attributes.event_type = "OR_MGMT"')
    assert re.findall(r'"([^"]+)"', pull) == re.findall(r'"([^"]+)"', push)


def test_exactly_once_is_the_pull_subscriptions_option() -> None:
    assert inputs(recorded(BOTH), "pull-subscription")["enableExactlyOnceDelivery"] is True
    assert inputs(recorded(PULL), "pull-subscription")["enableExactlyOnceDelivery"] is False
    assert "enableExactlyOnceDelivery" not in inputs(recorded(BOTH), "push-subscription")


# -- least privilege -----------------------------------------------------------------------------

def test_the_worker_may_use_its_own_subscription_and_the_topic_and_nothing_else() -> None:
    for config in (PULL, BOTH):
        resources = recorded(config)
        assert grants_to(resources, member(config.worker_service_account_id, config)) == {
            ("SubscriptionIAMMember", config.pull_subscription, "roles/pubsub.subscriber"),
            ("SubscriptionIAMMember", config.pull_subscription, "roles/pubsub.viewer"),
            ("TopicIAMMember", config.topic, "roles/pubsub.publisher"),
            # The app's public topic: the worker's relay forwards to it.
            ("TopicIAMMember", "order-status", "roles/pubsub.publisher"),
            ("SecretIamMember", config.mongodb_secret_id, "roles/secretmanager.secretAccessor"),
        }


def test_no_grant_is_project_wide() -> None:
    for config in (PULL, BOTH):
        kinds = {r.type for r in recorded(config) if "IAM" in r.type or "Iam" in r.type}
        assert kinds <= {f"gcp:{kind}" for kind in IAM_GRANTS}, kinds
        assert not [r for r in recorded(config) if r.type.startswith("gcp:projects/")]


def test_only_the_worker_and_the_pubsub_agent_may_consume_the_pull_subscription() -> None:
    resources = recorded(BOTH)
    members = {i["member"] for i in
               of_type(resources, "pubsub/subscriptionIAMMember:SubscriptionIAMMember")
               if i["subscription"] == BOTH.pull_subscription}
    assert members == {member(BOTH.worker_service_account_id, BOTH), AGENT}


def test_the_worker_runs_as_its_own_account_not_the_runtime_one() -> None:
    pool = inputs(recorded(BOTH), "worker-pool")
    assert pool["template"]["serviceAccount"].startswith(f"{BOTH.worker_service_account_id}@")
    assert BOTH.worker_service_account_id != BOTH.runtime_service_account_id


# -- the worker pool ------------------------------------------------------------------------------

def test_the_worker_pool_runs_the_worker_with_its_options() -> None:
    config = replace(PULL, worker_batch_size=250, worker_concurrency=8, worker_rate=12.5,
                     worker_args=("--batch-wait-ms", "20"), worker_instances=3,
                     worker_cpu="2", worker_memory="2Gi")
    resources = recorded(config)
    ct = container(resources)
    assert ct["commands"] == ["python", "-m", "eventbus"]
    assert ct["args"] == ["worker", "--subscription", "partner-events-pull", "--batch-size",
                          "250", "--concurrency", "8", "--rate", "12.5",
                          "--batch-wait-ms", "20"]
    assert ct["resources"]["limits"] == {"cpu": "2", "memory": "2Gi"}
    pool = inputs(resources, "worker-pool")
    assert pool["scaling"] == {"scalingMode": "MANUAL", "manualInstanceCount": 3}
    assert pool["name"] == "partner-eventbus-worker"
    assert "ports" not in ct


def test_defaults_leave_concurrency_and_rate_to_the_worker() -> None:
    args = container(recorded(PULL))["args"]
    assert args == ["worker", "--subscription", "partner-events-pull", "--batch-size", "100"]


def test_zero_instances_pause_the_worker() -> None:
    resources = recorded(replace(PULL, worker_instances=0))
    assert inputs(resources, "worker-pool")["scaling"]["manualInstanceCount"] == 0


# -- config ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("change, rule", [
    ({"consumer": "queue"}, "consumer must be one of"),
    ({"consumer": "pull", "pull_event_types": ("A",)}, "pullEventTypes needs consumer both"),
    ({"consumer": "push", "pull_event_types": ("A",)}, "pullEventTypes needs consumer both"),
    ({"consumer": "both", "pull_event_types": ('A" OR attributes:x',)}, "letters, digits"),
    ({"consumer": "both", "pull_event_types": tuple(f"TYPE_{n:04d}" for n in range(9))},
     "at most 256 bytes"),
    ({"consumer": "push", "pull_exactly_once": True}, "pullExactlyOnce needs consumer"),
    ({"consumer": "push", "pull_ordered": True}, "pullOrdered needs consumer"),
    ({"consumer": "pull", "worker_instances": -1}, "workerInstances"),
    ({"consumer": "pull", "worker_batch_size": 0}, "workerBatchSize"),
    ({"consumer": "pull", "worker_rate": -1.0}, "workerRate"),
    ({"consumer": "pull", "backlog_alert_seconds": 30}, "backlogAlertSeconds"),
])
def test_a_worker_config_that_cannot_work_is_refused(change: dict[str, Any], rule: str) -> None:
    with pytest.raises(ValueError, match=re.escape(rule)):
        replace(RUN, **change)


def test_filters_up_to_pubsubs_limit_are_accepted_and_longer_ones_refused() -> None:
    types = tuple(f"TYPE_{n:04d}" for n in range(6))
    five = replace(RUN, consumer="both", pull_event_types=types[:5])
    longest = max(len(f.encode()) for f in (worker.pull_filter(five), worker.push_filter(five)))
    assert 200 < longest <= 256
    with pytest.raises(ValueError, match="at most 256 bytes"):
        replace(five, pull_event_types=types)


@pytest.mark.parametrize("raw, value", [("true", True), ("False", False), (" TRUE ", True)])
def test_boolean_config_keys_parse_true_and_false(raw: str, value: bool) -> None:
    settings = {"project": "p", "region": "r", "image": "i", "consumer": "pull",
                "pullExactlyOnce": raw}
    assert stack.from_getter(settings.get).pull_exactly_once is value


def test_a_boolean_config_key_refuses_other_words() -> None:
    settings = {"project": "p", "region": "r", "image": "i", "pullExactlyOnce": "yes"}
    with pytest.raises(ValueError, match="pullExactlyOnce must be true or false"):
        stack.from_getter(settings.get)


def test_worker_config_keys_are_camel_case_fields() -> None:
    settings = {"project": "p", "region": "r", "image": "i", "consumer": "both",
                "pullEventTypes": "A, B", "workerInstances": "2", "workerRate": "7.5",
                "workerArgs": "--max-messages,500", "backlogAlertSeconds": "600"}
    config = stack.from_getter(settings.get)
    assert (config.consumer, config.pull_event_types) == ("both", ("A", "B"))
    assert (config.worker_instances, config.worker_rate) == (2, 7.5)
    assert config.worker_args == ("--max-messages", "500")
    assert config.backlog_alert_seconds == 600


# -- outputs and the program ----------------------------------------------------------------------

def test_exports_name_the_worker_and_leave_out_push_when_pull_only() -> None:
    out = stack.exports(PULL, {})
    assert out["pullSubscription"] == "partner-events-pull"
    assert out["workerPool"] == "partner-eventbus-worker"
    assert not {"url", "pushSubscription", "pushAudience"} & set(out)
    push_only = stack.exports(RUN, {"service": SimpleNamespace(uri="https://run.example/")})
    assert push_only["url"] == "https://run.example/"
    assert not {"pullSubscription", "workerPool"} & set(push_only)


def test_the_program_deploys_a_pull_only_stack_from_pulumi_config() -> None:
    config = {"project": "acme-prod", "region": "europe-west1", "image": RUN.image,
              "notificationChannels": ",".join(RUN.notification_channels), "consumer": "pull"}

    def declare() -> None:
        import pulumi

        pulumi.runtime.set_all_config({f"partner-eventbus:{k}": v for k, v in config.items()})
        try:
            runpy.run_path(str(PROGRAM), run_name="__main__")  # as Pulumi runs the program
        finally:
            pulumi.runtime.set_all_config({})
            if str(PROGRAM) in str(getattr(sys.modules.get("stack"), "__file__", "")):
                del sys.modules["stack"]

    resources = run_under_mocks(declare, project="partner-eventbus")
    assert check_wiring(resources, PULL) == []
    assert of_type(resources, "cloudrunv2/workerPool:WorkerPool")


def test_an_ordered_worker_subscription_has_message_ordering() -> None:
    assert inputs(recorded(replace(PULL, pull_ordered=True)),
                  "pull-subscription")["enableMessageOrdering"] is True
    assert inputs(recorded(PULL), "pull-subscription").get("enableMessageOrdering") in (
        False, None)
    settings = {"project": "p", "region": "r", "image": "i", "consumer": "pull",
                "pullOrdered": "true"}
    assert stack.from_getter(settings.get).pull_ordered is True
