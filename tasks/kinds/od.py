"""The `od` release kind: an origin-destination table of trips over PUBLIC zone lists, per user where a user column
exists (each user's trips bounded to a public k, `tasks.bounding`), made consistent with the public row and column
totals the operator registers by the contingency kind's machinery (Laplace on every cell, ADMM or empirical Bayes,
the signed least-squares table for sums: `tasks.kinds.contingency`).

The dataset names two categorical columns, origin then destination, whose public levels are the zones
(`dataset.categories`); a trip whose origin or destination is not a public zone is not dropped in silence: it is
counted in one more cell, "outside", measured with the others (the last row of the noisy cells) and published as a
caveat with its interval.

Published: od.parquet (a row per origin-destination pair: the non-negative `count` and the signed `estimate` whose
sums are unbiased), od_totals.parquet (the row and column totals, sums of those), consistency.json, the measurements,
intervals on every number, a heat map of the table in the report.
"""

from __future__ import annotations

import json
from functools import cached_property, partial
from typing import Literal

import numpy as np
from pydantic import Field

from data_contracts import suites
from dpalgos.intervals import NoiseLaw
from dpalgos.lazy import module
from dpalgos.plan import Mechanism, Plan
from tasks.kinds.base import Draw, Heatmap
from tasks.kinds.contingency import ContingencyKind, ContingencyParams, released_table
from tasks.kinds.uncertainty import Direct, Product, bootstrap_planned
from tasks.run import committed_plan

contingency = module("dpalgos.contingency")
counts = module("tasks.kinds.counts")
bounding = module("tasks.bounding")
partitions = module("tasks.partitions")
validate = module("data_contracts.validate")

#: The most trips per user a spec may bound to (a larger k is no bound at CDR scale, and its noise swamps the table).
MAX_TRIPS_PER_USER = 10_000
RELATION = "add or remove one user (all of a user's trips)"
NOISY = "noisy_cells.parquet"
TABLE = "od.parquet"
TOTALS = "od_totals.parquet"
CONSISTENCY = "consistency.json"


class OdParams(ContingencyParams):
    """Origin-destination table of trips over the public zones (dataset.categories: origin, then destination):
    Laplace on every cell and on the count of trips outside the zones, made consistent with PUBLIC row / column
    totals (public_marginals) and non-negative; with a user column each user's trips are bounded to trips_per_user."""
    kind: Literal["od"] = Field("od", description="the release kind")
    origin: str = Field(description="which of the two categorical columns holds the origin zone (the other holds the "
                                    "destination): the table's rows")
    trips_per_user: int | None = Field(
        None, ge=1, le=MAX_TRIPS_PER_USER,
        description="k, PUBLIC: the most trips one user contributes (a uniform random k of a user's trips are kept, "
                    "by a secret keyed hash); required with dataset.user_column, refused without; the noise scale "
                    "is k / epsilon")


