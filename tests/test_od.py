"""The `od` kind (origin-destination tables, issue 46): the per-user bounding of trips (its choice, and a DP audit
that fails when the bound is broken), a release through the `dprelease` entry point with public row totals (marginal
consistency, non-negativity, totals, the outside cell, `dprelease query --origin/--destination`), and bad inputs."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from scipy import stats

from tasks import bounding
from tasks.kinds import od
from tasks.spec import parse_spec
from tests import conformance as C

ZONES = ["A", "B", "C", "D"]


def _kept_cells(users, cells, k, key) -> dict[str, Counter]:
    keep = bounding.kept(np.asarray(cells), np.asarray(users, dtype=object), k, key)
    out: dict[str, Counter] = {}
    for u, c in zip(np.asarray(users)[keep], np.asarray(cells)[keep]):
        out.setdefault(u, Counter())[int(c)] += 1
    return out


def _trips(n_users: int, seed: int, most: int = 6) -> tuple[list[str], list[int]]:
    rng = np.random.default_rng(seed)
    users, cells = [], []
    for i in range(n_users):
        m = int(rng.integers(1, most + 1))
        users += [f"u{i}"] * m
        cells += rng.integers(0, 9, m).tolist()
    return users, cells


def test_each_user_keeps_at_most_k_trips_and_all_of_them_when_fewer():
    users, cells = _trips(300, 0)
    have = Counter(users)
    kept = _kept_cells(users, cells, 3, "k" * 16)
    assert set(kept) == set(have)
    for u, n in have.items():
        assert sum(kept[u].values()) == min(n, 3)
    mine = {u: Counter(int(c) for uu, c in zip(users, cells) if uu == u) for u in have}
    assert all(kept[u] <= mine[u] for u in have)  # kept trips are the user's own


def test_the_choice_depends_on_the_key_and_the_users_own_trips_only():
    """Row order does not matter, and another user's presence does not change what a user keeps (the coupling
    the plan entry's sensitivity argument rests on)."""
    users, cells = _trips(200, 1)
    key = "0123456789abcdef"
    base = _kept_cells(users, cells, 2, key)
    order = np.random.default_rng(2).permutation(len(users))
    assert _kept_cells(np.asarray(users)[order], np.asarray(cells)[order], 2, key) == base
    with_u = _kept_cells(users + ["intruder"] * 30, cells + [4] * 30, 2, key)
    assert {u: c for u, c in with_u.items() if u != "intruder"} == base
    assert _kept_cells(users, cells, 2, "fedcba9876543210") != base  # the key decides


def test_the_kept_trips_are_a_uniform_random_subset_over_keys():
    """A user with trips to 4 distinct cells keeps 2: over 3,000 random keys each of the 6 pairs comes up about
    equally often (chi-square)."""
    rng = np.random.default_rng(3)
    seen = Counter()
    for _ in range(3000):
        kept = _kept_cells(["u"] * 4, [0, 3, 5, 8], 2, bounding.secret_key(rng))
        seen[tuple(sorted(kept["u"]))] += 1
    assert len(seen) == 6
    assert stats.chisquare(list(seen.values())).pvalue > 1e-4


def test_exhaustively_on_small_data_one_user_moves_the_bounded_counts_by_at_most_k():
    """Every dataset of two users with up to 2 trips each over 3 cells, plus every possible added user of up to 3
    trips, for k = 1 and 2: the bounded counts move by at most k in L1 (bounding.py's proof), and by exactly k where
    the added user has k trips or more."""
    from itertools import combinations_with_replacement

    trips = [t for n in range(3) for t in combinations_with_replacement(range(3), n)]
    added = [t for n in range(1, 4) for t in combinations_with_replacement(range(3), n)]
    key, checked = bounding.secret_key(np.random.default_rng(9)), 0
    for a, b in combinations_with_replacement(trips, 2):
        users, cells = ["v"] * len(a) + ["w"] * len(b), list(a) + list(b)
        for k in (1, 2):
            before = _counts(users, cells, k, key)
            for extra in added:
                after = _counts(users + ["u"] * len(extra), cells + list(extra), k, key)
                assert np.abs(after - before).sum() == min(k, len(extra))
                checked += 1
    assert checked == 55 * 2 * 19


