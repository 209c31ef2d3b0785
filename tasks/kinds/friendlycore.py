"""The `mean` and `friendly_kmeans` release kinds: FriendlyCore framework after Tsfadia et al., ICML 2022;
filter and analysis derived in this project (dpalgos/friendlycore/, proofs in docs/friendlycore.md).

Neither needs public bounds: the soft core keeps the points with many friends within radius r, and the noise
scales with r and the noisy core weight, not with a domain diameter. Both are zCDP mechanisms with one
propose-test-release step: the spec's (epsilon, delta) is met by the largest rho that converts to epsilon at
delta_0 = delta - delta', and the ledger charges the zCDP events plus delta' (the plan's extra delta).

FriendlyCore is not a sufficient-statistics algorithm: the points are gathered on the driver (10^6 points in
2-D take seconds and a few hundred MB). The subset coins of friendly k-means, and its k-means++ seeds, come from
the noise source's secret generator: the guarantee is over those coins, so they are never published.
"""

from __future__ import annotations

import dataclasses
import json
import math
from functools import cached_property, lru_cache
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from data_contracts import suites
from data_contracts.validate import parquet_files
from dpalgos import friendlycore as fc
from dpalgos.intervals import NoiseLaw
from dpalgos.lazy import module
from dpalgos.plan import Plan
from tasks.kinds.base import NOTHING_RELEASED, Draw, Footprint, ReleaseKind
from tasks.kinds.uncertainty import Bootstrap, Center, Direct, Predicted, Product, UncertaintyParams, exact
from tasks.params import ReleaseBase
from tasks.partitions import Partitioned, current_client

pa = module("pyarrow")
pq = module("pyarrow.parquet")
accounting = module("dpalgos.accounting")
metrics = module("dpalgos.metrics")

RESULT = "result.parquet"
INFO = "friendlycore.json"
LABEL = "FriendlyCore framework after Tsfadia et al., ICML 2022; filter and analysis derived in this project"


class _FriendlyParams(ReleaseBase, UncertaintyParams):
    delta: float = Field(1e-6, gt=0, lt=1, description="delta of the release's (epsilon, delta), delta' included")
    r: float | None = Field(None, gt=0, le=fc.MAX_RADIUS,
                            description="public radius of the friend predicate; default: chosen privately on the "
                                        "geometric grid [r_min, r_max]. At most 1e150: the predicates compare "
                                        "squared distances with multiples of r^2, which must be finite")
    r_min: float | None = Field(None, gt=0, le=fc.MAX_RADIUS, description="smallest radius of the public grid")
    r_max: float | None = Field(None, gt=0, le=fc.MAX_RADIUS, description="largest radius of the public grid")
    delta_ptr: float = Field(1e-8, gt=0, lt=1e-3, description="delta' of the propose-test-release step")

    @model_validator(mode="after")
    def _radius_source(self):
        if (self.r is None) == (self.r_min is None or self.r_max is None):
            raise ValueError("give a public radius r, or the grid r_min and r_max (not both)")
        if self.r_min is not None and self.r_max is not None and self.r_min > self.r_max:
            raise ValueError("need r_min <= r_max")
        if not self.delta > self.delta_ptr:
            raise ValueError("delta must exceed delta_ptr (delta' is part of delta)")
        return self

    def radius(self) -> dict:
        return {"r": self.r} if self.r is not None else {"grid": fc.RadiusGrid(self.r_min, self.r_max)}


class MeanParams(_FriendlyParams):
    """FriendlyCore averaging: the mean of numeric columns without bounds, or "no friendly core"."""
    kind: Literal["mean"] = Field("mean", description="the release kind")
    refine: bool = Field(True, description="after the friendly mean c1, release c1 + (noisy sum of the points "
                                           "clipped to a ball around c1 whose radius is chosen privately) / "
                                           "noisy n (docs/friendlycore.md §13): noise about the data's spread "
                                           "around its centre instead of 4 r / W; false: the friendly mean "
                                           "alone (no point beyond the core moves it at all)")