class OdKind(ContingencyKind):
    name = "od"
    Params = OdParams
    shape = "trips"
    prepared_stage = "encoded"
    summary = ("origin-destination table over PUBLIC zones: each user's trips bounded to a public k (keyed random "
               "choice, dask), Laplace on every cell and on the trips outside the zones, made consistent with "
               "PUBLIC row / column totals and non-negative (the contingency machinery); row and column totals")

    def example(self):
        return {"kind": "od", "epsilon": 1.0, "origin": "origin", "trips_per_user": 2}

    @cached_property
    def table(self):
        """Origins (rows) by destinations (columns), whatever the order of the categories in the spec."""
        cats, origin = self.spec.dataset.categories, self.spec.release.origin
        (destination,) = (c for c in cats if c != origin)
        return contingency.Table((origin, destination), (tuple(cats[origin]), tuple(cats[destination])))

    def check_release(self, dataset, release):
        """The origin is one of the two categorical columns; k goes with a user column and only with it."""
        if release.origin not in (dataset.categories or {}):
            raise ValueError(f"origin {release.origin!r} is not one of the categorical columns "
                             f"{sorted(dataset.categories or {})}")
        if dataset.user_column and release.trips_per_user is None:
            raise ValueError("od releases with a user_column need trips_per_user (k, the public most trips a user "
                             "contributes)")
        if release.trips_per_user is not None and not dataset.user_column:
            raise ValueError("trips_per_user bounds each user's trips: the dataset has no user_column (every row is "
                             "then one trip, one privacy unit)")

    @cached_property
    def plan(self):
        """One Laplace entry over the table's cells and the outside cell (one vector, so that a user's trips across
        all of them are one L1 budget)."""
        table, p = self.table, self.spec.release
        n_o, n_d = table.shape
        query = f"trips per cell of the {n_o} x {n_d} origin-destination table, and trips outside its zones"
        if self.spec.dataset.user_column:
            k = p.trips_per_user
            argument = (
                f"neighbours add or remove one user u with all their trips. Every user keeps at most k = {k} trips "
                f"(trips_per_user, public), chosen by tasks/bounding.kept from a secret key drawn independently of the "
                f"data and from that user's own trips only: under one key, every other user keeps exactly the same "
                f"trips with or without u, so the counts (cells and outside) differ only by u's kept trips, each "
                f"adding 1 to one count: L1 sensitivity {k}, for every key, hence for the draw of the key")
            return Plan((Mechanism("cells", query, "laplace", float(k), argument, 1.0 / p.epsilon, integer=True,
                                   values=table.size + 1, relation=RELATION),))
        w = self.spec.dataset.unit_weight
        argument = (f"a trip (one row, the privacy unit) falls in exactly one cell or outside the zones and adds at "
                    f"most {w} to that count (its weight capped at max_weight, or 1): L1 sensitivity {w}")
        return Plan((Mechanism("cells", query, "laplace", float(w), argument, 1.0 / p.epsilon, integer=True,
                               values=table.size + 1),))

    def prepare(self, ingested, run, log):
        """Every trip encoded as its cell (outside the zones: the extra cell); with a user column written into buckets
        of users (a hash of the id), one file per ingested partition and bucket."""
        table = self.table
        size, columns, levels = table.size, list(table.names), list(table.levels)
        if self.spec.dataset.user_column:
            fn = partial(bounding.scatter_trips, columns=columns, levels=levels, user=self.spec.dataset.user_column,
                         buckets=max(1, ingested.partitions))
        else:
            fn = partial(partitions.cell_partition, columns=columns, levels=levels, outside=size,
                         weight=self.spec.dataset.weight_column, max_weight=self.spec.dataset.max_weight)
        out = counts.encode(run, ingested, fn, log)
        log.info("encoded the trips into the %d cells of the table and the outside cell", size)
        return out

    @cached_property
    def prepared_contract(self):
        return suites.encoded("cell", self.table.size + 1, "weight" if self.spec.dataset.weight_column else None,
                              "user" if self.spec.dataset.user_column else None)

    def _counts(self, prepared, key: str | None, bounded: bool = True):
        """Trips per cell and outside (raw-derived): bounded per user by `key` (with a user column), on the workers;
        only the count vectors reach the driver."""
        size = self.table.size + 1
        if not self.spec.dataset.user_column:
            return counts.count(self.spec, prepared, "cell", size)
        groups = bounding.buckets(validate.parquet_files(prepared.path))
        k = self.spec.release.trips_per_user if bounded else None
        client = partitions.current_client()
        futures = client.map(bounding.bucket_counts, groups, k=k, secret=key, size=size, pure=False)
        return np.sum(client.gather(futures), axis=0) if groups else np.zeros(size)

    def draw(self, prepared, measure, public_rng, log):
        table = self.table
        key = bounding.secret_key(measure.secret_generator()) if self.spec.dataset.user_column else None
        noisy = measure("cells", self._counts(prepared, key))
        meta = {"attributes": list(table.names), "levels": [list(lv) for lv in table.levels],
                "outside": f"row {table.size}: trips with an origin or destination outside the zones"}
        return Draw(write=lambda folder: counts.write_vector(folder / NOISY, "cell", {"noisy_count": noisy},
                                                             **_level_columns(table, outside=True)), meta=meta)

    @cached_property
    def measurements_contract(self):
        t = self.table
        return NOISY, suites.indexed_table("measurements", "cell", t.size + 1, ["noisy_count"], other_columns=t.names)

    def postprocess(self, measurements, staging, internal, log):
        """The table (`count` non-negative, `estimate` signed least squares consistent with the public totals), its
        row and column totals (sums of each), and the noisy outside count (a measurement, in consistency.json)."""
        table = self.table
        noisy = counts.read_column(measurements / NOISY, "noisy_count")
        marginals, values, _A = self.marginals
        released = released_table(self.spec.release, table, noisy[:table.size], marginals, values,
                                  committed_plan(measurements)["cells"].scale)
        counts.write_vector(staging / TABLE, "cell", {"count": released.count, "estimate": released.estimate},
                            **_level_columns(table))
        totals = totals_of(table, marginals, values)
        counts.write_vector(staging / TOTALS, "total", {"count": totals(released.count),
                                                        "estimate": totals(released.estimate)}, **_total_labels(table))
        info = {**released.info, "origin_column": table.names[0], "destination_column": table.names[1],
                "outside_zones_noisy": float(noisy[table.size]),
                "trips_per_user": self.spec.release.trips_per_user}
        (staging / CONSISTENCY).write_text(json.dumps(info, indent=2))
        return [TABLE, TOTALS, CONSISTENCY]

    @cached_property
    def release_contract(self):
        t = self.table
        intervals = ["estimate", "count"] if bootstrap_planned(self) else []
        return TABLE, suites.indexed_table("release", "cell", t.size, ["count", "estimate"], nonnegative=["count"],
                                           other_columns=t.names, intervals=intervals)

    def direct_values(self, measurements, plan):
        return [Direct(NOISY, "noisy_count", "cells", NoiseLaw.of(plan["cells"]))]

    @cached_property
    def replicate_values(self):
        t = self.table
        return float(t.size + sum(t.shape))  # the cells and the totals

    def bootstrap(self, measurements, staging, plan):
        """Around the released signed estimate (the outside cell around its noisy count cut at zero): the estimate is
        affine in the noise, so each replicate's error has the release's law; the totals are sums of it."""
        table = self.table
        marginals, values, A = self.marginals
        ls, totals = contingency.least_squares_table(A, values), totals_of(table, marginals, values)
        estimate = counts.read_column(staging / TABLE, "estimate")
        outside = max(float(counts.read_column(measurements / NOISY, "noisy_count")[table.size]), 0.0)

        def solve(y):
            x = ls(y[:table.size])
            return {TABLE: x[:, None], TOTALS: totals(x)[:, None]}
        return counts.signed_bootstrap(
            TABLE, "cell", "cells", NoiseLaw.of(plan["cells"]), np.append(estimate, outside), solve,
            also=(Product(TOTALS, "total", ("estimate",), bounded=(("count", "estimate"),)),),
            notes=("the public totals are the same in every replicate",
                   "the bounding of each user's trips to trips_per_user is not replicated: the intervals are for "
                   "the bounded table"))

    def caveats(self, staging):
        """The trips outside the zones (a noisy count, published) and, per user, the trips cut by the bound."""
        info = json.loads((staging / CONSISTENCY).read_text())
        law = NoiseLaw.of(self.plan["cells"])
        h = law.half_width(self.spec.release.confidence)
        out = [f"trips with an origin or destination outside the public zones are not in the table: a noisy "
               f"{info['outside_zones_noisy']:.0f} (+/- {h:.3g} at {self.spec.release.confidence:g}; the last row of "
               f"measurements/{NOISY})"]
        if self.spec.dataset.user_column:
            out.append(f"each user's trips were cut to {self.spec.release.trips_per_user} (trips_per_user, a uniform "
                       f"random choice): the table counts the trips kept, and users with more trips are under-counted")
        return out

    def heatmap(self, release):
        table = self.table
        values = counts.read_column(release / TABLE, "count").reshape(table.shape)
        return Heatmap(values, table.levels[0], table.levels[1], f"{table.names[0]} (rows)",
                       f"{table.names[1]} (columns)", "released trips per origin-destination pair (count)")

    def evaluate(self, run, prepared, log):
        """Against the raw, unbounded table (what a user of the table wants): the bound's cut shows in it."""
        table = self.table
        exact = self._counts(prepared, None, bounded=False)[:table.size]
        released = counts.read_column(run.release / TABLE, "count")
        mse = float(np.mean((released - exact) ** 2))
        total = float(exact.sum())
        gap = float(released.sum() - total)
        return {"trips_in_zones": total, "cell_mse": mse, "total_gap": gap,
                "headline": f"cell MSE {mse:.4g} against the unbounded table; released total - true total "
                            f"{gap:.4g} (of {total:.0f} trips in the zones)"}


