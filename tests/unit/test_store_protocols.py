"""The store protocol per user: each layer sees only what it uses (both stores implementing
every primitive with its signature is ``tests/contract/test_store_contract.py::TestProtocol``)."""

from __future__ import annotations

from typing import get_type_hints

import pytest

from eventbus.guard import Guard
from eventbus.outbox.relay import Relay
from eventbus.partners import Partners
from eventbus.partners.store import PartnerStore
from eventbus.processor.heartbeat import Heartbeat
from eventbus.processor.pipeline import Processor
from eventbus.rebuild.mode import ReplayProcessor, ReplayStore
from eventbus.rebuild.store import RunStore
from eventbus.store import base
from eventbus.workers.redrive import Redriver

PER_USER = {
    Processor: base.ProcessorStore, Heartbeat: base.RenewingStore, Guard: base.GuardStore,
    Partners: PartnerStore, Relay: base.OutboxStore, Redriver: base.RedriveStore,
    ReplayProcessor: ReplayStore,
}


def names(protocol: type) -> set[str]:
    """The primitives ``protocol`` declares, its bases' included."""
    return {name for klass in protocol.__mro__ if klass not in (object, base.Protocol)
            for name, value in vars(klass).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))}


@pytest.mark.parametrize("user", PER_USER, ids=lambda user: user.__name__)
def test_each_layer_takes_the_protocol_of_what_it_uses(user: type) -> None:
    # The processor names Partners for types only: it is handed them (eventbus.assembly).
    hints = get_type_hints(user.__init__, localns={"Partners": Partners})
    assert hints["store"] is PER_USER[user]


FEATURE_STORES = (PartnerStore, RunStore)
"""Protocols of a feature's own store (``eventbus.partners.store``): not the event store's."""


def test_the_whole_store_is_the_union_and_no_user_sees_the_admin_primitives() -> None:
    users = set().union(*(names(protocol) for protocol in PER_USER.values()
                          if protocol not in FEATURE_STORES))
    assert names(base.EventStore) == users | {"summaries", "reset"}
    assert not {"reset", "summaries"} & users
    assert "breaker_swap" not in names(base.OutboxStore)
    assert "claim" not in names(base.RedriveStore) | names(base.GuardStore)


def test_the_partners_store_is_its_own_and_only_the_parked_events_are_the_event_stores() -> None:
    partner_only = names(PartnerStore) - names(base.ParkedEvents)
    assert partner_only == {"breaker_get", "breaker_swap", "breakers", "rate_take",
                            "ensure_indexes"}
    assert not (partner_only - {"ensure_indexes"}) & names(base.EventStore)
    assert names(base.ParkedEvents) <= names(base.EventStore)


def test_the_event_store_protocol_has_about_thirty_members_and_the_processor_fewer() -> None:
    # Issue 41: 43 and 26 (counted so) before the partners and the rebuild runs had stores
    # of their own; the guard's four are the rest above thirty.
    assert len(names(base.EventStore)) <= 34
    assert len(names(base.ProcessorStore)) < 26


def test_the_rebuild_runs_are_their_own_store_and_its_claims_the_event_stores() -> None:
    assert names(RunStore) - {"now"} == {"rebuild_save", "rebuild_get", "rebuild_runs",
                                         "rebuild_plan_save", "rebuild_plan"}
    assert not (names(RunStore) - {"now"}) & names(base.EventStore)
    assert {"rebuild_claim_many", "rebuild_renew_many", "rebuild_finish_many"} <= names(
        base.EventStore)