def _plan_entry(k: int, epsilon: float = 1.0):
    spec = parse_spec({"dataset": {"id": "t", "path": "t.parquet", "user_column": "user",
                                   "categories": {"o": ["A", "B", "C"], "d": ["A", "B", "C"]}},
                       "release": {"kind": "od", "epsilon": epsilon, "origin": "o", "trips_per_user": k}})
    return od.KIND.bind(spec).plan["cells"]


def _counts(users, cells, k, key) -> np.ndarray:
    cells = np.asarray(cells, dtype=np.int64)
    if k is None:
        return np.bincount(cells, minlength=10).astype(float)
    keep = bounding.kept(cells, np.asarray(users, dtype=object), k, key)
    return np.bincount(cells[keep], minlength=10).astype(float)


@pytest.mark.slow  # OpenDP's sampler on both sides, 20-45 s each here (the conformance suite audits od by default)
@pytest.mark.parametrize("bounded", [True, False], ids=["bounded", "bound-broken"])
def test_dp_audit_of_the_bounding_fails_when_the_bound_is_broken(bounded):
    """Neighbours D and D' = D plus a heavy user (12 trips in two cells). Bounded to k = 2, the counts move by at
    most 2 in L1 for every key and the empirical privacy loss of the plan's sampler on the worst pair stays within
    epsilon; with the bound broken (every trip counted, the noise still k / epsilon) the counts move by 12 and the
    audit measures a loss far above epsilon."""
    k, mechanism = 2, _plan_entry(2)
    users, cells = _trips(150, 4)
    heavy_users, heavy_cells = users + ["heavy"] * 12, cells + [0] * 6 + [4] * 6
    rng, worst = np.random.default_rng(5), None
    for _ in range(40):
        key = bounding.secret_key(rng)
        a = _counts(users, cells, k if bounded else None, key)
        b = _counts(heavy_users, heavy_cells, k if bounded else None, key)
        change = np.abs(b - a).sum()
        if worst is None or change > worst[0]:
            worst = (change, a, b)
    change, a, b = worst
    scale = mechanism.scale
    loss, claimed = C.audit(mechanism, C.Call("cells", a, scale, a), C.Call("cells", b, scale, b))
    assert claimed == pytest.approx(1.0)
    if bounded:
        assert change <= mechanism.sensitivity and loss <= claimed
    else:
        assert change == 12 and loss > 2 * claimed


def test_the_plan_states_k_as_the_sensitivity_and_the_user_relation():
    m = _plan_entry(5, epsilon=0.5)
    assert m.sensitivity == 5 and m.scale == pytest.approx(10.0) and m.values == 10
    assert "user" in m.relation and "k = 5" in m.argument


# ---- a release through the entry point -------------------------------------------------------------------------------
def dprelease(*args, cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_HOME": str(Path(cwd).resolve() / ".prefect-home"), "PYTHONPATH":
           str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=600)


def _commuting(tmp_path: Path) -> tuple[Path, np.ndarray]:
    """One trip per user (home -> work) between 4 zones, a few to a zone outside them; the origin totals of the
    trips in the zones (a census's residents who commute, say): public."""
    rng = np.random.default_rng(7)
    p = rng.dirichlet(np.ones(16) * 0.7)
    cells = rng.choice(16, 3000, p=p)
    rows = [f"u{i},{ZONES[c // 4]},{ZONES[c % 4]}" for i, c in enumerate(cells)]
    rows += [f"x{i},A,Z" for i in range(40)]
    data = tmp_path / "trips.csv"
    data.write_text("user,origin,destination\n" + "\n".join(rows) + "\n")
    return data, np.bincount(cells, minlength=16).reshape(4, 4).astype(float)


