"""Public topics in the stack (public.py) under Pulumi's mocks: schema, topic, consumers' grants.

``test_stack.py`` checks every piece of wiring is there (and that removing any one resource
is noticed); these pin what a consumer must not get (the bus, another subscription, anything
project-wide) and the consumer settings that are refused.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from siblings import sibling

_t = sibling("test_stack")
BOTH, FULFILMENT, RUN, of_type, recorded, stack = (_t.BOTH, _t.FULFILMENT, _t.RUN, _t.of_type,
                                                   _t.recorded, _t.stack)
grants_to = sibling("test_worker").grants_to
pytestmark = pytest.mark.filterwarnings("ignore:.*deprecated in favor of:DeprecationWarning")


def test_a_consumer_may_read_its_own_subscription_and_nothing_else() -> None:
    resources = recorded(BOTH)
    assert grants_to(resources, FULFILMENT) == {
        ("SubscriptionIAMMember", "order-status-fulfilment", "roles/pubsub.subscriber")}
    assert not [r for r in resources if r.type.startswith("gcp:projects/")]


def test_a_consumer_of_one_version_gets_a_filter_and_one_of_all_versions_none() -> None:
    subscriptions = {i["name"]: i for i in
                     of_type(recorded(BOTH), "pubsub/subscription:Subscription")}
    assert subscriptions["order-status-fulfilment"]["filter"] == \
        'attributes.contract_version = "v2"'
    assert "filter" not in subscriptions["order-status-audit"]
    assert subscriptions["order-status-audit"]["topic"] == "projects/acme-prod/topics/order-status"


def test_the_topic_carries_the_checked_in_schema_and_every_served_version() -> None:
    (schema,) = of_type(recorded(RUN), "pubsub/schema:Schema")
    checked_in = (Path(stack.public.DEFAULT_CONTRACTS) / "order-status.proto").read_text()
    assert schema["definition"] == checked_in
    assert stack.public.manifest(RUN)["order-status"]["versions"] == ["v1", "v2"]


def test_without_consumers_there_are_no_public_subscriptions() -> None:
    names = {i["name"] for i in of_type(recorded(RUN), "pubsub/subscription:Subscription")}
    assert not {n for n in names if n.startswith("order-status")}


@pytest.mark.parametrize(("item", "problem"), [
    ("fulfilment:order-status:v2", "is not NAME:TOPIC:VERSION:MEMBER"),
    ("Fulfil:order-status:v2:user:a@b.example", "lowercase letters"),
    ("f:partner-events:v1:user:a@b.example", "is not a public topic of the app"),
    ("f:order-status:v9:user:a@b.example", "version 'v9' is not served"),
    ("f:order-status:v1:allUsers", "the member is serviceAccount:"),
])
def test_a_consumer_setting_that_cannot_work_is_refused(item: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        replace(RUN, public_consumers=(item,))


def test_a_contracts_dir_without_a_manifest_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"no topics\.json"):
        replace(RUN, public_contracts=str(tmp_path))
