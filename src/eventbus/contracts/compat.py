"""Is a contract version still what its consumers were promised?

A published version (its JSON Schema, checked in under ``docs/contracts/``)
may only grow: a new optional field is additive. A removed field, a field
whose type changed, a field that became required, and a required field
that became optional (readers rely on it) break the version's consumers; a
change like that is a new version (``v2``), served beside the old one while
consumers move.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def breaking(published: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Every change from ``published`` to ``current`` that breaks a consumer; [] if additive."""
    old, new = _properties(published), _properties(current)
    was, now = _required(published), _required(current)
    problems = [f"field {name!r} was removed" for name in sorted(set(old) - set(new))]
    for name in sorted(set(old) & set(new)):
        if _shape(old[name]) != _shape(new[name]):
            problems.append(f"field {name!r} changed type: {_shape(old[name])} -> "
                            f"{_shape(new[name])}")
    problems += [f"field {name!r} is newly required" for name in sorted(now - was)]
    problems += [f"field {name!r} is no longer required" for name in sorted(was - now)
                 if name in new]
    return problems


def _properties(schema: Mapping[str, Any]) -> Mapping[str, Any]:
    found = schema.get("properties", {})
    return found if isinstance(found, Mapping) else {}


def _required(schema: Mapping[str, Any]) -> set[str]:
    found = schema.get("required", [])
    return {name for name in found if isinstance(name, str)} if isinstance(found, list) else set()


def _shape(prop: Any) -> str:
    """The type of a property without its description: what a reader depends on."""
    if not isinstance(prop, Mapping):
        return f"not a schema ({type(prop).__name__})"
    if "const" in prop:
        return f"const {prop['const']!r}"
    if prop.get("type") == "array":
        return f"array of {_shape(prop.get('items', {}))}"
    return str(prop.get("type"))
