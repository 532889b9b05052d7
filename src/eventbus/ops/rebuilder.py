"""Deprecated: moved to ``eventbus.rebuild.runner``; this import path goes in the next release.

Kept for one release so existing imports keep working (with a ``DeprecationWarning``).
"""

from eventbus._moved import moved

__getattr__ = moved(__name__, "eventbus.rebuild.runner")
