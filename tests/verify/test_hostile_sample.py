"""Hostile sample files: one clear line per bad record, a clean exit code, never a traceback.

Hypothesis mixes lines of the partner app's recorded sample with lines that
are not records (bytes that are not UTF-8, a raw NUL, nesting deeper than
any record or than Python parses, an integer longer than Python reads, a
truncated line) and records that are JSON but hostile inside (lone
surrogates, integers past 64 bits, text with NUL). ``eventbus verify
--sample`` runs in this process on the file: every bad line is named by its
line number, every record gets a verdict, and the exit code is 0 or 1.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.hypothesis_profiles import examples
from tests.verify.recording import SAMPLE, cli_run

GOOD = [line for line in SAMPLE.read_text().splitlines() if line.strip()]
EVENTS = [line for line in GOOD if line.startswith('{"kind":"event"')]


def truncated(line: str, cut: int) -> bytes:
    return line.encode()[: max(1, min(cut, len(line) - 1))]


def with_nul(line: str, at: int) -> bytes:
    raw = line.encode()
    at = at % len(raw)
    return raw[:at] + b"\x00" + raw[at:]


def with_bad_byte(line: str, at: int) -> bytes:
    raw = line.encode()
    at = at % len(raw)
    return raw[:at] + b"\xff\xfe" + raw[at:]


def hostile_record(line: str, value: object) -> bytes:
    """A record that parses, with ``value`` in its data and its partner id."""
    document = json.loads(line)
    record = document["record"]
    record["entity_data"] = {**record.get("entity_data", {}), "x": value}
    record["entity_metadata"] = {**record["entity_metadata"], "partnerId": value}
    return json.dumps(document).encode()


BAD = st.one_of(
    st.builds(truncated, st.sampled_from(GOOD), st.integers(1, 4000)),
    st.builds(with_nul, st.sampled_from(GOOD), st.integers(0, 10_000)),
    st.builds(with_bad_byte, st.sampled_from(GOOD), st.integers(0, 10_000)),
    st.integers(40, 3000).map(lambda n: b"[" * n + b"]" * n),
    st.just(b"[" * 200_000),
    st.just(b'{"kind":"event","record":{"idempotency_key":"k","n":' + b"9" * 5000 + b"}}"),
    st.just(b'"a string"'),
    st.just(b'{"kind":"nonsense","record":{}}'),
)
HOSTILE = st.builds(hostile_record, st.sampled_from(EVENTS), st.one_of(
    st.just("\ud800"), st.just("a\x00b"), st.just(2**70), st.just(-(2**64)),
    st.text(max_size=20)))


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(["good", "bad", "hostile"]), st.data()),
                min_size=1, max_size=8))
def test_every_bad_line_is_named_and_nothing_raises(tmp_path_factory: object,
                                                    lines: list[tuple[str, st.DataObject]]
                                                    ) -> None:
    path = Path(tmp_path_factory.mktemp("hostile")) / "sample.jsonl"  # type: ignore[attr-defined]
    written: list[bytes] = []
    bad_lines: set[int] = set()
    for number, (kind, data) in enumerate(lines, 1):
        if kind == "good":
            written.append(data.draw(st.sampled_from(GOOD)).encode())
        elif kind == "bad":
            written.append(data.draw(BAD))
            bad_lines.add(number)
        else:
            written.append(data.draw(HOSTILE))
    path.write_bytes(b"\n".join(written) + b"\n")
    code, out, err = cli_run(None, "verify", "--sample", str(path), "--json",
                             "--app", "handlers:create_router")
    assert "Traceback" not in out + err
    assert code in (0, 1)
    report = json.loads(out)
    unreadable = {int(v["key"].rsplit(":", 1)[1]) for v in report["verdicts"]
                  if v["state"] == "unreadable"}
    assert unreadable == bad_lines
    assert all(v["reason"] for v in report["verdicts"] if v["state"] == "unreadable")
    if bad_lines:
        assert code == 1  # a bad line is never a silent pass
    text_code, text, _ = cli_run(None, "verify", "--sample", str(path),
                                 "--app", "handlers:create_router")
    assert text_code == code
    assert "\x00" not in text and "\ud800" not in text  # stored values are escaped
