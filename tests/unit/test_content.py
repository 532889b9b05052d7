"""The salvage rule's checks: what a store keeps, and the fast path that skips the walk."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eventbus.model import content
from eventbus.model.keys import canonical_json
from tests.hypothesis_profiles import examples


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(("document", "words"), [
    ({"n": 2**63}, "64 bits"), ({"n": -(2**63) - 1}, "64 bits"), ({"a\x00b": 1}, "NUL"),
    ({"s": "\ud800"}, "surrogate"), ({"\udfff": 1}, "surrogate"),
    ({"d": nested(content.MAX_DEPTH)}, "deeper"), ({"d": nested(5000)}, "deeper"),
    ({"z": [0] * 3_000_000}, "MiB"), ({1: 2}, "not text"),
], ids=["int64+", "int64-", "nul-key", "surrogate", "surrogate-key", "depth-48", "depth-5000",
        "3M-zeros", "int-key"])
def test_what_no_store_keeps_is_named(document: Any, words: str) -> None:
    found = content.problem(document)
    assert found is not None and words in found
    if words in ("64 bits", "NUL", "surrogate"):
        # The fast path is never sure of what the walk refuses.
        assert not content.surely_storable(canonical_json(document))


@pytest.mark.parametrize("document", [
    {"n": 2**63 - 1, "m": -(2**63)}, {"a.b": 1, "$x": 2, "": 3}, {"d": nested(40)},
    {"s": "é\u202e\ufffe", "nul in a value": "a\x00b"}, {"f": 1e308},
])
def test_what_every_store_keeps_passes(document: Any) -> None:
    assert content.problem(document) is None


JSON = st.recursive(
    st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=False),
              st.text(max_size=8), st.sampled_from(["\ud800", "\x00", "9" * 20]), st.none()),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.one_of(st.text(max_size=4),
                                                      st.sampled_from(["\x00k", "\udc00"])),
                                            inner, max_size=3)),
    max_leaves=25)


@settings(max_examples=examples(300), deadline=None)
@given(value=JSON)
def test_the_fast_path_never_passes_what_the_walk_refuses(value: Any) -> None:
    document = {"v": value}
    text = canonical_json(document)
    if content.surely_storable(text):
        assert content.problem(document) is None
    assert content.problem(document, text) == content.problem(document) or \
        content.problem(document) is not None


def test_bounded_text_keeps_any_bytes_readable_and_short() -> None:
    assert content.bounded_text(b"\xff" * 100_000).startswith("\\xff")
    assert len(content.bounded_text(b"\xff" * 100_000)) == content.RAW_PAYLOAD_CHARS
    kept = content.bounded_text("a\x00\ud800")
    assert kept == "a\\x00\\xed\\xa0\\x80" and kept.isascii()
    summary = content.payload_summary(b"abc")
    assert summary["payload_size"] == 3 and len(summary["payload_sha256"]) == 64


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


@pytest.mark.parametrize(("exc", "stored"), [
    (ValueError("plain é"), "plain é"),
    (ValueError("a\x00\ud800"), "a\\x00\\xed\\xa0\\x80"),
    (KeyError("k"), "'k'"),
    (Unprintable("x"), "<Unprintable: message unavailable>"),
])
def test_error_text_is_storable_whatever_the_exception(exc: Exception, stored: str) -> None:
    assert content.error_text(exc) == stored


def test_error_text_cuts_a_huge_message_before_escaping_it() -> None:
    text = content.error_text(ValueError("\x00" * 10_000_000), limit=100)
    assert text == "\\x00" * 25
