"""Write ``docs/CONFIGURATION.md`` from ``eventbus.ops.config.reference_markdown()``.

Run from the repository root: ``.venv/bin/python docs/configuration.py``.
``tests/unit/test_config_reference.py`` fails when the file is out of date.
"""

from __future__ import annotations

from pathlib import Path

from eventbus.ops.config import reference_markdown

TARGET = Path(__file__).resolve().parent / "CONFIGURATION.md"


def main() -> None:
    """Rewrite the reference and say where it went."""
    TARGET.write_text(reference_markdown(), encoding="utf-8")
    print(f"wrote {TARGET}")


if __name__ == "__main__":
    main()
