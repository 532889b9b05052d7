"""The checked-in contract files of an app: render, compare, write.

``docs/contracts/`` (any directory) holds, for each public topic the app's
router forwards to:

* ``<topic>.proto``: the topic's Pub/Sub schema (``schemas.proto``);
* ``<topic>/<version>.schema.json``: each served version's JSON Schema;
* ``topics.json``: the manifest the deployment and the emulator script read
  (topic -> contract, versions, schema file, message name).

``check`` says which files are out of date and which changes would break a
published version; ``write`` refuses a breaking change and writes the rest.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from eventbus.contracts.compat import breaking
from eventbus.contracts.schemas import json_schema, message_name, proto
from eventbus.model.forward import Forwards

MANIFEST = "topics.json"


class BreakingChange(ValueError):
    """A change to a published contract version that its consumers would not survive."""


class UnreadableContract(ValueError):
    """A checked-in contract file that is not a JSON Schema (not JSON, not UTF-8, too deep)."""


@dataclasses.dataclass
class Report:
    """What ``check`` found: files to (re)write, and changes that break a published version."""

    stale: list[str] = dataclasses.field(default_factory=list)
    breaking: list[str] = dataclasses.field(default_factory=list)

    @property
    def current(self) -> bool:
        """True when the files are exactly what the app declares."""
        return not self.stale and not self.breaking


def render(forwards: Forwards, directory: Path) -> dict[str, str]:
    """Every file's text by its path relative to ``directory`` (proto numbers from there)."""
    files: dict[str, str] = {}
    topics: dict[str, object] = {}
    for topic, contracts in forwards.topics().items():
        files[f"{topic}.proto"] = proto(topic, contracts, _read(directory / f"{topic}.proto"))
        for contract in contracts:
            files[f"{topic}/{contract.version}.schema.json"] = _json(json_schema(contract))
        topics[topic] = {"contract": contracts[0].name,
                         "versions": [c.version for c in contracts],
                         "schema": f"{topic}.proto", "message": message_name(contracts[0].name)}
    files[MANIFEST] = _json({"topics": topics})
    return files


def check(forwards: Forwards, directory: Path) -> Report:
    """Compare the app's contracts with the files in ``directory``."""
    files, report = render(forwards, directory), Report()
    for relative in sorted(set(files) | _ours(directory)):
        if files.get(relative) != _read(directory / relative):
            report.stale.append(relative)
    for relative in sorted(_published(directory)):
        old = _schema(directory / relative, relative)
        if relative not in files:
            report.breaking.append(f"{relative}: a published version is no longer served")
            continue
        report.breaking += [f"{relative}: {problem}"
                            for problem in breaking(old, json.loads(files[relative]))]
    return report


def write(forwards: Forwards, directory: Path) -> list[str]:
    """Write what is out of date; ``BreakingChange`` (and nothing written) if it would break."""
    report = check(forwards, directory)
    if report.breaking:
        raise BreakingChange("; ".join(report.breaking))
    files = render(forwards, directory)
    for relative in report.stale:
        target = directory / relative
        if relative in files:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(files[relative], encoding="utf-8")
        else:
            target.unlink()
    return report.stale


def _ours(directory: Path) -> set[str]:
    """The files in ``directory`` that ``render`` makes (other files are left alone)."""
    if not directory.is_dir():
        return set()
    found = {p.name for p in directory.glob("*.proto")} | _published(directory)
    return found | ({MANIFEST} if (directory / MANIFEST).exists() else set())


def _published(directory: Path) -> set[str]:
    if not directory.is_dir():
        return set()
    return {p.relative_to(directory).as_posix() for p in directory.glob("*/v*.schema.json")}


def _schema(path: Path, relative: str) -> dict[str, object]:
    """A published version's JSON Schema; ``UnreadableContract`` (one line) if it is none."""
    try:
        found = json.loads(path.read_bytes().decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # bad UTF-8 or JSON, hostile nesting
        raise UnreadableContract(f"{relative}: not a JSON Schema: {type(exc).__name__}") from None
    if not isinstance(found, dict):
        raise UnreadableContract(f"{relative}: not a JSON Schema: a JSON {type(found).__name__}")
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")  # compared, never parsed
    except (FileNotFoundError, NotADirectoryError):
        return ""


def _json(value: object) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False) + "\n"
