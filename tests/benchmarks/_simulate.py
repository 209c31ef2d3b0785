"""Simulated releases of one kind outside Prefect, for the coverage and planner benchmarks: the kind's own draw
with the production samplers (OpenDP over OS randomness), its postprocessing and the uncertainty step
(`tasks.stages.products`, exactly what the postprocess stage runs), on a fixed dataset whose exact statistic at
every noise call is recorded: the truth each interval is judged against."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from dataclasses import dataclass
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

    def table(self, name: str):
        return pq.read_table(self.release / name).to_pandas()


class Simulator:
    """The spec's data ingested and prepared once; `release(folder)` draws, postprocesses and adds the
    uncertainty as a release would, into `folder`."""

    def __init__(self, spec: dict, folder: Path):
        self.spec = parse_spec(spec)
        self.kind = kind_of(self.spec)
        run = RunPaths(folder / "prepared")
        run.internal.mkdir(parents=True, exist_ok=True)
        ingested = ingest_dataset(self.spec.dataset, run.stage("ingested"), run.internal, LOG)
        self.prepared = self.kind.prepare(self.spec, ingested, run, LOG)

    def release(self, folder: Path) -> Simulated:
        shutil.rmtree(folder, ignore_errors=True)
        measurements, release = folder / "measurements", folder / "release"
        for f in (measurements, release, folder / "internal"):
            f.mkdir(parents=True)
        plan, noise = self.kind.plan(self.spec), Recorded()
        draw = self.kind.draw(self.spec, self.prepared, Measure(plan, noise), np.random.default_rng(), LOG)
        draw.write(measurements)
        (measurements / META).write_text(json.dumps({"plan": plan.to_json(), **draw.meta}))
        stages.products(self.spec, measurements, release, folder / "internal", LOG)
        return Simulated(noise, measurements, release)


def local_client():
    """An in-process dask cluster for the kinds' data passes (one worker thread: the machine is shared)."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0")
    return cluster, Client(cluster, set_as_default=True)
