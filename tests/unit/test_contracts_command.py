"""``eventbus contracts check|write``: exit codes, refusal of breaking changes, one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eventbus.ops import cli
from tests.hypothesis_profiles import examples

ROOT = Path(__file__).resolve().parents[2]
APP = "handlers.public:routes"  # the partner app's forwards, without a store


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_checked_in_files_are_current(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "contracts", "check", "--app", APP,
                       "--dir", str(ROOT / "docs" / "contracts"))
    assert code == 0 and "is current" in out


def test_missing_files_are_out_of_date_and_write_makes_them(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "contracts", "check", "--app", APP, "--dir", str(tmp_path))
    assert code == 1 and "out of date" in err and "contracts write" in err
    code, out, _ = run(capsys, "contracts", "write", "--app", APP, "--dir", str(tmp_path))
    assert code == 0 and "4 file(s) written" in out
    assert (tmp_path / "order-status.proto").read_text() == \
        (ROOT / "docs" / "contracts" / "order-status.proto").read_text()
    assert run(capsys, "contracts", "check", "--app", APP, "--dir", str(tmp_path))[0] == 0


def test_a_breaking_edit_of_a_published_version_exits_2_and_is_not_written(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shutil.copytree(ROOT / "docs" / "contracts", tmp_path / "contracts")
    published = tmp_path / "contracts" / "order-status" / "v1.schema.json"
    schema = json.loads(published.read_text())
    schema["properties"]["region"] = {"type": "string"}  # as if v1 had promised a field
    schema["required"].append("region")
    published.write_text(json.dumps(schema))
    code, _, err = run(capsys, "contracts", "check", "--app", APP,
                       "--dir", str(tmp_path / "contracts"))
    assert code == 2 and "field 'region' was removed" in err
    code, _, err = run(capsys, "contracts", "write", "--app", APP,
                       "--dir", str(tmp_path / "contracts"))
    assert code == 2 and "refused" in err and "new version" in err
    assert json.loads(published.read_text()) == schema


def test_an_app_path_that_is_not_a_router_is_one_line(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    code, _, err = run(capsys, "contracts", "check", "--app", "handlers.public:TOPIC")
    assert code == 2 and err.count("\n") == 1
    assert "not a Router, a function returning one, or an app" in err


HOSTILE_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**80), max_value=2**80)
    | st.text(alphabet=st.characters(blacklist_categories=()), max_size=8)
    | st.sampled_from(["\ud800", "a\x00b"]),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(["properties", "required", "type", "const", "x"]),
                      inner, max_size=4),
    max_leaves=20)


@settings(max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(
    HOSTILE_JSON.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=64),
    st.just(b"[" * 100_000 + b"]" * 100_000),
    st.just(b"\xff\xfe{}"),
    st.just(json.dumps({"properties": list(range(100_000))}).encode())))
def test_a_hostile_published_schema_is_one_line_never_a_traceback(
        capsys: pytest.CaptureFixture[str], tmp_path_factory: pytest.TempPathFactory,
        content: bytes) -> None:
    directory = tmp_path_factory.mktemp("contracts")
    shutil.copytree(ROOT / "docs" / "contracts", directory, dirs_exist_ok=True)
    (directory / "order-status" / "v1.schema.json").write_bytes(content)
    for action in ("check", "write"):
        code, _, err = run(capsys, "contracts", action, "--app", APP, "--dir", str(directory))
        assert code in (1, 2) and "Traceback" not in err and err.strip(), (action, err)
        if code == 2 and "not a JSON Schema" in err:
            assert err.count("\n") == 1
