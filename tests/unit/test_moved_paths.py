"""Every moved module's old import path still works for one release, and warns (issue 41)."""

from __future__ import annotations

import importlib
import warnings

import pytest

OLD_PATHS = {
    "eventbus.bulkhead": ("eventbus.partners.bulkhead", "Bulkhead"),
    "eventbus.slow_calls": ("eventbus.partners.slow_calls", "CallWindow"),
    "eventbus.deadline": ("eventbus.http.deadline", "Client"),
    "eventbus.deadline_async": ("eventbus.http.deadline_async", "AsyncClient"),
    "eventbus.store.documents.partner_documents": ("eventbus.partners.documents", "RateLimit"),
    "eventbus.ops.partner_ops": ("eventbus.partners.view", "PartnerView"),
    "eventbus.telemetry.partner_gauges": ("eventbus.partners.gauges", "partner_gauges"),
    "eventbus.workers.parked": ("eventbus.partners.parked", "Gate"),
    "eventbus.processor.replay_mode": ("eventbus.rebuild.mode", "ReplayProcessor"),
    "eventbus.ops.rebuilder": ("eventbus.rebuild.runner", "Rebuild"),
    "eventbus.ops.verify": ("eventbus.rebuild.verify", "Verifier"),
    "eventbus.ops.archive": ("eventbus.rebuild.archive", "read_archive"),
    "eventbus.model.replaying": ("eventbus.model.rebuild_policy", "Replay"),
}


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_an_old_path_gives_the_new_modules_names_with_a_warning(old: str) -> None:
    new, name = OLD_PATHS[old]
    module = importlib.import_module(old)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        found = getattr(module, name)
    assert found is getattr(importlib.import_module(new), name)


def test_a_name_the_new_module_lacks_is_an_attribute_error() -> None:
    module = importlib.import_module("eventbus.bulkhead")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        with pytest.raises(AttributeError):
            module.no_such_name  # noqa: B018


def test_from_import_of_an_old_path_works() -> None:
    with pytest.warns(DeprecationWarning):
        from eventbus.deadline import Client
    from eventbus.http.deadline import Client as New

    assert Client is New


def test_the_library_itself_never_uses_an_old_path() -> None:
    # A run of the quick tier with warnings as errors would catch it too; this says where.
    import subprocess
    import sys

    modules = ["eventbus", "eventbus.partners", "eventbus.rebuild.runner",
               "eventbus.rebuild.command", "eventbus.rebuild.verify.command", "eventbus.ops.cli",
               "eventbus.web.app", "eventbus.workers.pull", "eventbus.assembly",
               "eventbus.testing", "handlers"]
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning); "
            f"import {', '.join(modules)}")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