class FriendlyKMeansParams(_FriendlyParams):
    """Friendly k-means: k-means++ on m random disjoint subsets, the k-tuples aggregated by FriendlyCore."""
    kind: Literal["friendly_kmeans"] = Field("friendly_kmeans", description="the release kind")
    k: int = Field(ge=1, description="number of centres")
    subsets: int = Field(ge=2, description="m, an even number of subsets, from PUBLIC knowledge of the size "
                                           "(each subset should hold a few dozen points per cluster)")

    @model_validator(mode="after")
    def _even(self):
        if self.subsets % 2:
            raise ValueError("subsets must be even (docs/friendlycore.md Lemma 9.2)")
        return self


@lru_cache(maxsize=64)
def _rho(epsilon: float, delta: float, delta_ptr: float) -> float:
    return accounting.zcdp_rho(epsilon, delta - delta_ptr)


def math_params(p):
    """The mathematical parameters of a release section `p` (`MeanParams` or `FriendlyKMeansParams`): the rho its
    (epsilon, delta - delta_ptr) converts to, its radius source, and dpalgos.friendlycore's defaults for the rest."""
    rho = _rho(p.epsilon, p.delta, p.delta_ptr)
    if p.kind == "mean":
        return fc.MeanParams(rho=rho, delta_ptr=p.delta_ptr, refine=p.refine, **p.radius())
    return fc.KMeansParams(rho=rho, k=p.k, subsets=p.subsets, delta_ptr=p.delta_ptr, **p.radius())


_math_params = math_params


def release_mean(p, X: np.ndarray, measure, *, friends=None) -> fc.MeanRelease:
    """The `mean` release of the points X (n, d) for the release section `p`, every draw through `measure` (the
    plan's entries): what the draw measures and `mean_draw` writes. `friends`: a friend counter of X to reuse
    (benchmarks run several releases on one X)."""
    return fc.friendly_mean(X, math_params(p), measure, friends=friends)


def release_kmeans(p, X: np.ndarray, measure) -> fc.KMeansRelease:
    """The `friendly_kmeans` release of the points X for the release section `p`. The subset coins are the
    mechanism's own randomness: secret (the noise source's `secret_generator`), never public."""
    return fc.friendly_kmeans(X, math_params(p), measure, measure.secret_generator())


def plan_of(p) -> Plan:
    """The plan of a release section `p` (the kind's `plan` of a spec is its release section's)."""
    params = math_params(p)
    return fc.mean_plan(params) if p.kind == "mean" else fc.kmeans_plan(params)


def _points(spec, prepared) -> np.ndarray:
    """All points on the driver (FriendlyCore needs them together)."""
    data = Partitioned.points(current_client(), parquet_files(prepared.path), spec.dataset.columns)
    try:
        return data.collect()
    finally:
        data.close()


def mean_draw(spec, res: fc.MeanRelease, plan: Plan) -> Draw:
    """The files of a mean release (all DP outputs): the mean, and what the release found (radius, noisy core weight
    and count, the friendly mean and clip radius of a refinement, how many records lay beyond it)."""
    info = {"released": res.released, "radius": res.radius, "noisy_core_weight": res.noisy_weight,
            "weight_lower_bound": res.weight_lower_bound, "noisy_count": res.noisy_count,
            "radius_probes": [list(p) for p in res.probes], "refined": res.clip_radius is not None,
            "clip_radius": res.clip_radius, "clip_probes": [list(p) for p in res.clip_probes]}
    if res.clip_radius is not None:
        info.update({"friendly_mean": res.friendly.tolist(), "outside_clip": res.outside,
                     "outside_clip_law": ["gaussian", True, plan["fc_outside"].scale]})
    rows = None if res.mean is None else res.mean[None, :]
    return Draw(write=lambda folder: _write(folder, spec.dataset.columns, rows, 1, info), meta={})


def _refined(measurements) -> bool:
    info = json.loads((measurements / INFO).read_text())
    return bool(info["released"] and info.get("refined"))


def _refined_bootstrap(info: dict, released: np.ndarray, cols: tuple, plan) -> Bootstrap:
    """The parametric bootstrap of m = c1 + S / max(n, L) around the released mean (see `bootstrap`)."""
    c1, L = np.asarray(info["friendly_mean"], dtype=np.float64), info["weight_lower_bound"]
    divisor = max(info["noisy_count"], L)
    refine, count = plan["fc_refine"], plan["fc_count"]

    def rerun(noisy, rng):
        return {RESULT: (c1 + noisy["fc_refine"] / max(float(noisy["fc_count"][0]), L))[None, :]}
    return Bootstrap((Product(RESULT, "row", cols),),
                     (Center("fc_refine", divisor * (released[0] - c1), NoiseLaw.of(refine, refine.scale_for(
                         info["clip_radius"]))), Center("fc_count", np.array([divisor]), NoiseLaw.of(count))),
                     rerun, notes=(REFINED_ESTIMAND,))