@pytest.mark.slow  # a CLI release, ~40 s (pytest -m slow)
def test_release_through_the_cli_with_public_row_totals_then_queries(tmp_path, operator_ledger):
    data, truth = _commuting(tmp_path)
    marginals = tmp_path / "origins.csv"
    marginals.write_text("origin,destination,count\n" + "\n".join(f"{z},,{int(n)}" for z, n in
                                                                   zip(ZONES, truth.sum(axis=1))) + "\n")
    spec = {"dataset": {"id": "trips", "path": str(data), "user_column": "user",
                        "categories": {"origin": ZONES, "destination": ZONES}},
            "release": {"kind": "od", "epsilon": 1.0, "origin": "origin", "trips_per_user": 1,
                        "public_marginals": str(marginals),
                        "public_marginals_source": "the test's census (made for it)"},
            "output_dir": str(tmp_path / "runs")}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    for args in (["budget", "set", "trips", "--epsilon", "3", "--delta", "1e-6", "--source", str(data),
                  "--reading-from", str(tmp_path / "s.yaml")],
                 ["public", "register", str(marginals), "--source", "the test's census"]):
        assert dprelease(*args, cwd=tmp_path).returncode == 0
    ran = dprelease("run", str(tmp_path / "s.yaml"), "--release-id", "od-1", "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr[-3000:]
    rel = tmp_path / "runs" / "od-1" / "release"
    table = pq.read_table(rel / od.TABLE).to_pandas()
    count, estimate = table["count"].to_numpy(), table["estimate"].to_numpy()
    assert count.min() >= 0 and np.all(table["count_lo"] <= count) and np.all(count <= table["count_hi"])
    rows = lambda v: v.reshape(4, 4).sum(axis=1)  # noqa: E731
    assert np.allclose(rows(estimate), truth.sum(axis=1), atol=1e-6)        # consistent with the public totals
    assert np.abs(rows(count) - truth.sum(axis=1)).max() <= 1e-3 * truth.sum()  # ADMM within its tolerance
    totals = pq.read_table(rel / od.TOTALS).to_pandas()
    assert list(totals["side"]) == ["origin"] * 4 + ["destination"] * 4
    assert np.allclose(totals["estimate"][:4], rows(estimate)) and {"estimate_lo", "count_hi"} <= set(totals.columns)
    manifest = json.loads((rel / "manifest.json").read_text())
    (entry,) = manifest["privacy"]["mechanisms"]
    assert entry["sensitivity"] == 1.0 and "user" in entry["relation"]
    assert any("outside the public zones" in c for c in manifest["caveats"])
    noisy = pq.read_table(rel / "measurements" / od.NOISY).to_pandas()
    assert len(noisy) == 17 and noisy["origin"].isna().tolist() == [False] * 16 + [True]
    assert (tmp_path / "runs" / "od-1" / "internal" / "heatmap.png").exists()

    asked = dprelease("query", str(rel), "--origin", "B", "--json", cwd=tmp_path)
    assert asked.returncode == 0, asked.stderr
    answer = json.loads(asked.stdout)
    assert answer["estimate"] == pytest.approx(max(truth[1].sum(), 0.0), abs=1e-6)  # a public total: exact
    asked = dprelease("query", str(rel), "--pair", "C", "D", "--json", cwd=tmp_path)
    cell = json.loads(asked.stdout)
    assert cell["estimate"] == pytest.approx(max(estimate[2 * 4 + 3], 0.0)) and cell["lo"] <= cell["hi"]
    column = json.loads(dprelease("query", str(rel), "--destination", "A", "--json", cwd=tmp_path).stdout)
    assert column["estimate"] == pytest.approx(max(estimate.reshape(4, 4)[:, 0].sum(), 0.0))
    bad = dprelease("query", str(rel), "--origin", "Q", cwd=tmp_path)
    assert bad.returncode == 1 and bad.stderr.strip().count("\n") == 0 and "'Q' is not a zone" in bad.stderr
    both = dprelease("query", str(rel), "--origin", "A", "--range", "0", "2", cwd=tmp_path)
    assert both.returncode == 2 and "not allowed with" in both.stderr


# ---- bad inputs: one line, nothing charged ---------------------------------------------------------------------------
def _spec(tmp_path: Path, data: Path, dataset: dict | None = None, **release) -> Path:
    spec = {"dataset": {"id": "trips", "path": str(data), "user_column": "user",
                        "categories": {"origin": ZONES, "destination": ZONES}, **(dataset or {})},
            "release": {"kind": "od", "epsilon": 1.0, "origin": "origin", "trips_per_user": 2, **release},
            "output_dir": str(tmp_path / "runs")}
    spec["dataset"] = {k: v for k, v in spec["dataset"].items() if v is not None}
    spec["release"] = {k: v for k, v in spec["release"].items() if v is not None}
    path = tmp_path / f"s{abs(hash(json.dumps(spec, sort_keys=True)))}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


#: (case, dataset changes, release changes, exit code: 2 a spec error, 1 an input the admission read, error text)
BAD = [
    ("zones empty", {"categories": {"origin": [], "destination": ZONES}}, {}, 2, "non-empty list"),
    ("zone twice", {"categories": {"origin": ["A", "A"], "destination": ZONES}}, {}, 2, "without repeats"),
    ("one column", {"categories": {"origin": ZONES}}, {}, 2, "exactly two categorical columns"),
    ("origin not a column", {}, {"origin": "home"}, 2, "'home' is not one of the categorical columns"),
    ("origin missing", {}, {"origin": None}, 2, "release.origin"),
    ("k 0", {}, {"trips_per_user": 0}, 2, "trips_per_user"),
    ("k missing", {}, {"trips_per_user": None}, 2, "need trips_per_user"),
    ("k without users", {"user_column": None}, {}, 2, "has no user_column"),
    ("marginal zone unknown", {}, {"public_marginals": "unknown.csv", "public_marginals_source": "t"}, 1,
     "is not a public level"),
    ("marginals disagree", {}, {"public_marginals": "disagree.csv", "public_marginals_source": "t"}, 1,
     "inconsistent"),
]


@pytest.mark.parametrize("name,dataset,release,exit_code,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_inputs_are_one_line_and_charge_nothing(name, dataset, release, exit_code, expect, tmp_path,
                                                    operator_ledger):
    from flows.cli import main
    from tasks.ledger import configured_ledger

    data, _ = _commuting(tmp_path)
    (tmp_path / "unknown.csv").write_text("origin,destination,count\nQ,,5\n")
    # the origin totals sum to 20, the grand total says 30
    (tmp_path / "disagree.csv").write_text("origin,destination,count\nA,,5\nB,,5\nC,,5\nD,,5\n,,30\n")
    for f in ("unknown.csv", "disagree.csv"):
        configured_ledger().register_public(str(tmp_path / f), "the test's")
    configured_ledger().set_budget("trips", 5.0, 1e-6)
    release = {k: (str(tmp_path / v) if k == "public_marginals" else v) for k, v in release.items()}
    spec = _spec(tmp_path, data, dataset, **release)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        import contextlib
        import io
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["spec", "check", str(spec)])
    finally:
        os.chdir(cwd)
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert code == exit_code and len(lines) == 1 and lines[0].startswith("error:") and expect in lines[0], lines
    assert configured_ledger().releases("trips") == [] and not (tmp_path / "runs").exists()
    assert math.isclose(configured_ledger().budget("trips")[0], 5.0)


