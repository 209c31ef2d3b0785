"""FriendlyCore averaging: its public parameters, its plan and its release (docs/friendlycore.md §2-§8), with the
clip grid of the refinement."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from dpalgos.friendlycore.constants import COUNT_SENSITIVITY, MEAN_SENSITIVITY_MULTIPLE, PREDICATES, WEIGHT_SENSITIVITY
from dpalgos.friendlycore.core import (
    PTR_ARGUMENT,
    check_budget,
    check_radius_choice,
    checked_split,
    ptr_delta,
    ptr_lower_bound,
    soft_weights,
    total_weight,
    weighted_mean,
    zcdp_nm,
)
from dpalgos.friendlycore.friends import FriendCounter, friend_counter
from dpalgos.friendlycore.radius import RadiusGrid, binary_search_radius, search_threshold
from dpalgos.friendlycore.refine import refine_mean
from dpalgos.noise import Measure
from dpalgos.plan import Mechanism, Plan

_MEAN_SPLIT_GRID = {"count": 0.02, "radius": 0.08, "weight": 0.10, "mean": 0.80}
_MEAN_SPLIT_FIXED = {"weight": 0.10, "mean": 0.90}
#: With the refinement (§13) the friendly mean only has to locate the data: most of rho goes to the clipped sum,
#: whose add/remove sensitivity is the clip radius C (about the data's spread around its centre), not 4r / W.
#: `outside` counts the records beyond the clip ball, so that a release says how many were pulled onto it.
_MEAN_SPLIT_GRID_REFINED = {"count": 0.01, "radius": 0.05, "weight": 0.04, "mean": 0.15, "clip": 0.03,
                            "outside": 0.02, "refine": 0.70}
_MEAN_SPLIT_FIXED_REFINED = {"count": 0.01, "weight": 0.04, "mean": 0.17, "clip": 0.03, "outside": 0.02,
                             "refine": 0.73}


@dataclass(frozen=True)
class MeanParams:
    """Public parameters of the friendly average (everything here is public: spec values, never data).

    rho        total zCDP budget of the release (its (eps, delta) adds `delta_ptr`, `Plan.guarantee`).
    r          a public radius, or None to choose it privately over `grid`.
    grid       the public radius grid (required when r is None).
    delta_ptr  delta' of the propose-test-release step (§6).
    split      fractions of rho: keys count/radius/weight/mean (grid) or weight/mean (public r).
    target     the search picks the smallest r_j with noisy W_j >= target * noisy n.
    min_weight L_min: release None when L < L_min. Must be >= 2 (Theorem 6.1 needs max(W, W') >= 2).
    predicate  "distance" (exact Euclidean, any d) or "grid" (cell predicate, d <= 3, for very large n).
    grid_q     cells per radius of the grid predicate.
    refine     after the friendly mean c1, release c1 + (noisy sum of the points clipped to the ball B(c1, C)) /
               noisy n instead (§13, ours); C is the smallest radius of a public grid around c1 whose noisy count
               of points reaches `clip_target` * noisy n, and a noisy count of the points beyond C says how many
               were pulled onto the ball. Split keys then add count (always), clip, outside and refine.
    clip_target, clip_ratio, clip_span  the clip grid: C_j = hi / clip_span * clip_ratio^j up to
               hi = 2 r + sigma_M (sqrt(d) + 4) (every core point is within 2r of the friendly mean, §5(i)).
    """
    rho: float
    r: float | None = None
    grid: RadiusGrid | None = None
    delta_ptr: float = 1e-8
    split: dict | None = None
    target: float = 0.9
    min_weight: float = 2.0
    predicate: Literal["distance", "grid"] = "distance"
    grid_q: int = 16
    refine: bool = False
    clip_target: float = 0.95
    clip_ratio: float = 2.0 ** (1 / 16)
    clip_span: float = 64.0

    def __post_init__(self):
        if not (math.isfinite(self.rho) and self.rho > 0):
            raise ValueError("rho must be positive")
        check_radius_choice(self, WEIGHT_SENSITIVITY, "Theorem 6.1")
        if not 0 < self.clip_target <= 1:
            raise ValueError("clip_target must be in (0, 1]")
        if not (self.clip_ratio > 1 and self.clip_span >= 1):
            raise ValueError("need clip_ratio > 1 and clip_span >= 1")
        if self.predicate not in PREDICATES:
            raise ValueError(f"predicate must be one of {PREDICATES}")
        check_budget(self)

    @property
    def counted(self) -> bool:
        """A noisy count n is drawn: for the radius search's threshold and for the refinement's divisor."""
        return self.grid is not None or self.refine

    @property
    def clip_probes(self) -> int:
        """Binary-search probes of the clip grid (its size is public: ceil(log2 J))."""
        J = clip_radii(1.0, self).size
        return math.ceil(math.log2(J)) if self.refine and J > 1 else 0

    def budget_split(self) -> dict:
        if self.refine:
            default = _MEAN_SPLIT_GRID_REFINED if self.grid is not None else _MEAN_SPLIT_FIXED_REFINED
        else:
            default = _MEAN_SPLIT_GRID if self.grid is not None else _MEAN_SPLIT_FIXED
        return checked_split(self.split, default)


def mean_plan(params: MeanParams) -> Plan:
    """The plan of `friendly_mean`: its event is the zCDP part, its extra delta the PTR delta' (`ptr_delta`), so
    `plan.guarantee(delta)` is the release's (eps, delta) (Theorem 6.1, §8)."""
    s = {k: v * params.rho for k, v in params.budget_split().items()}
    mech = []
    if params.counted:
        mech.append(Mechanism(
            name="fc_count", query="number of records n", distribution="gaussian",
            sensitivity=COUNT_SENSITIVITY, integer=True, noise_multiplier=zcdp_nm(s["count"]),
            argument="adding or removing one record changes n by 1"))
    if params.grid is not None:
        mech.append(Mechanism(
            name="fc_radius", query="soft-core weight W(r_j) at a grid radius (binary-search probe)",
            distribution="gaussian", sensitivity=WEIGHT_SENSITIVITY, repetitions=max(params.grid.probes, 1),
            noise_multiplier=zcdp_nm(s["radius"] / max(params.grid.probes, 1)),
            argument="docs/friendlycore.md Corollary 3.2: adding or removing one record changes W by at most "
                     "(2n+1)/(n+1) < 2 for any symmetric predicate; r_j is public or chosen from earlier probes"))
    mech.append(Mechanism(
        name="fc_weight", query="soft-core total weight W at the chosen radius (PTR test)", distribution="gaussian",
        sensitivity=WEIGHT_SENSITIVITY, noise_multiplier=zcdp_nm(s["weight"]),
        argument="docs/friendlycore.md Corollary 3.2: |W(D') - W(D)| <= (2n+1)/(n+1) < 2"))
    mech.append(Mechanism(
        name="fc_mean", query="friendly weighted mean M = sum w x / W", distribution="gaussian",
        sensitivity=None, bound_multiple=MEAN_SENSITIVITY_MULTIPLE, noise_multiplier=zcdp_nm(s["mean"]),
        argument="docs/friendlycore.md Theorem 5.1: ||M(D') - M(D)|| <= 4 r / max(W, W') when max(W, W') >= 2; "
                 "the bound C = r / L with L = W^ - z sigma_W <= max(W, W') except with probability delta' "
                 "(Theorem 6.1, propose-test-release)"))
    if params.refine:
        k = params.clip_probes
        mech.append(Mechanism(
            name="fc_clip", query="number of records within a grid radius C_j of the friendly mean c1 "
                                  "(binary-search probe of the clip radius)",
            distribution="gaussian", sensitivity=COUNT_SENSITIVITY, integer=True, repetitions=max(k, 1),
            noise_multiplier=zcdp_nm(s["clip"] / max(k, 1)),
            argument="docs/friendlycore.md §13: for a centre c1 and a radius C_j that are functions of earlier "
                     "noisy outputs, adding or removing one record changes the count of records within C_j of "
                     "c1 by at most 1"))
        mech.append(Mechanism(
            name="fc_outside", query="number of records farther than the clip radius C from the friendly mean c1",
            distribution="gaussian", sensitivity=COUNT_SENSITIVITY, integer=True,
            noise_multiplier=zcdp_nm(s["outside"]),
            argument="docs/friendlycore.md §13: c1 and C are functions of earlier noisy outputs; adding or removing "
                     "one record changes the count of records beyond C by at most 1"))
        mech.append(Mechanism(
            name="fc_refine", query="sum over all records of (x - c1) clipped to norm C (refinement)",
            distribution="gaussian", sensitivity=None, bound_multiple=1.0, noise_multiplier=zcdp_nm(s["refine"]),
            argument="docs/friendlycore.md §13, Lemma 13.1: every clipped vector has norm at most C (c1 and C are "
                     "functions of earlier noisy outputs), and adding or removing a record adds or removes one "
                     "of them: the sum moves by at most C; C = the clip radius"))
    return Plan(tuple(mech), ptr_delta(params), PTR_ARGUMENT)


@dataclass(frozen=True)
class MeanRelease:
    """What `friendly_mean` releases (all of it is DP output): mean is None for "no friendly core". With the
    refinement, `friendly` is the first-stage friendly mean c1, `clip_radius` the C of the clipped sum, `outside`
    the noisy count of records farther than C from c1 (pulled onto the ball by the clip)."""
    mean: np.ndarray | None
    radius: float
    noisy_weight: float
    weight_lower_bound: float
    noisy_count: float | None = None
    probes: tuple = field(default=())
    friendly: np.ndarray | None = None
    clip_radius: float | None = None
    clip_probes: tuple = field(default=())
    outside: float | None = None

    @property
    def released(self) -> bool:
        return self.mean is not None


def friendly_mean(X, params: MeanParams, measure: Measure, *, friends: FriendCounter | None = None) -> MeanRelease:
    """FriendlyCore averaging of the rows of X (n, d): no bound on the data or its mean is needed.

    measure : Measure over `mean_plan(params)` (or a plan with the same entry names, e.g. a conformance
              suite's `plan.scaled(...)`); every noisy value is drawn through it.
    friends : optional friend counter of X for the params' predicate (reuse across calls on the same X).
    """
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ValueError("X must be (n, d)")
    n = X.shape[0]
    plan = measure.plan
    if friends is None:
        friends = friend_counter(X, params.predicate, grid_q=params.grid_q) if n else None

    def weights(r):
        return soft_weights(friends.counts(r), n) if n else np.zeros(0)

    noisy_count, probes = None, ()
    if params.counted:
        # Sensitivity 1: adding or removing one record changes n by 1.
        noisy_count = float(measure("fc_count", np.array([float(n)]))[0])
    if params.grid is not None:
        # Each probe: W(r_j), sensitivity < 2 (Corollary 3.2), r_j public or a function of earlier noisy probes.
        r, probes = binary_search_radius(lambda rr: total_weight(weights(rr)), params.grid,
                                         search_threshold(params.target, noisy_count, plan["fc_radius"].scale),
                                         measure, "fc_radius")
        probes = tuple(probes)
    else:
        r = float(params.r)
    w = weights(r)
    W = total_weight(w)
    # Sensitivity of W < 2 (Corollary 3.2).
    noisy_weight = float(measure("fc_weight", np.array([W]))[0])
    sigma_w = plan["fc_weight"].scale
    L = float(ptr_lower_bound(noisy_weight, sigma_w, params.delta_ptr))
    if not L >= params.min_weight:
        return MeanRelease(None, r, noisy_weight, L, noisy_count, probes)
    M = weighted_mean(X, w)
    if M is None:  # W = 0 < 2 <= L: only on the PTR failure event (probability <= delta'), where anything goes
        return MeanRelease(None, r, noisy_weight, L, noisy_count, probes)
    # Sensitivity 4 r / max(W, W') <= 4 r / L on the PTR event (Theorem 5.1, Theorem 6.1); L >= 2 ensures W > 0.
    noisy = np.asarray(measure("fc_mean", M, bound=r / L), dtype=np.float64)
    if not params.refine:
        return MeanRelease(noisy, r, noisy_weight, L, noisy_count, probes)
    hi = 2.0 * r + plan["fc_mean"].scale_for(r / L) * (math.sqrt(X.shape[1]) + 4.0)
    threshold = search_threshold(params.clip_target, noisy_count, plan["fc_clip"].scale)
    C, clip_probes, outside, refined = refine_mean(X, noisy, clip_radii(hi, params), threshold, max(noisy_count, L),
                                                   measure)
    return MeanRelease(refined, r, noisy_weight, L, noisy_count, probes, noisy, C, tuple(clip_probes), outside)


def clip_radii(hi: float, params: MeanParams) -> np.ndarray:
    """The clip grid hi / clip_span * clip_ratio^j, j = 0..J-1, J = floor(log(clip_span) / log(clip_ratio)) + 1:
    its size (hence the number of probes) is public, its scale hi a function of released values (§13)."""
    J = math.floor(math.log(params.clip_span) / math.log(params.clip_ratio) + 1e-9) + 1
    return (hi / params.clip_span) * params.clip_ratio ** np.arange(J)
