"""Running seeds: one run, a failure's shortest trace (shrinking), and the counts of a budget.

``shrink(seed)`` makes a failing run smaller while it still fails with the same
violation family: first a smaller ``Shape`` (fewer actors, deliveries, events,
one sweeper or the rebuild fewer), then fewer decisions (``limit``: every
fault after the first ``n`` points is dropped; the smallest ``n`` found by
bisection), then each remaining fault muted in turn. ``report(...)`` is what a
failure prints: the seed, the shape, and the trace of the run that shrinking
kept (its faults, and the switches that the trace names).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Iterable
from typing import Any

from tests.sim.world import Shape, World
from tests.sim.world import run_seed as _run_seed


@dataclasses.dataclass
class Shrunk:
    """The smallest failing run found for a seed."""

    seed: int
    shape: Shape
    limit: int | None
    muted: tuple[int, ...]
    world: World

    @property
    def family(self) -> str:
        """The violation's class name."""
        return type(self.world.violation).__name__  # type: ignore[attr-defined]


def fails(world: World, family: str) -> bool:
    """True when ``world`` failed with a violation of ``family``."""
    violation = world.violation  # type: ignore[attr-defined]
    return violation is not None and type(violation).__name__ == family


def shrink(seed: int, world: World | None = None, *, budget: int = 60,
           **where: Any) -> Shrunk:
    """The smallest run of ``seed`` (at most ``budget`` re-runs) that fails the same way.

    ``where``: the world's ``store`` factory and ``start`` (``run_seed``), for MongoDB.
    """
    run_seed = functools.partial(_run_seed, **where)
    world = world or run_seed(seed)
    assert world.violation is not None, f"seed {seed} does not fail"  # type: ignore[attr-defined]
    family = type(world.violation).__name__  # type: ignore[attr-defined]
    best = Shrunk(seed, world.shape, None, (), world)
    runs = 0
    improved = True
    while improved and runs < budget:
        improved = False
        for shape in best.shape.smaller():
            runs += 1
            attempt = run_seed(seed, shape)
            if fails(attempt, family):
                best = Shrunk(seed, shape, None, (), attempt)
                improved = True
                break
            if runs >= budget:
                break
    low, high = 0, best.world.scheduler.points
    while low < high and runs < budget:
        middle = (low + high) // 2
        runs += 1
        attempt = run_seed(seed, best.shape, limit=middle)
        if fails(attempt, family):
            high = middle
            best = Shrunk(seed, best.shape, middle, (), attempt)
        else:
            low = middle + 1
    muted: list[int] = []
    for index in list(best.world.scheduler.faulted):
        if runs >= budget:
            break
        runs += 1
        attempt = run_seed(seed, best.shape, limit=best.limit, muted=[*muted, index])
        if fails(attempt, family):
            muted.append(index)
            best = Shrunk(seed, best.shape, best.limit, tuple(muted), attempt)
    traced = run_seed(seed, best.shape, limit=best.limit, muted=best.muted, tracing=True)
    return dataclasses.replace(best, world=traced) if fails(traced, family) else best


def report(shrunk: Shrunk) -> str:
    """What a failing seed prints: the seed, how to run it again, and its shortest trace."""
    world = shrunk.world
    lines = [f"seed {shrunk.seed} fails: {shrunk.family}",
             f"  {world.violation}",  # type: ignore[attr-defined]
             f"  shape {shrunk.shape}",
             f"  again: run_seed({shrunk.seed}, {shrunk.shape!r}, limit={shrunk.limit}, "
             f"muted={list(shrunk.muted)})",
             f"  trace ({len(world.scheduler.trace)} decisions kept):"]
    lines += [f"    {entry}" for entry in world.scheduler.trace[-120:]]
    return "\n".join(lines)


@dataclasses.dataclass
class Tally:
    """What a budget of runs reached: runs, scheduling points by kind, faults by kind."""

    runs: int = 0
    points: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    decisions: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    failures: dict[int, str] = dataclasses.field(default_factory=dict)

    def add(self, world: World) -> None:
        """Count one run."""
        self.runs += 1
        self.points.update(world.scheduler.kinds)
        self.decisions.update(world.scheduler.decisions)
        violation = world.violation  # type: ignore[attr-defined]
        if violation is not None:
            self.failures[world.seed] = type(violation).__name__

    def to_json(self) -> dict[str, object]:
        """Plain data, for ``var/sim/``."""
        return {"runs": self.runs, "points": dict(self.points),
                "decisions": dict(self.decisions),
                "failures": {str(seed): family for seed, family in self.failures.items()}}


def play(seeds: Iterable[int], skip: Iterable[int] = (), **where: Any) -> Tally:
    """Run ``seeds`` (those in ``skip`` are counted apart: they are the known examples).

    ``where``: the world's ``store`` factory and ``start`` (``run_seed``), for MongoDB.
    """
    tally, skipped = Tally(), set(skip)
    for seed in seeds:
        world = _run_seed(seed, **where)
        tally.add(world)
        if seed in skipped:
            tally.failures.pop(seed, None)
    return tally
