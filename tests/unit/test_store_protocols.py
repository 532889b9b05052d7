"""The store protocol per user: each layer sees only what it uses (both stores implementing
every primitive with its signature is ``tests/contract/test_store_contract.py::TestProtocol``)."""

from __future__ import annotations

from typing import get_type_hints

import pytest

from eventbus.guard import Guard
from eventbus.outbox.relay import Relay
from eventbus.partners import Partners
from eventbus.processor.heartbeat import Heartbeat
from eventbus.processor.pipeline import Processor
from eventbus.rebuild.mode import ReplayProcessor, ReplayStore
from eventbus.store import base
from eventbus.workers.redrive import Redriver

PER_USER = {
    Processor: base.ProcessorStore, Heartbeat: base.RenewingStore, Guard: base.GuardStore,
    Partners: base.PartnerStore, Relay: base.OutboxStore, Redriver: base.RedriveStore,
    ReplayProcessor: ReplayStore,
}


def names(protocol: type) -> set[str]:
    """The primitives ``protocol`` declares, its bases' included."""
    return {name for klass in protocol.__mro__ if klass not in (object, base.Protocol)
            for name, value in vars(klass).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))}


@pytest.mark.parametrize("user", PER_USER, ids=lambda user: user.__name__)
def test_each_layer_takes_the_protocol_of_what_it_uses(user: type) -> None:
    assert get_type_hints(user.__init__)["store"] is PER_USER[user]


def test_the_whole_store_is_the_union_and_no_user_sees_the_admin_primitives() -> None:
    users = set().union(*(names(protocol) for protocol in PER_USER.values()))
    assert names(base.EventStore) == users | {"summaries", "reset"}
    assert not {"reset", "summaries"} & users
    assert "breaker_swap" not in names(base.OutboxStore)
    assert "claim" not in names(base.RedriveStore) | names(base.GuardStore)
