"""Every module and name the docs mention exists: the docs cannot drift from the code."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
        ROOT / "infra" / "deploy" / "README.md"]
DOTTED = re.compile(r"\beventbus(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
PATHS = re.compile(r"`((?:src|handlers|infra|tests|bench|examples|docs)/"
                   r"[\w./-]+\.(?:py|md|sh|toml))")


def resolves(dotted: str) -> bool:
    """True when ``dotted`` is a module, or a name defined in one (possibly nested)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        try:
            if importlib.util.find_spec(module) is None:
                continue
        except ModuleNotFoundError:  # a name inside a module, not a submodule
            continue
        value: object = importlib.import_module(module)
        for name in parts[cut:]:
            if not hasattr(value, name):
                return False
            value = getattr(value, name)
        return True
    return False


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_every_dotted_name_in_the_docs_exists(doc: Path) -> None:
    from eventbus.telemetry.names import NAMES  # metric and span attribute names, not code

    names = sorted(set(DOTTED.findall(doc.read_text())) - NAMES)
    assert [name for name in names if not resolves(name.rstrip("."))] == []


@pytest.mark.parametrize("doc", DOCS, ids=lambda path: path.name)
def test_every_repository_path_in_the_docs_exists(doc: Path) -> None:
    paths = sorted(set(PATHS.findall(doc.read_text())))
    assert [path for path in paths if not (ROOT / path).exists()] == []


def test_the_readme_service_type_checks_under_strict_mypy(tmp_path: Path) -> None:
    # The README's service is what a newcomer copies first: `context.guard` is a
    # `Guard` (never None) and a guarded effect may return nothing.
    import re
    import subprocess
    import sys

    text = (ROOT / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "create_app" in b]
    source = tmp_path / "readme_service.py"
    source.write_text("def send_receipt(data: object) -> None: ...\n\n\n" + block)
    # A cache of its own in var/, kept between runs. It was --no-incremental, which still
    # writes mypy's default cache (.mypy_cache): its --strict entries for src replaced those
    # of `mypy src handlers infra main.py`, so the next make check or make test checked all
    # of src again (5 s of CPU), and this check took 4 s of CPU; with its cache, under 1 s.
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict",
                           "--cache-dir", str(ROOT / "var" / "mypy-strict-readme"),
                           str(source)], capture_output=True, text=True, cwd=ROOT, check=False,
                          timeout=300)
    assert done.returncode == 0, done.stdout


README_MOST_LINES = 150


def test_the_readme_is_a_landing_page_that_opens_with_the_two_commands() -> None:
    # Issue 41: the README is a landing page; details live in docs/ and are linked from it.
    # It opens (its first code block) with the two commands that set up a fresh machine:
    # `make run` (the service end to end) and `make test` (every test), and CI runs the
    # README's test command.
    text = (ROOT / "README.md").read_text()
    lines = text.splitlines()
    assert len(lines) <= README_MOST_LINES, (
        f"README.md has {len(lines)} lines, at most {README_MOST_LINES}: move details to docs/")
    first = re.search(r"```(\w*)\n(.*?)```", text, re.S)
    assert first is not None
    language, block = first.groups()
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    assert (language, commands) == ("sh", ["make run", "make test"])
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert [line for line in ci if line.strip() and not line.startswith("#")][-1] == "make test"
