"""``main.py``: gunicorn's ``app`` and the functions-framework target behave the same."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from typing import Any

import functions_framework
import pytest
from pymongo.database import Database

from tests import golden

NAME = "wrapped_production.json"


@pytest.fixture()
def main_module(monkeypatch: pytest.MonkeyPatch, mongo_uri: str,
                mongo_db: Database) -> Iterator[Any]:
    monkeypatch.setenv("MONGODB_URI", mongo_uri)
    monkeypatch.setenv("MONGODB_DB", mongo_db.name)
    sys.modules.pop("main", None)
    main = importlib.import_module("main")
    yield main
    # This import of main.py, and functions-framework's own (it loads the source again, as
    # ``main``): what each built ends here, its processor's threads and its store's client.
    loaded = {id(module): module for module in (main, sys.modules.pop("main", None))
              if module is not None}
    for module in loaded.values():
        service = module.app.extensions["eventbus"]
        service.processor.close()
        service.store.close()


def post_golden(client: Any) -> Any:
    return client.post("/", data=golden.body_bytes(NAME), headers=golden.load(NAME)["headers"])


def test_gunicorn_app_and_function_target_give_the_same_answers(main_module: Any,
                                                                mongo_db: Database) -> None:
    first = post_golden(main_module.app.test_client())
    function_app = functions_framework.create_app(target="pubsub_push", source="main.py",
                                                  signature_type="http")
    second = post_golden(function_app.test_client())
    assert first.status_code == second.status_code == 200
    assert (first.json["outcome"], second.json["outcome"]) == ("processed", "duplicate")
    assert first.json["idempotency_key"] == second.json["idempotency_key"]
    assert mongo_db.partner_events.count_documents({"record_type": {"$ne": "entity"}}) == 1
    # The order handler is ordered (ordered_by): its entity's record sits beside the event.
    assert mongo_db.partner_events.count_documents({"record_type": "entity"}) == 1


def test_function_target_answers_400_for_a_non_delivery(main_module: Any) -> None:
    function_app = functions_framework.create_app(target="pubsub_push", source="main.py",
                                                  signature_type="http")
    response = function_app.test_client().post("/", data=b"nope")
    assert response.status_code == 400 and response.json["error"] == "bad_request"
