"""The settings' fields and the configuration reference generated from them.

Each ``Settings`` field declares its variable and doc once, in its pydantic ``Field``
(``validation_alias``, ``description``), and its rule in its type; ``VARIABLES`` and
``docs/CONFIGURATION.md`` are read from the fields.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import pytest
from pydantic import BeforeValidator, Field

from eventbus.settings import (
    REGENERATE,
    VARIABLES,
    EnvSettings,
    Positive,
    Settings,
    SettingsError,
    format_default,
    reference_markdown,
    settings_table,
    variables,
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


def test_every_settings_field_declares_its_variable_rule_and_doc() -> None:
    for name, field in Settings.model_fields.items():
        assert isinstance(field.validation_alias, str) and field.validation_alias, name
        assert field.annotation is not None, name  # its type is its rule
        assert isinstance(field.description, str) and field.description.strip(), name
        assert "\n" not in field.description, name


def test_every_default_passes_its_own_rule_as_the_reference_writes_it() -> None:
    # The reference's default, set as the variable, reads back as the default.
    for name, field in Settings.model_fields.items():
        shown = format_default(field.get_default(call_default_factory=True))
        if shown != "empty":
            variable = VARIABLES[name]
            assert Settings.from_env({variable: shown.strip("`")}) == Settings(), variable
    assert Settings().replace() == Settings()


def test_variables_are_the_fields() -> None:
    expected = {name: field.validation_alias for name, field in Settings.model_fields.items()}
    assert expected == VARIABLES == variables(Settings)
    assert len(set(VARIABLES.values())) == len(VARIABLES)  # one variable each


def test_every_variable_and_default_is_in_the_reference() -> None:
    text = reference_markdown()
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == len(Settings.model_fields)
    for (name, field), row in zip(Settings.model_fields.items(), rows, strict=True):
        assert row.startswith(f"| `{field.validation_alias}` | `{name}` |")
    assert "| `EVENTBUS_LEASE_SECONDS` | `lease_seconds` | `20` |" in text
    assert "| `EVENTBUS_RELAY_INLINE` | `relay_inline` | `true` |" in text
    assert "| `EVENTBUS_TRACE_LIBRARIES` | `trace_libraries` | `requests` |" in text


def test_an_application_declares_its_own_settings_the_same_way() -> None:
    def split(value: object) -> object:
        return value.split(",") if isinstance(value, str) else value

    class Mine(EnvSettings):
        timeout: Positive = Field(5.0, validation_alias="MINE_TIMEOUT",
                                  description="How long | at most.")
        tags: Annotated[list[str], BeforeValidator(split)] = Field(  # a fresh list each time
            default_factory=list, validation_alias="MINE_TAGS", description="Tags.")
        plain: int = 3

    assert variables(Mine) == {"timeout": "MINE_TIMEOUT", "tags": "MINE_TAGS"}
    assert Mine.read_env({"MINE_TIMEOUT": "1.5", "MINE_TAGS": "a,b"}) == \
        Mine(timeout=1.5, tags=["a", "b"])
    assert Mine().tags == [] and Mine().tags is not Mine().tags
    with pytest.raises(SettingsError, match="MINE_TIMEOUT"):
        Mine.read_env({"MINE_TIMEOUT": "0"})
    text = settings_table(Mine)
    assert "| `MINE_TIMEOUT` | `timeout` | `5` | How long \\| at most. |" in text
    assert "| `MINE_TAGS` | `tags` | empty | Tags. |" in text
    assert "plain" not in text


def test_the_operator_settings_declare_theirs_the_same_way() -> None:
    from eventbus.ops.config import VARIABLES as OPS_VARIABLES
    from eventbus.ops.config import OpsSettings

    for name, field in OpsSettings.model_fields.items():
        assert isinstance(field.validation_alias, str) and field.validation_alias, name
        assert field.description, name
    assert variables(OpsSettings) == OPS_VARIABLES
    assert "`EVENTBUS_CONSOLE_PORT` | `console_port` | `8081` |" in REFERENCE.read_text()
