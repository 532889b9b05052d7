"""Public contracts: the typed, versioned shape of what a dedicated topic carries.

A contract is a frozen dataclass marked with ``@contract(name, version)``::

    @contract("order-status", "v1")
    @dataclasses.dataclass(frozen=True)
    class OrderStatusV1:
        order_id: int
        status: str
        partner_id: str
        changed_at: int | None = None      # optional: may be absent

Field types are JSON's: ``str``, ``int`` (64-bit), ``float``, ``bool``, a
``list`` of one of those, and ``X | None`` for an optional field (default
``None``). Anything else is refused when the class is declared. The body a
consumer reads is ``{"version": "v1", <fields>}``; optional fields that have
no value are left out. ``Contract.body`` checks every value against the
field's type, so a message is never published half-built.

Hand-written rather than pydantic or dataclasses-json: the model layer imports
only the standard library, and five JSON types are all a contract needs.
"""

from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from eventbus.model import content

T = TypeVar("T")
KINDS: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
VERSION_FIELD = "version"
_NAME = re.compile(r"^[a-z][a-z0-9-]{1,62}$")
_VERSION = re.compile(r"^v[1-9][0-9]{0,3}$")
_FIELD = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_INT64 = (-(2**63), 2**63 - 1)


class ContractError(ValueError):
    """A contract or a forwarding declaration that cannot work; raised at declaration."""


class ContractViolation(ValueError):
    """An event whose values cannot fill a contract; recorded on the event, never published."""


@dataclasses.dataclass(frozen=True)
class ContractField:
    """One field of a contract: its JSON kind, whether it is a list, whether it is required."""

    name: str
    kind: str
    repeated: bool = False
    required: bool = True
    doc: str = ""

    def check(self, value: Any) -> None:
        """Raise ``ContractViolation`` unless ``value`` is of this field's type."""
        items = value if self.repeated else [value]
        if self.repeated and not isinstance(value, list):
            raise ContractViolation(f"{self.name}: expected a list, got {type(value).__name__}")
        for item in items:
            if not _fits(self.kind, item):
                shown = content.bounded_text(repr(item), 80)
                raise ContractViolation(f"{self.name}: expected {self.kind}, got "
                                        f"{type(item).__name__} {shown}")


def _fits(kind: str, value: Any) -> bool:
    if kind == "boolean":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "integer":
        return isinstance(value, int) and _INT64[0] <= value <= _INT64[1]
    if kind == "number":
        return isinstance(value, int | float) and math.isfinite(value)
    return isinstance(value, str) and _valid_text(value)


def _valid_text(text: str) -> bool:
    try:
        text.encode("utf-8")  # a lone surrogate has no UTF-8: no consumer could read it
    except UnicodeEncodeError:
        return False
    return True


@dataclasses.dataclass(frozen=True)
class Contract:
    """Version ``version`` of the public contract ``name``, with its fields in order."""

    name: str
    version: str
    fields: tuple[ContractField, ...]
    doc: str = ""

    @property
    def ref(self) -> str:
        """``name@version``, how errors and operators name it."""
        return f"{self.name}@{self.version}"

    def field(self, name: str) -> ContractField | None:
        """The field called ``name``, or None."""
        return next((f for f in self.fields if f.name == name), None)

    def body(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """The message body for ``values``; ``ContractViolation`` if they do not fit."""
        body: dict[str, Any] = {VERSION_FIELD: self.version}
        for spec in self.fields:
            value = values.get(spec.name)
            if value is None:
                if spec.required:
                    raise ContractViolation(f"{spec.name}: required, but the event has no value")
                continue
            spec.check(value)
            body[spec.name] = value
        found = content.problem(body)  # e.g. a list too large to publish
        if found:
            raise ContractViolation(f"the body cannot be published: {found}")
        return body


def contract(name: str, version: str) -> Callable[[type[T]], type[T]]:
    """Mark a dataclass as version ``version`` of contract ``name``; check its fields now."""
    def mark(cls: type[T]) -> type[T]:
        cls.__contract__ = declared(cls, name, version)  # type: ignore[attr-defined]
        return cls
    return mark


def declared(cls: type, name: str, version: str) -> Contract:
    """The ``Contract`` a dataclass declares; ``ContractError`` for what JSON cannot carry."""
    if not _NAME.match(name):
        raise ContractError(f"contract name {name!r}: lowercase letters, digits and '-'")
    if not _VERSION.match(version):
        raise ContractError(f"contract {name!r}: version {version!r} is not v1, v2, ...")
    if not dataclasses.is_dataclass(cls):
        raise ContractError(f"contract {name}@{version}: {cls.__name__} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = tuple(_field(name, version, f, hints[f.name]) for f in dataclasses.fields(cls))
    doc = (cls.__doc__ or "").strip()
    if doc.startswith(f"{cls.__name__}("):  # the signature dataclasses writes when there is none
        doc = ""
    return Contract(name, version, fields, doc)


def contract_of(model: Any) -> Contract:
    """The ``Contract`` of a class marked with ``@contract`` (or a ``Contract`` itself)."""
    if isinstance(model, Contract):
        return model
    found = getattr(model, "__contract__", None)
    if not isinstance(found, Contract):
        raise ContractError(f"{getattr(model, '__name__', model)!r} is not marked @contract")
    return found


def _field(name: str, version: str, spec: dataclasses.Field[Any], hint: Any) -> ContractField:
    where = f"contract {name}@{version}, field {spec.name!r}"
    if not _FIELD.match(spec.name) or spec.name == VERSION_FIELD:
        raise ContractError(f"{where}: names are snake_case and 'version' is the contract's own")
    optional = _is_optional(hint)
    if optional:
        hint = next(arg for arg in typing.get_args(hint) if arg is not type(None))
        if spec.default is not None:
            raise ContractError(f"{where}: an optional field defaults to None")
    repeated = typing.get_origin(hint) is list
    if repeated:
        (hint,) = typing.get_args(hint) or (None,)
    if hint not in KINDS:
        raise ContractError(f"{where}: {hint!r} is not str, int, float, bool, a list of one, "
                            "or one of those | None")
    return ContractField(spec.name, KINDS[hint], repeated, not optional,
                         str(spec.metadata.get("doc", "")))


def _is_optional(hint: Any) -> bool:
    origin = typing.get_origin(hint)
    union = origin is typing.Union or origin is types.UnionType
    args = typing.get_args(hint)
    if union and (len(args) != 2 or type(None) not in args):
        raise ContractError(f"{hint!r}: a union other than X | None has no JSON shape")
    return union
