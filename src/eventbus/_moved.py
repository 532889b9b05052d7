"""Old import paths of moved modules: each still works for one release, with a warning.

A module that moved (``eventbus.bulkhead`` to ``eventbus.partners.bulkhead``, ...)
leaves a stub whose ``__getattr__`` is ``moved(old, new)``: each name read
from the stub warns (``DeprecationWarning``, naming both paths) and every name
resolves to the new module's. Hand-written because the warning must come at the
use, where ``warnings.warn`` at import time would point into importlib.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable


def moved(old: str, new: str) -> Callable[[str], object]:
    """Return a module ``__getattr__`` that forwards ``old``'s names to ``new``, warning."""

    def forward(name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # import machinery probes (__path__, __file__...)
        warnings.warn(f"{old} moved to {new}; import it from there "
                      "(the old path goes in the next release)",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)

    return forward