#: What a refined mean's interval is for (docs/friendlycore.md §13, docs/uncertainty.md).
REFINED_ESTIMAND = ("the intervals are for the mean of the records with each one farther than the clip radius C "
                    "from the friendly mean c1 pulled onto that ball (both in friendlycore.json): the data's mean "
                    "when no record lies beyond C. How many did is published (outside_clip, noisy); how far is not "
                    "measured, and no interval for the plain mean of unbounded data can hold under DP (a record "
                    "placed far enough moves the mean anywhere while the release barely changes)")


def _left_out(info: dict, confidence: float) -> list[str]:
    """The records a mean release left out of what it measured, as noisy counts: beyond the clip ball (refined),
    or outside the friendly core."""
    if info.get("refined"):
        law, k = NoiseLaw(*info["outside_clip_law"]), info["outside_clip"]
        h = law.half_width(confidence)
        if k - h <= 0:
            return []
        return [f"about {k:.0f} records (noisy; {confidence:g} interval [{k - h:.0f}, {k + h:.0f}]) lay farther than "
                f"the clip radius {info['clip_radius']:.4g} from the friendly mean: the released mean and its "
                f"interval are for the records pulled onto that ball, and the data's own mean may lie outside the "
                f"interval by their distance beyond it, which is not measured"]
    if info.get("noisy_count") is None:
        return [f"the released mean is the friendly core's weighted mean (noisy core weight "
                f"{info['noisy_core_weight']:.0f}); records outside the core are left out, their number is not "
                f"measured (a radius grid or refine: true also counts the records)"]
    shortfall = info["noisy_count"] - info["noisy_core_weight"]
    return [f"the released mean is the friendly core's weighted mean: about {max(shortfall, 0):.0f} of the noisy "
            f"{info['noisy_count']:.0f} records' weight lies outside the core and is left out (noisy counts)"] \
        if shortfall > 0 else []


def _write(folder, columns, rows: np.ndarray | None, k: int, info: dict) -> None:
    values = np.full((k, len(columns)), np.nan) if rows is None else rows
    pq.write_table(pa.table({"released": np.full(k, rows is not None),
                             **{c: values[:, j] for j, c in enumerate(columns)}}), folder / RESULT)
    (folder / INFO).write_text(json.dumps({"method": LABEL, **info}, indent=2))