@pytest.mark.slow  # a release through the flow, ~30 s
def test_without_a_user_column_a_weighted_od_table_counts_each_trip_once(tmp_path, operator_ledger):
    """An aggregated table (one row per pair and its number of trips, weights_count_records): the unit is a trip, the
    sensitivity 1; the pair outside the zones lands in the outside cell; the column totals are the table's sums."""
    from flows.release import release

    data = tmp_path / "pairs.csv"
    data.write_text("from,to,trips\nA,B,300\nB,A,250\nC,C,40\nD,A,5\nA,Q,30\n")
    spec = parse_spec({"dataset": {"id": "pairs", "path": str(data), "weight_column": "trips",
                                   "weights_count_records": True,
                                   "categories": {"to": ZONES, "from": ZONES}},  # the order does not matter
                       "release": {"kind": "od", "epsilon": 2.0, "origin": "from"},
                       "output_dir": str(tmp_path / "runs"), "mode": "test", "seed": 3})
    assert od.KIND.bind(spec).plan["cells"].sensitivity == 1.0
    rel = Path(release(spec=spec)["release_dir"])
    table = pq.read_table(rel / od.TABLE).to_pandas().set_index(["from", "to"])
    assert abs(table.loc[("A", "B"), "estimate"] - 300) < 15 and abs(table.loc[("B", "A"), "estimate"] - 250) < 15
    noisy = pq.read_table(rel / "measurements" / od.NOISY).to_pandas()["noisy_count"].to_numpy()
    assert abs(noisy[-1] - 30) < 15
    totals = pq.read_table(rel / od.TOTALS).to_pandas()
    columns = table["estimate"].to_numpy().reshape(4, 4).sum(axis=0)
    assert np.allclose(totals["estimate"].to_numpy()[4:], columns)
