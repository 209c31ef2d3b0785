"""Where noise comes from. Every draw is made for a named `Mechanism` of the release's `Plan`, which fixes the
distribution and the scale; nothing here chooses a scale or looks at data.

Sources:
  `ExactNoise`   production: OpenDP's exact samplers over OS randomness (discrete Laplace / discrete Gaussian
                 on integer statistics, the float mechanisms on the 2^-1074 grid on real ones). numpy's
                 floating-point samplers leak through the low bits of what they return (Mironov 2012).
  `SeededNoise`  test / reproduction mode only: numpy's samplers from a seed. Not private: a seeded run is
                 not a release (it never reaches release/ and never charges a ledger).

A `Measure` is what an algorithm calls: measure(name, exact_values[, bound]) -> noisy values. It enforces the
plan: an unknown name or more draws than the entry's repetitions raise, so code cannot add noise the
accounting does not know about. `drawn` tells the caller whether any noise has been drawn yet (the rule for
a draw that fails before its commit, in tasks/stages.py).

DP-SGD draws tens of millions of Gaussians per step; OpenDP's samplers give about 10^5 per second here, so
its gradient noise comes from `StepNoise`: a fresh numpy generator per step seeded with 128 bits of OS
entropy, shared with nothing else and never published (threat model in the README, "Noise").
"""

from __future__ import annotations

import secrets
from abc import ABC, abstractmethod
from collections import Counter
from typing import Callable

import numpy as np

from dpalgos.plan import Mechanism, Plan


class NoiseSource(ABC):
    """Adds the noise of a plan entry to exact values."""

    #: Goes into the manifest: where the randomness came from.
    description: str
    private: bool

    @abstractmethod
    def add(self, mechanism: Mechanism, values: np.ndarray, scale: float) -> np.ndarray: ...

    def sampler(self, mechanism: Mechanism) -> str:
        return mechanism.sampler()

    @abstractmethod
    def step_generator(self) -> np.random.Generator:
        """A generator for one DP-SGD step's Gaussian noise (see module docstring)."""


class ExactNoise(NoiseSource):
    description = "OpenDP exact samplers over OS randomness (per-step OS-seeded numpy generators for DP-SGD)"
    private = True

    def __init__(self):
        self._cache: dict = {}

    def add(self, mechanism, values, scale):
        values = np.asarray(values)
        if values.size == 0:
            return values.astype(np.float64)
        key = (mechanism.distribution, mechanism.integer, values.size, scale)
        if key not in self._cache:
            self._cache[key] = mechanism.opendp_measurement(values.size, scale)
        flat = values.reshape(-1)
        if mechanism.integer:
            if not np.array_equal(np.rint(flat), flat):
                raise PlanViolation(f"mechanism '{mechanism.name}' is declared integer but got non-integer values")
            # x + Z with Z the noise of a zero vector, added in unbounded integers: counts beyond 64 bits (a
            # weighted table's cell of 3e9 refused a 32-bit domain after the charge) are drawn as any other.
            noise = self._cache[key]([0] * flat.size)
            noisy = [int(v) + z for v, z in zip(flat.tolist(), noise)]
        else:
            noisy = self._cache[key]([float(v) for v in flat.astype(np.float64)])
        return np.asarray(noisy, dtype=np.float64).reshape(values.shape)

    def step_generator(self):
        return np.random.default_rng(secrets.randbits(128))


class SeededNoise(NoiseSource):
    """numpy's floating-point samplers from a seed: reproducible, NOT private (test mode only)."""
    private = False

    def __init__(self, seed: int):
        self.description = f"numpy seeded with {seed} (test mode: not private)"
        self._rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[0])
        self._steps = np.random.default_rng(np.random.SeedSequence(seed).spawn(2)[1])

    def add(self, mechanism, values, scale):
        values = np.asarray(values, dtype=np.float64)
        draw = self._rng.laplace if mechanism.distribution == "laplace" else self._rng.normal
        return values + draw(0.0, scale, size=values.shape)

    def sampler(self, mechanism):
        return f"numpy_{mechanism.distribution}"

    def step_generator(self):
        return np.random.default_rng(self._steps.integers(0, 2 ** 63))


class PlanViolation(RuntimeError):
    """Code asked for noise the plan does not describe: a bug, never a user error."""


class Measure:
    """measure(name, values[, bound]) -> values + the noise of the plan entry `name`.

    bound : for an entry whose sensitivity is chosen during the release (a clipping bound C), the C of this
    draw; the scale is then noise_multiplier * bound_multiple * C."""

    def __init__(self, plan: Plan, source: NoiseSource, on_first_draw: Callable[[], object] | None = None):
        self.plan, self.source, self._on_first_draw = plan, source, on_first_draw
        self.calls: Counter = Counter()
        self.branch: str | None = None  # the plan's branch this release drew, once it draws one

    @property
    def drawn(self) -> bool:
        return sum(self.calls.values()) > 0

    def __call__(self, name: str, values, bound: float | None = None) -> np.ndarray:
        mechanism = self.plan[name]
        self._count(mechanism)
        return self.source.add(mechanism, values, mechanism.scale_for(bound))

    def step_generator(self, name: str) -> np.random.Generator:
        """The generator of one repetition of a per-step-generator entry (DP-SGD)."""
        mechanism = self.plan[name]
        if not mechanism.per_step_generator:
            raise PlanViolation(f"mechanism '{name}' must be drawn with `measure`, not a step generator")
        self._count(mechanism)
        return self.source.step_generator()

    def secret_generator(self) -> np.random.Generator:
        """Randomness of a mechanism that is not noise but must stay secret (Poisson batches, subset coins): the
        source's, never the public generator's and never published."""
        return self.source.step_generator()

    def _count(self, mechanism: Mechanism) -> None:
        if not self.drawn and self._on_first_draw is not None:
            self._on_first_draw()
        if mechanism.branch is not None:
            if self.branch not in (None, mechanism.branch):
                raise PlanViolation(f"mechanism '{mechanism.name}' is on branch '{mechanism.branch}'; this release "
                                    f"drew branch '{self.branch}', and a release draws one")
            self.branch = mechanism.branch
        self.calls[mechanism.name] += 1
        if self.calls[mechanism.name] > mechanism.repetitions:
            raise PlanViolation(f"mechanism '{mechanism.name}' drawn {self.calls[mechanism.name]} times; the plan "
                                f"allows {mechanism.repetitions}")

    def samplers(self) -> dict[str, str]:
        return {m.name: self.source.sampler(m) for m in self.plan}


def simulated(plan: Plan, rng: np.random.Generator) -> Measure:
    """A plan's noise in an experiment or a benchmark: numpy, seeded from the experiment's generator so that a
    paper figure is reproducible. Not private; never used for a release."""
    return Measure(plan, SeededNoise(int(rng.integers(0, 2 ** 63))))
