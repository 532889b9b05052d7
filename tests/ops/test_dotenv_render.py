"""The ``.env`` file (python-dotenv, hostile lines included), its loading rules, safe output."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from eventbus.ops import config
from eventbus.ops.render import duration, moment, safe, table, to_json

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("line", "expected"), [
    ("A=1", ("A", "1")),
    ("export A=1", ("A", "1")),
    ("A = spaced ", ("A", "spaced")),
    ("A=x # comment", ("A", "x")),
    ("A=x#not-a-comment", ("A", "x#not-a-comment")),
    ("A='single # kept $HOME'", ("A", "single # kept $HOME")),
    ('A="double\\nline \\"q\\" \\\\"', ("A", 'double\nline "q" \\')),
    ('A="x" # trailing comment', ("A", "x")),
    ("A=", ("A", "")),
    ("A=mongodb://h:1/?a=b&c=d", ("A", "mongodb://h:1/?a=b&c=d")),
    ("A_1=ünïcode", ("A_1", "ünïcode")),
])
def test_lines_that_parse(line: str, expected: tuple[str, str]) -> None:
    assert config.env_file_values(line) == dict([expected])


@pytest.mark.parametrize("line", [
    "no equals sign", "=value", "1A=x", "A B=x", "A-B=x", "A='unterminated",
    'A="unterminated', 'A="x" junk', "A='x' junk", "A=\x00", 'A="\\0x\x00"', "$(rm -rf /)=x",
    "A;B=1", "A\x1b[2J=1",
])
def test_hostile_lines_are_skipped(line: str) -> None:
    assert config.env_file_values(line) == {}


def test_unparsed_lines_are_reported_and_later_lines_win(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        values = config.env_file_values("# c\n\nA=1\nnonsense\nA=2\n  B=3  \nA='open\n")
    assert values == {"A": "2", "B": "3"}
    assert "line 7" in caplog.text  # python-dotenv names the line it could not parse


def test_load_finds_the_file_up_to_the_git_root_and_the_environment_wins(
        tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".env").write_text("MONGODB_DB=from_file\nPUBSUB_TOPIC=t\n")
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    env = {"PUBSUB_TOPIC": "from_shell"}
    assert config.load_env_file(deep, env) == tmp_path / ".env"
    assert env == {"PUBSUB_TOPIC": "from_shell", "MONGODB_DB": "from_file"}


def test_a_file_above_the_git_root_is_not_ours(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("A=1\n")
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    env: dict[str, str] = {}
    assert config.load_env_file(repo, env) is None and env == {}


def test_an_oversized_file_is_ignored(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".env").write_text("A=1\n" + "#" * config.MAX_ENV_BYTES)
    env: dict[str, str] = {}
    assert config.load_env_file(tmp_path, env) is None and env == {}


def test_the_console_script_reads_dot_env_in_a_fresh_shell(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".env").write_text("PUBSUB_TOPIC=from-dot-env\nEVENTBUS_MAX_ATTEMPTS=oops\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PUBSUB_", "EVENTBUS_", "MONGODB_"))}
    done = subprocess.run([sys.executable, "-m", "eventbus", "status"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    # The bad value came from the file: proof that the file was read, before any server.
    assert done.returncode == 2 and "EVENTBUS_MAX_ATTEMPTS" in done.stderr
    env["EVENTBUS_MAX_ATTEMPTS"] = "7"
    script = ("import os; from eventbus.ops import config; config.load_env_file(); "
              "print(os.environ['PUBSUB_TOPIC'], os.environ['EVENTBUS_MAX_ATTEMPTS'])")
    again = subprocess.run([sys.executable, "-c", script],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                           check=False)
    assert again.stdout.split() == ["from-dot-env", "7"]


# -- safe output ----------------------------------------------------------------------------

@pytest.mark.parametrize(("raw", "shown"), [
    ("plain text, ünïcode ✓", "plain text, ünïcode ✓"),
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),
    ("a\nb\rc\td", "a\\x0ab\\x0dc\\x09d"),
    ("bell\x07 del\x7f c1\x9b", "bell\\x07 del\\x7f c1\\x9b"),
    ("rtl\u202eevil\u2066", "rtl\\u202eevil\\u2066"),
    ("zero\u200bwidth\ufeff", "zero\\u200bwidth\\ufeff"),
    ("lone \ud800 surrogate", "lone \\ud800 surrogate"),
])
def test_safe_escapes_what_a_terminal_would_act_on(raw: str, shown: str) -> None:
    assert safe(raw) == shown
    safe(raw).encode("utf-8")  # always printable


def test_tables_escape_and_clip_cells() -> None:
    text = table(["a", "b"], [["\x1b]0;x\x07", "y" * 100], [None, 3]], width=10)
    lines = text.splitlines()
    assert lines[0].split() == ["a", "b"] and "\x1b" not in text
    assert lines[2].endswith("yyyyyyyyy…") and lines[3].split() == ["3"]


def test_json_output_is_ascii_and_dates_are_iso() -> None:
    import datetime as dt

    out = to_json({"k": "\x1b\ud800é", "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC)})
    assert out.isascii() and json.loads(out)["at"] == "2026-01-01T00:00:00+00:00"


def test_times_and_durations() -> None:
    assert moment("1655292809853") == "2022-06-15 11:33:29.853Z"
    assert moment("\x1bnot-a-time") == "\\x1bnot-a-time" and moment(None) == ""
    assert [duration(v) for v in (None, 850, 12_340, 245_000, 7_380_000)] == [
        "", "850ms", "12.3s", "4m05s", "2h03m"]
