"""Load a test module beside this one, so test modules can share ``test_stack``'s helpers.

Under ``--import-mode=importlib`` test modules are not importable by name: ``sibling``
returns the module as pytest imported it, else loads it now under a name of its own.
``conftest.py`` puts this directory on ``sys.path`` so tests can import this module.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def sibling(name: str) -> ModuleType:
    """The test module ``name`` of this directory, imported once."""
    path = str(Path(__file__).with_name(f"{name}.py"))
    for module in list(sys.modules.values()):
        if getattr(module, "__file__", None) == path:
            return module
    spec = importlib.util.spec_from_file_location(f"eventbus_deploy_{name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
