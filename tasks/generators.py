"""Generators of realistic set-valued records at the scale of Acs et al.'s proprietary datasets:

* CDR: 4.4M subscribers, the set of the 1,303 cell towers each visited (about 11.4 per subscriber, heavy
  tailed, up to a few hundred), in a 128 km^2 city;
* TRANSIT: 1.2M passengers, the set of the 342 stations each used (about 5.3 per passenger).

Spatial model: towers (stations) are denser downtown; every person has a home and a work anchor drawn from
a population density that is also concentrated downtown; each visit is a point near an anchor (or a random
roam), mapped to its nearest tower through a precomputed Voronoi raster. Tower popularity is therefore heavy
tailed (many people around the busy central towers). Output: partitioned Parquet with `user_id` (int64) and
a `list<int32>` column of distinct item ids. Deterministic given the seed (each partition has its own
stream), vectorised, one partition per dask task.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from dpalgos.arrays import distinct

RASTER = 1024


@dataclass(frozen=True)
class CityModel:
    """Public parameters of a synthetic city (km)."""
    name: str
    items: int                 # towers / stations
    side_km: float             # square city of side side_km
    mean_candidates: float     # mean visits drawn per person (distinct items come out lower)
    max_candidates: int
    anchor_spread_km: float    # std of visits around an anchor
    roam: float                # share of visits anywhere in the city
    item_column: str
    linear: bool = False       # stations on metro lines instead of a 2-D tower cloud


CDR = CityModel("cdr", items=1303, side_km=11.32, mean_candidates=13.5, max_candidates=700,
                anchor_spread_km=0.45, roam=0.08, item_column="towers")
TRANSIT = CityModel("transit", items=342, side_km=11.32, mean_candidates=6.4, max_candidates=90,
                    anchor_spread_km=0.6, roam=0.03, item_column="stations", linear=True)
MODELS = {"cdr": CDR, "transit": TRANSIT}


def _density(n: int, side: float, rng: np.random.Generator, central: float, spread: float = 0.08) -> np.ndarray:
    """Points of the city: a share `central` from a downtown Gaussian and sub-centres, the rest uniform."""
    centre = np.array([side / 2, side / 2])
    hubs = np.array([[0.3, 0.35], [0.7, 0.3], [0.65, 0.72], [0.28, 0.7]]) * side
    pick = rng.random(n)
    out = rng.uniform(0, side, size=(n, 2))
    down = pick < central * 0.6
    out[down] = centre + rng.normal(0, side * spread, size=(down.sum(), 2))
    sub = (pick >= central * 0.6) & (pick < central)
    out[sub] = hubs[rng.integers(0, len(hubs), sub.sum())] + rng.normal(0, side * spread * 0.75,
                                                                        size=(sub.sum(), 2))
    return np.clip(out, 0, side - 1e-9)


def item_positions(model: CityModel, seed: int) -> np.ndarray:
    """(items, 2) positions of the towers or stations (public geography)."""
    rng = np.random.default_rng([seed, 1])
    if not model.linear:
        # Towers are spread more evenly than people: central towers serve many more subscribers.
        return _density(model.items, model.side_km, rng, central=0.15)
    lines, side = 8, model.side_km
    per_line = int(np.ceil(model.items / lines))
    angles = np.linspace(0, np.pi, lines, endpoint=False) + rng.uniform(0, 0.2)
    t = np.linspace(-0.48, 0.48, per_line) * side
    pts = [np.column_stack([side / 2 + t * np.cos(a), side / 2 + t * np.sin(a)]) for a in angles]
    pts = np.concatenate(pts)[:model.items] + rng.normal(0, 0.05, size=(model.items, 2))
    return np.clip(pts, 0, side - 1e-9)


def voronoi_raster(model: CityModel, positions: np.ndarray) -> np.ndarray:
    """(RASTER, RASTER) nearest-item index of every cell of the city: a point -> item map by array lookup."""
    from scipy.spatial import cKDTree

    g = (np.arange(RASTER) + 0.5) * model.side_km / RASTER
    cells = np.stack(np.meshgrid(g, g, indexing="ij"), axis=-1).reshape(-1, 2)
    return cKDTree(positions).query(cells, workers=-1)[1].astype(np.int32).reshape(RASTER, RASTER)


def generate_partition(model: CityModel, raster: np.ndarray, first_user: int, users: int, seed: int) -> pa.Table:
    """`users` persons: each visits ~heavy-tailed many points around a home and a work anchor."""
    rng = np.random.default_rng([seed, 2, first_user])
    side = model.side_km
    home = _density(users, side, rng, central=0.6, spread=0.05)
    work = _density(users, side, rng, central=0.9, spread=0.04)
    # Heavy-tailed number of visits: lognormal, at least 1.
    sigma = 0.9
    mu = np.log(model.mean_candidates) - sigma ** 2 / 2
    n = np.clip(np.rint(rng.lognormal(mu, sigma, users)), 1, model.max_candidates).astype(np.int64)
    owner = np.repeat(np.arange(users), n)
    total = owner.size
    which = rng.random(total)
    anchor = np.where((which < 0.55)[:, None], home[owner], work[owner])
    pts = anchor + rng.normal(0, model.anchor_spread_km, size=(total, 2))
    roam = which > 1 - model.roam
    pts[roam] = rng.uniform(0, side, size=(roam.sum(), 2))
    cell = np.clip((pts / side * RASTER).astype(np.int64), 0, RASTER - 1)
    item = raster[cell[:, 0], cell[:, 1]].astype(np.int64)
    # Distinct items per person: sort (person, item) keys and keep first occurrences.
    key = distinct(owner * model.items + item)
    person, items = key // model.items, (key % model.items).astype(np.int32)
    offsets = np.concatenate([[0], np.cumsum(np.bincount(person, minlength=users))]).astype(np.int32)
    return pa.table({"user_id": np.arange(first_user, first_user + users, dtype=np.int64),
                     model.item_column: pa.ListArray.from_arrays(pa.array(offsets), pa.array(items))})


def generate(model: CityModel, out: Path, *, users: int, seed: int = 0, partition_rows: int = 200_000,
             client=None) -> list[Path]:
    """Write `users` records as out/part.<i>.parquet, one dask task per partition (or inline without client)."""
    out.mkdir(parents=True, exist_ok=True)
    raster = voronoi_raster(model, item_positions(model, seed))
    starts = list(range(0, users, partition_rows))
    paths = [out / f"part.{i}.parquet" for i in range(len(starts))]

    def one(i: int) -> str:
        table = generate_partition(model, raster, starts[i], min(partition_rows, users - starts[i]), seed)
        pq.write_table(table, paths[i])
        return str(paths[i])
    if client is None:
        for i in range(len(starts)):
            one(i)
    else:
        client.gather(client.map(_write_partition, [model] * len(starts), [raster] * len(starts), starts,
                                 [min(partition_rows, users - s) for s in starts], [seed] * len(starts),
                                 [str(p) for p in paths]))
    return paths


def _write_partition(model, raster, first, users, seed, path) -> str:
    pq.write_table(generate_partition(model, raster, first, users, seed), path)
    return path
