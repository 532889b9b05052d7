"""The pipeline's replaceable steps are declared: ``Mode``, and the modes replace only those.

``eventbus.processor.mode.Mode`` lists the steps a mode may replace (issue 41, "declared
seams"); ``LiveMode`` implements each of them, ``ReplayMode`` (``eventbus rebuild``)
overrides some and nothing else of it, and ``ReplayProcessor`` overrides no method of
``Processor``: it is a processor whose mode is a ``ReplayMode``. Checked on the class
dicts, so a step added to a mode without being declared, or a private method of the
pipeline replaced again by a subclass, fails here.
"""

from __future__ import annotations

import inspect

from eventbus.processor.mode import STEPS, LiveMode, Mode
from eventbus.processor.pipeline import Processor
from eventbus.rebuild.mode import ReplayMode, ReplayProcessor

DECLARED = {"claim_batch", "not_taken", "attempts_used", "stale", "context", "success",
            "failure", "undecided", "store_finishes", "relayed", "moves_position",
            "honours_max_age"}
"""The steps, written out: a change to the set is a change to every mode."""
FLAGS = {"moves_position", "honours_max_age"}
"""The declared flags among them (class attributes, not methods)."""


def _own(cls: type) -> set[str]:
    """The names ``cls`` defines itself (its class dict), dunders and ``abc``'s cache left out."""
    return {name for name in vars(cls)
            if not (name.startswith("__") and name.endswith("__")) and name != "_abc_impl"}


def test_the_steps_are_the_declared_ones() -> None:
    assert STEPS == DECLARED
    assert set(Mode.__abstractmethods__) == DECLARED - FLAGS
    assert set(Mode.__annotations__) >= FLAGS


def test_every_step_says_what_it_decides() -> None:
    for name in sorted(DECLARED - FLAGS):
        assert inspect.getdoc(getattr(Mode, name)), name
    assert "async path shares" in (Mode.__doc__ or "")


def test_live_mode_implements_every_step() -> None:
    assert not inspect.isabstract(LiveMode)
    assert _own(LiveMode) >= DECLARED, DECLARED - _own(LiveMode)
    assert LiveMode.moves_position is True
    for name in DECLARED - FLAGS:
        assert not getattr(getattr(LiveMode, name), "__isabstractmethod__", False), name


def test_replay_mode_overrides_only_declared_steps() -> None:
    assert issubclass(ReplayMode, LiveMode) and not inspect.isabstract(ReplayMode)
    overridden = {name for name in _own(ReplayMode) if hasattr(LiveMode, name)}
    assert overridden <= DECLARED, overridden - DECLARED
    # What else it defines is its own (helpers), never a public name beside the steps.
    assert all(name.startswith("_") for name in _own(ReplayMode) - overridden)
    assert ReplayMode.moves_position is False


def test_the_replay_processor_overrides_no_method_of_the_processor() -> None:
    assert issubclass(ReplayProcessor, Processor)
    replaced = {name for name in _own(ReplayProcessor) if hasattr(Processor, name)}
    assert not replaced, replaced  # private or public: its constructor only (a dunder)
    assert set(_own(ReplayProcessor)) == {"rebuild"}


def test_the_processor_calls_its_steps_only_through_its_mode() -> None:
    # No step is left on the processor to be overridden there instead of in a mode.
    on_processor = {name for name in dir(Processor)
                    for step in DECLARED if name in (step, f"_{step}")}
    assert not on_processor, on_processor