def _level_columns(table, outside: bool = False) -> dict[str, list]:
    """The origin and destination of every cell (and a null pair for the outside cell)."""
    cells = table.cell_levels() + ([(None, None)] if outside else [])
    return {name: [c[j] for c in cells] for j, name in enumerate(table.names)}


def totals_matrix(table) -> np.ndarray:
    """The (origins + destinations, cells) 0/1 matrix of the row totals, then the column totals."""
    n_o, n_d = table.shape
    return np.vstack([np.kron(np.eye(n_o), np.ones(n_d)), np.kron(np.ones(n_o), np.eye(n_d))])


def totals_of(table, marginals: list[dict], values: np.ndarray):
    """The row and column totals of a table (cells,) -> (origins + destinations,), those a public marginal fixes set
    to it: the estimate's sums equal them up to rounding (1e-12), and a total published as 1121.0000000001 with an
    interval of replicates as far off on either side held the truth 1121 only by chance (17% of releases)."""
    sums = totals_matrix(table)
    n_o = table.shape[0]
    fixed = {(0 if name == table.names[0] else n_o) + table.levels[table.names.index(name)].index(level): v
             for m, v in zip(marginals, values) if len(m) == 1 for name, level in m.items()}
    rows, public = np.fromiter(fixed, dtype=np.int64, count=len(fixed)), np.fromiter(fixed.values(), np.float64,
                                                                                       count=len(fixed))

    def totals(x: np.ndarray) -> np.ndarray:
        out = sums @ x
        out[rows] = public
        return out
    return totals


def _total_labels(table) -> dict[str, list]:
    return {"side": ["origin"] * table.shape[0] + ["destination"] * table.shape[1],
            "zone": list(table.levels[0]) + list(table.levels[1])}


KIND = OdKind()