class _FriendlyKind(ReleaseKind):
    shape = "numeric"
    prepared_stage = None
    bootstraps = True

    @cached_property
    def plan(self):
        return plan_of(self.spec.release)

    @property
    def _rows(self) -> int:
        return 1 if self.name == "mean" else self.spec.release.k

    @cached_property
    def measurements_contract(self):
        return RESULT, suites.friendly_result(self.spec.dataset.columns, self._rows)

    def postprocess(self, measurements, staging, internal, log):
        """The result in the data's own units (FriendlyCore works on them: nothing to invert), and what the
        release found (radius, noisy core weight): all DP outputs."""
        for name in (RESULT, INFO):
            (staging / name).write_bytes((measurements / name).read_bytes())
        return [RESULT, INFO]

    @cached_property
    def release_contract(self):
        contract = suites.friendly_result(self.spec.dataset.columns, self._rows, intervals=True)
        return RESULT, dataclasses.replace(contract, stage="release")

    #: The plan entries of the PTR weight and of the released mean / centres.
    weight_entry: str
    result_entry: str

    def _result_law(self, measurements, plan) -> tuple[str, NoiseLaw | None]:
        """The plan entry whose noise the released friendly mean / centres carry, and its law (None if nothing was
        released): Gaussian of standard deviation noise multiplier x bound multiple x r / L, r and L (the PTR test's
        lower bound) published in friendlycore.json."""
        info = json.loads((measurements / INFO).read_text())
        if not info["released"]:
            return self.result_entry, None
        entry = plan[self.result_entry]
        return entry.name, NoiseLaw.of(entry, entry.scale_for(info["radius"] / info["weight_lower_bound"]))

    def direct_values(self, measurements, plan):
        """The friendly mean / centres are direct measurements; a refined mean (a ratio of two of them) is not:
        its interval is the bootstrap's."""
        if _refined(measurements):
            return []
        name, law = self._result_law(measurements, plan)  # None: "no friendly core", null intervals
        return [Direct(RESULT, c, name, law) for c in self.spec.dataset.columns]

    @cached_property
    def replicate_values(self):
        """The released mean, or k centres, of d coordinates."""
        return float(getattr(self.spec.release, "k", 1) * len(self.spec.dataset.columns))

    def bootstrap(self, measurements, staging, plan):
        """A refined mean c1 + S / D (§13), D = max(noisy n, L): the noise of the clipped sum S (at the clip radius
        C) and of the count n redrawn around S = D (m - c1) and n = D, the division rerun; c1, C and L are kept
        (published in friendlycore.json). Otherwise the released values are direct measurements (analytic
        intervals) and the replicates, the plan's noise redrawn around them, serve derived queries (a distance
        between centres, a ratio of coordinates)."""
        cols = tuple(self.spec.dataset.columns)
        released = pq.read_table(measurements / RESULT).to_pandas()[list(cols)].to_numpy()
        if _refined(measurements):
            return _refined_bootstrap(json.loads((measurements / INFO).read_text()), released, cols, plan)
        name, law = self._result_law(measurements, plan)
        if law is None:
            return None
        return Bootstrap((Product(RESULT, "row", cols, intervals="analytic"),),
                         (Center(name, released, law),),
                         lambda noisy, rng: {RESULT: noisy[name]},
                         notes=(("the intervals are for what the noise was added to, the soft core's weighted "
                                 "mean (of the tuples' centres for k-means), not for the plain mean of the data"),))

    def caveats(self, staging):
        info = json.loads((staging / INFO).read_text())
        if not info["released"]:
            return [f"no friendly core: {NOTHING_RELEASED} (the test of the core's noisy weight failed; the budget "
                    "is spent). A larger radius (r, or r_max) or more records let a core pass"]
        return _left_out(info, self.spec.release.confidence) if self.name == "mean" else []

    def accuracy(self, records=None):
        """The noisy core weight (exact) and a released coordinate: noise multiplier x bound multiple x r / L, with
        L = W - z sd(W) the PTR bound at a core weight W (`_core_weight`); per unit of r when r is chosen on the
        grid."""
        p, plan = self.spec.release, self.plan
        weight, entry = NoiseLaw.of(plan[self.weight_entry]), plan[self.result_entry]
        rows = [exact("noisy core weight (friendlycore.json)", weight, p.confidence)]
        W, assumption = self._core_weight(records)
        if W is None:
            return rows + [Predicted(self.result_name, None, None, "not predicted", assumption)]
        L = float(fc.ptr_lower_bound(W, weight.scale, p.delta_ptr))
        if not L >= 2:
            return rows + [Predicted(self.result_name, None, None, "nothing released: the PTR test fails",
                                     f"{assumption}: L = {L:.3g} < 2")]
        if getattr(p, "refine", False):  # c1 + S / D: S's noise at the clip radius C, D about n = W
            entry = plan["fc_refine"]
            law = NoiseLaw.of(entry, entry.scale_for(1.0 / W))
            return rows + [exact("released (refined) mean coordinate per unit of the clip radius C (chosen "
                                 "privately, about the data's spread)", law, p.confidence, assumption)]
        r, unit = (p.r, "") if p.r is not None else (1.0, " per unit of the radius chosen on the grid")
        law = NoiseLaw.of(entry, entry.scale_for(r / L))
        return rows + [exact(self.result_name + unit, law, p.confidence, assumption)]


