"""Hypothesis for this suite: one profile per use, and a failure's report of one example.

Profiles (``HYPOTHESIS_PROFILE`` picks one; otherwise ``check`` under
``EVENTBUS_TIER=check``, ``ci`` under ``CI=true``, else ``dev``):

* ``ci``: derandomized (each test's examples come from its own source, the
  same on every machine and every day), no example database (nothing a
  previous run found changes the verdict), the ``@reproduce_failure`` blob
  printed with a failure, and no timing verdicts (``deadline``, ``too_slow``):
  a loaded machine must not fail a run that an idle one passes.
* ``dev`` (a laptop): random examples, and failures kept in ``.hypothesis/``
  and tried first next time; each test's own ``max_examples``.
* ``check`` (``make check``, which sets ``EVENTBUS_TIER=check``): ``ci`` with a
  fifth of the examples (``CHECK_SHARE``), so the quick tier stays quick; ``make
  test`` and CI draw every example. A test that sets its own ``max_examples``
  passes it through ``examples()``, which gives the fifth in this profile only.
* ``mutation`` (``infra/mutation.sh``): ``ci`` with 20 examples a test.
* ``explore`` (``make explore``): random, ``EXPLORE_EXAMPLES`` examples per
  test, failures kept in ``.hypothesis/``. What it finds becomes an explicit
  ``@example``. A test's own ``@settings(max_examples=...)`` outranks every
  profile (hypothesis's rule, and raising it would take a private name of
  hypothesis): such a test explores at its own budget, at random.

``tests/model`` has its own budget (``EVENTBUS_MODEL_PROFILE``: ``ci``
derandomized, ``long`` random); ``make explore`` runs it ``long``.

A property test that fails reports the falsifying example's captured output
and log lines only: they are emptied before each example hypothesis runs, so
what remains is the last one's, the falsifying example that hypothesis runs
again at the end to report it.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

from tests.servers import in_ci

EXPLORE_EXAMPLES = 2000

settings.register_profile(
    "ci", derandomize=True, database=None, print_blob=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", print_blob=True)
settings.register_profile(
    "explore", max_examples=EXPLORE_EXAMPLES, derandomize=False, print_blob=True, deadline=None,
    suppress_health_check=[HealthCheck.too_slow], phases=list(Phase))

CHECK_SHARE = 5
"""``check`` runs a fifth of each test's examples: with all of them the property tests took
28 s of the 176 s of CPU that make check took (2026-12-02), against a budget of 90 s on two
cores. Derandomized as in ``ci``: the same examples every run."""
CHECK_FLOOR = 10
"""No test runs fewer examples than this in ``check`` (one that asks for 40 runs 10)."""
settings.register_profile(
    "check", parent=settings.get_profile("ci"), max_examples=100 // CHECK_SHARE)

settings.register_profile(
    "mutation", parent=settings.get_profile("ci"), max_examples=20,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.differing_executors])
"""``infra/mutation.sh``: CI's examples, fewer of them, each test run once per mutant in one
process (mutmut's trampoline calls one test from several executors)."""

PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or (
    "check" if os.environ.get("EVENTBUS_TIER") == "check" else "ci" if in_ci() else "dev")
settings.load_profile(PROFILE)  # pytest's --hypothesis-profile, if given, comes later and wins


def examples(count: int) -> int:
    """A test's own ``max_examples``: ``count``, or a fifth of it in the ``check`` profile.

    A test's ``@settings(max_examples=...)`` outranks every profile, so the quick tier's
    smaller budget reaches such a test only through this: ``max_examples=examples(300)``.
    Read when the test module is imported, after pytest's ``--hypothesis-profile``.
    """
    if settings.get_current_profile_name() != "check":
        return count
    return min(count, max(CHECK_FLOOR, count // CHECK_SHARE))


def pytest_report_header(config: pytest.Config) -> str:
    """Say which profile ran, so that a report says how to draw the same examples again."""
    return (f"hypothesis profile: {settings.get_current_profile_name()} "
            "(HYPOTHESIS_PROFILE=ci draws CI's examples)")


def _handle(item: pytest.Item) -> Any:
    """The hypothesis handle of a ``@given`` test (``.inner_test`` is hypothesis's public hook)."""
    function = getattr(item, "obj", None)
    return getattr(function, "hypothesis", None) if function is not None else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Run a property test with its captured output and log emptied before each example."""
    handle = _handle(item)
    if handle is None:
        return (yield)
    capture = item.config.pluginmanager.getplugin("capturemanager")
    logs = item.config.pluginmanager.getplugin("logging-plugin")
    inner: Callable[..., Any] = handle.inner_test
    examples = 0

    @functools.wraps(inner)  # hypothesis names the falsifying example by it
    def one_example(*args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        nonlocal examples
        examples += 1
        if capture is not None and capture.is_globally_capturing():
            capture.read_global_capture()  # read means dropped
        if logs is not None:
            logs.report_handler.reset()
        return inner(*args, **kwargs)

    handle.inner_test = one_example
    try:
        return (yield)
    except BaseException:
        if examples > 1:
            item.add_report_section(
                "call", "hypothesis",
                f"{examples} examples ran; the captured output and log shown are the "
                "last one's (the falsifying example, run again to report it)")
        raise
    finally:
        handle.inner_test = inner
