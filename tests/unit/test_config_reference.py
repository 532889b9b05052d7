"""The settings' metadata and the configuration reference generated from it.

Each ``Settings`` field declares its variable, parser and doc once (``setting``);
``SOURCES`` and ``docs/CONFIGURATION.md`` are derived from that metadata.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from eventbus.settings import (
    REGENERATE,
    SOURCES,
    Settings,
    SettingsError,
    parse_float,
    read_env,
    reference_markdown,
    setting,
    settings_table,
    sources,
)

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "CONFIGURATION.md"


def test_the_configuration_reference_is_up_to_date() -> None:
    from eventbus.ops.config import reference_markdown as whole_reference

    written = REFERENCE.read_text(encoding="utf-8") if REFERENCE.exists() else ""
    assert written == whole_reference(), (
        f"docs/CONFIGURATION.md is out of date; regenerate it with: {REGENERATE}")


def test_the_reference_names_its_regeneration_command() -> None:
    assert REGENERATE in reference_markdown()
    assert (ROOT / REGENERATE.split()[-1]).exists()


def test_every_settings_field_declares_its_variable_parser_and_doc() -> None:
    for field in dataclasses.fields(Settings):
        meta = field.metadata
        assert isinstance(meta.get("env"), str) and meta["env"], field.name
        assert callable(meta.get("parse")), field.name
        assert isinstance(meta.get("doc"), str) and meta["doc"].strip(), field.name
        assert "\n" not in meta["doc"], field.name


def test_sources_are_the_metadata() -> None:
    expected = {field.name: (field.metadata["env"], field.metadata["parse"])
                for field in dataclasses.fields(Settings)}
    assert expected == SOURCES == sources(Settings)
    assert len({var for var, _ in SOURCES.values()}) == len(SOURCES)  # one variable each


def test_every_variable_and_default_is_in_the_reference() -> None:
    text = reference_markdown()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == len(dataclasses.fields(Settings))
    for field, row in zip(dataclasses.fields(Settings), rows, strict=True):
        assert row.startswith(f"| `{field.metadata['env']}` | `{field.name}` |")
    assert "| `EVENTBUS_LEASE_SECONDS` | `lease_seconds` | `20` |" in text
    assert "| `EVENTBUS_RELAY_INLINE` | `relay_inline` | `true` |" in text
    assert "| `EVENTBUS_TRACE_LIBRARIES` | `trace_libraries` | `requests` |" in text


def test_an_application_declares_its_own_settings_the_same_way() -> None:
    @dataclasses.dataclass(frozen=True)
    class Mine:
        timeout: float = setting(5.0, env="MINE_TIMEOUT", parse=parse_float,
                                 doc="How long | at most.")
        tags: list[str] = setting(  # noqa: RUF009 (a factory: a fresh list each time)
            env="MINE_TAGS", parse=lambda v: v.split(","), doc="Tags.", default_factory=list)
        plain: int = 3

    assert sources(Mine) == {"timeout": ("MINE_TIMEOUT", parse_float),
                             "tags": ("MINE_TAGS", Mine.__dataclass_fields__["tags"]
                                      .metadata["parse"])}
    assert read_env(Mine, sources(Mine), {"MINE_TIMEOUT": "1.5", "MINE_TAGS": "a,b"}) == \
        Mine(1.5, ["a", "b"])
    assert Mine().tags == [] and Mine().tags is not Mine().tags
    with pytest.raises(SettingsError, match="MINE_TIMEOUT"):
        read_env(Mine, sources(Mine), {"MINE_TIMEOUT": "0"})
    text = settings_table(Mine)
    assert "| `MINE_TIMEOUT` | `timeout` | `5` | How long \\| at most. |" in text
    assert "| `MINE_TAGS` | `tags` | empty | Tags. |" in text
    assert "plain" not in text


def test_the_operator_settings_declare_theirs_the_same_way() -> None:
    from eventbus.ops.config import SOURCES as OPS_SOURCES
    from eventbus.ops.config import OpsSettings

    for field in dataclasses.fields(OpsSettings):
        assert field.metadata.get("env") and callable(field.metadata.get("parse")), field.name
        assert field.metadata.get("doc"), field.name
    assert sources(OpsSettings) == OPS_SOURCES
    assert "`EVENTBUS_CONSOLE_PORT` | `console_port` | `8081` |" in REFERENCE.read_text()
