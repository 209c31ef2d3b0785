"""Simulated releases of one kind outside Prefect, for the coverage and planner benchmarks: the kind's own draw
with the production samplers (OpenDP over OS randomness), its postprocessing and the uncertainty step
(`tasks.stages.products`, exactly what the postprocess stage runs), on a fixed dataset whose exact statistic at
every noise call is recorded: the truth each interval is judged against."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from dpalgos.noise import ExactNoise, Measure, NoiseSource  # noqa: E402
from tasks import stages  # noqa: E402
from tasks.ingest import ingest_dataset  # noqa: E402
from tasks.kinds import kind_of  # noqa: E402
from tasks.run import META, RunPaths  # noqa: E402
from tasks.spec import parse_spec  # noqa: E402

LOG = logging.getLogger("simulate")


class Recorded(NoiseSource):
    """OpenDP's production samplers; every call's exact values are recorded (the simulation's truth)."""
    description = "benchmark: OpenDP exact samplers, exact statistics recorded"
    private = True

    def __init__(self):
        self.inner, self.calls, self.drawn = ExactNoise(), [], []

    def add(self, mechanism, values, scale):
        self.calls.append((mechanism.name, np.array(values, dtype=np.float64, copy=True)))
        out = self.inner.add(mechanism, values, scale)
        self.drawn.append((mechanism.name, np.array(out, dtype=np.float64, copy=True)))
        return out

    def step_generator(self):
        return self.inner.step_generator()

    def exact(self, name: str) -> list[np.ndarray]:
        return [v for n, v in self.calls if n == name]

    def noisy(self, name: str) -> list[np.ndarray]:
        return [v for n, v in self.drawn if n == name]


@dataclass
class Simulated:
    noise: Recorded
    measurements: Path
    release: Path
    spec: object = None
    source: Path | None = None

    def table(self, name: str):
        return pq.read_table(self.release / name).to_pandas()

    def points(self) -> np.ndarray:
        """The dataset's numeric columns as released from (the truth of a mean), read from the source file."""
        return _points(str(self.source), tuple(self.spec.dataset.columns))


@lru_cache(maxsize=4)
def _points(path: str, columns: tuple) -> np.ndarray:
    return pq.read_table(path, columns=list(columns)).to_pandas().to_numpy(dtype=np.float64)


class Simulator:
    """The spec's data ingested and prepared once; `release(folder)` draws, postprocesses and adds the
    uncertainty as a release would, into `folder`."""

    def __init__(self, spec: dict, folder: Path):
        self.spec = parse_spec(spec)
        self.kind = kind_of(self.spec)
        run = RunPaths(folder / "prepared")
        run.internal.mkdir(parents=True, exist_ok=True)
        ingested = ingest_dataset(self.spec.dataset, run.stage("ingested"), run.internal, LOG)
        self.prepared = self.kind.prepare(ingested, run, LOG)
        _memoise_counts()
        _memoise_friends()

    def release(self, folder: Path) -> Simulated:
        shutil.rmtree(folder, ignore_errors=True)
        measurements, release = folder / "measurements", folder / "release"
        for f in (measurements, release, folder / "internal"):
            f.mkdir(parents=True)
        plan, noise = self.kind.plan, Recorded()
        draw = self.kind.draw(self.prepared, Measure(plan, noise), np.random.default_rng(), LOG)
        draw.write(measurements)
        (measurements / META).write_text(json.dumps({"plan": plan.to_json(), **draw.meta}))
        stages.products(self.kind, measurements, release, folder / "internal", LOG)
        return Simulated(noise, measurements, release, self.spec, Path(self.spec.dataset.path))


def _memoise_friends() -> None:
    """FriendlyCore's friend counts at a radius, a deterministic function of the points and the radius (quadratic in
    the points: seconds per radius at 20,000 points), computed once per (points, radius) across the releases; the
    radius search visits the same public grid radii release after release. Set where `friendly_mean` looks the
    name up (its section of the package), not on the package."""
    from dpalgos.friendlycore import mean as fc_mean

    if getattr(fc_mean.friend_counter, "memoised", False):
        return
    exact, counters = fc_mean.friend_counter, {}

    class Memo:
        def __init__(self, inner):
            self.inner, self.cache = inner, {}

        def counts(self, r):
            if r not in self.cache:
                self.cache[r] = self.inner.counts(r)
            return self.cache[r].copy()

    def friend_counter(X, predicate="distance", **kwargs):
        key = (hashlib.sha256(np.ascontiguousarray(X).tobytes()).hexdigest(), predicate, tuple(sorted(kwargs.items())))
        if key not in counters:
            counters[key] = Memo(exact(X, predicate, **kwargs))
        return counters[key]
    friend_counter.memoised = True
    fc_mean.friend_counter = friend_counter


def _memoise_counts() -> None:
    """The count kinds' exact counts (a dask pass over the prepared data, the same every release: a deterministic
    function of it) computed once per prepared output: a 20-million-record histogram is simulated hundreds of
    times. Everything after the count, the noise included, runs as the release runs it."""
    from tasks.kinds import counts

    if getattr(counts.count, "memoised", False):
        return
    exact, cache = counts.count, {}

    def count(spec, prepared, index, size):
        key = (str(prepared.path), index, size, spec.dataset.weight_column is not None)
        if key not in cache:
            cache[key] = exact(spec, prepared, index, size)
        return cache[key].copy()
    count.memoised = True
    counts.count = count


def local_client():
    """An in-process dask cluster for the kinds' data passes (one worker thread: the machine is shared)."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0",
                           silence_logs=logging.WARNING)
    return cluster, Client(cluster, set_as_default=True)