class MeanKind(_FriendlyKind):
    name = "mean"
    Params = MeanParams
    weight_entry, result_entry, result_name = "fc_weight", "fc_mean", "released mean coordinate"
    summary = ("FriendlyCore averaging (framework after Tsfadia et al.; filter and analysis ours): soft core of the "
               "points with many friends within r (public, or chosen privately on a public grid), a "
               "propose-test-release Gaussian mean whose noise scales with r, not a domain bound, refined by a "
               "noisy clipped sum around it (noise about the data's spread; refine: false for the friendly mean "
               "alone); or \"no friendly core\"")

    def example(self):
        return {"kind": "mean", "epsilon": 2.0, "delta": 1e-6, "r_min": 0.5, "r_max": 64.0}

    def _core_weight(self, records):
        if not records:
            return None, "needs a public guess of the number of records (--records)"
        return float(records), f"every one of {records} records in the core (W = n: points within r of most others)"

    def draw(self, prepared, measure, public_rng, log):
        X = _points(self.spec, prepared)
        return mean_draw(self.spec, release_mean(self.spec.release, X, measure), measure.plan)

    def evaluate(self, run, prepared, log):
        """L2 error of the released mean against the exact mean (internal)."""
        X = _points(self.spec, prepared)
        released = pq.read_table(run.release / RESULT).to_pandas()
        if not bool(released["released"].iloc[0]):
            return {"released": False, "headline": "no friendly core (nothing released)"}
        err = float(np.linalg.norm(released[self.spec.dataset.columns].to_numpy()[0] - X.mean(axis=0)))
        return {"released": True, "l2_error": err, "headline": f"L2 error of the mean {err:.4g}"}


class FriendlyKMeansKind(_FriendlyKind):
    name = "friendly_kmeans"
    Params = FriendlyKMeansParams
    weight_entry, result_entry, result_name = "fck_weight", "fck_centres", "released centre coordinate"
    summary = ("FriendlyCore k-means (framework after Tsfadia et al.; filter and analysis ours): non-private "
               "k-means++ on m random disjoint subsets, the k-tuples of centres aggregated by one friendly "
               "average of the core tuples; no domain bound needed")

    def example(self):
        return {"kind": "friendly_kmeans", "k": 2, "subsets": 100, "epsilon": 8.0, "delta": 1e-6, "r_min": 0.25,
                "r_max": 32.0}

    @cached_property
    def footprint(self):
        """The tuple predicate compares every pair of the m subsets' k-tuples (k^2 centre pairs of d coordinates)
        at every radius it is asked at: the radius search's probes and the final radius, about 10^8 such
        operations per second in numpy's blocks of 32 MB."""
        p, d = self.spec.release, len(self.spec.dataset.columns)
        radii = 1 if p.r is not None else fc.RadiusGrid(p.r_min, p.r_max).probes + 1
        pairs = float(p.subsets) ** 2
        return Footprint(64e6 + 8.0 * p.subsets * p.k * d, pairs * p.k * p.k * d * radii / 1e8,
                         f"the tuple predicate over {p.subsets:,} subsets' {p.k}-tuples")

    def _core_weight(self, records):
        m = self.spec.release.subsets
        return float(m), f"every one of the {m} subsets' k-tuples in the core (W = m: the subsets agree within r)"

    def draw(self, prepared, measure, public_rng, log):
        X = _points(self.spec, prepared)
        res = release_kmeans(self.spec.release, X, measure)
        info = {"released": res.released, "radius": res.radius, "noisy_core_weight": res.noisy_weight,
                "weight_lower_bound": res.weight_lower_bound, "radius_probes": [list(p) for p in res.probes]}
        cols, k = self.spec.dataset.columns, self.spec.release.k
        return Draw(write=lambda folder: _write(folder, cols, res.centres, k, info), meta={})

    def evaluate(self, run, prepared, log):
        """k-means cost of the released centres / k-means++ (best of 10) on the data (internal)."""
        X = _points(self.spec, prepared)
        released = pq.read_table(run.release / RESULT).to_pandas()
        if not bool(released["released"].iloc[0]):
            return {"released": False, "headline": "no friendly core (nothing released)"}
        ref, _ = metrics.kmeans_reference(X, self.spec.release.k, seed=0)
        ratio = metrics.wcss(X, released[self.spec.dataset.columns].to_numpy()) / ref if ref > 0 else math.nan
        return {"released": True, "cost_ratio_to_kmeanspp": ratio,
                "headline": f"k-means cost / k-means++ = {ratio:.4g}"}


MEAN = MeanKind()
KMEANS = FriendlyKMeansKind()
