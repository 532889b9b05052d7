"""Operator input (``eventbus publish``, ``eventbus replay --data``): one line, no traceback.

Whatever a file holds (deep nesting, bytes that are not UTF-8, lone
surrogates, NUL, integers past 64 bits, huge arrays), the command ends with
exit 0, 1 (some events not published) or 2 (the input is unusable), and says
why in one line per problem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus.ops import cli, jsonfile
from eventbus.store.memory import MemoryEventStore
from eventbus.testing import CapturingPublisher
from tests.hypothesis_profiles import examples

FIXTURES = HealthCheck.function_scoped_fixture
ENTITY = {"partnerId": "p-1", "entity_id": "o-1", "entity_type": "Order"}
DEEP = ["[" * 100_000 + "]" * 100_000, '{"a":' * 5_000 + "1" + "}" * 5_000,
        json.dumps({"event_type": "OR_MGMT", "entity": ENTITY,
                    "data": json.loads("[" * 300 + "]" * 300)})]


def run(argv: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    monkeypatch.setattr(cli, "publisher", lambda settings, timeout=30.0: CapturingPublisher())
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("text", DEEP, ids=["list", "object", "event-data"])
def test_deep_nesting_given_to_publish_is_one_line_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        text: str) -> None:
    path = tmp_path / "events.json"
    path.write_text(text)
    code, out, err = run(["publish", str(path)], monkeypatch, capsys)
    assert code == 2 and "Traceback" not in out + err
    assert len(err.strip().splitlines()) == 1 and "nest" in err


@pytest.mark.parametrize("text", DEEP, ids=["list", "object", "event-data"])
def test_deep_nesting_given_to_replay_data_is_one_line_and_exit_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        text: str) -> None:
    path = tmp_path / "fixed.json"
    path.write_text(text)
    monkeypatch.setattr(cli, "open_store", lambda settings: pytest.fail("read the store"))
    code, out, err = run(["replay", "some-key", "--data", str(path)], monkeypatch, capsys)
    assert code == 2 and "Traceback" not in out + err
    assert len(err.strip().splitlines()) == 1 and "nest" in err


def test_bytes_that_are_not_utf8_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "events.json"
    path.write_bytes(b'{"event_type": "\xff\xfe"}')
    code, _, err = run(["publish", str(path)], monkeypatch, capsys)
    assert code == 2 and "not UTF-8" in err and len(err.strip().splitlines()) == 1


HOSTILE_TEXT = st.text(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF,
                                     categories=None), max_size=20) | st.sampled_from(
    ["\ud800", "a\x00b", "\udfff\ud800"])
HOSTILE = st.recursive(
    st.none() | st.booleans() | HOSTILE_TEXT
    | st.integers(min_value=-(2**80), max_value=2**80) | st.floats(allow_nan=False),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(HOSTILE_TEXT, inner, max_size=4),
    max_leaves=12)


def _write(path: Path, value: Any, extra: bytes) -> None:
    text = json.dumps(value)  # lone surrogates and NUL as \\u escapes, as a tool writes them
    path.write_bytes(text.encode("utf-8") + extra)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[FIXTURES])
@given(data=HOSTILE, huge=st.integers(0, 3), extra=st.sampled_from([b"", b"\xff", b" \x00"]))
def test_whatever_the_file_holds_publish_ends_in_lines_not_a_traceback(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        data: Any, huge: int, extra: bytes) -> None:
    spec = {"event_type": "OR_MGMT", "entity": ENTITY,
            "data": {"v": data, "big": [0] * (10 ** huge)}}
    path = tmp_path / "events.json"
    _write(path, [spec, data], extra)
    code, out, err = run(["publish", str(path)], monkeypatch, capsys)
    assert code in (0, 1, 2) and "Traceback" not in out + err
    assert all(line.strip().startswith(("eventbus:", "#")) for line in (out + err).splitlines())


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[FIXTURES])
@given(data=HOSTILE, extra=st.sampled_from([b"", b"\xff"]))
def test_whatever_the_file_holds_replay_data_ends_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        data: Any, extra: bytes) -> None:
    path = tmp_path / "fixed.json"
    _write(path, data, extra)
    monkeypatch.setattr(cli, "open_store", lambda settings: MemoryEventStore())
    code, out, err = run(["replay", "k", "--data", str(path)], monkeypatch, capsys)
    assert code == 2 and "Traceback" not in out + err  # unreadable, or no such event
    assert all(line.startswith("eventbus:") for line in err.splitlines())


def test_depth_is_measured_without_recursion() -> None:
    deep: Any = 0
    for _ in range(50_000):
        deep = [deep]
    assert jsonfile.depth(deep) == 50_000 and jsonfile.depth({"a": [1, {"b": 2}]}) == 3


def test_a_replay_entrys_children_read_as_words() -> None:
    from eventbus.ops.commands.queries import children_of

    assert children_of({"children": {"duplicates": 2, "changed": [{"key": "c"}],
                                      "new": [{"key": "k"}], "emitted": True}}) == \
        "2 same, 1 changed, 1 new (emitted)"
    assert children_of({"children": {"duplicates": 0, "changed": 0, "new": []}}) == \
        "0 same, 0 changed, 0 new"
    assert children_of({"by": "ops"}) == "" and children_of({"children": "x"}) == ""
