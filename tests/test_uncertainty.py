"""Every published value with its uncertainty (tasks/uncertainty.py, dpalgos/intervals.py): exact noise laws,
the bootstrap's coverage and reproducibility, the replicates' queries, the spec's fields, the planner and its
commands. Each test is seconds; the figures over hundreds of releases are tests/benchmarks/interval_coverage.py's."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml

from dpalgos.hierarchy import Tree
from dpalgos.intervals import NoiseLaw, min_replicates, percentile_interval, replicate_ranks
from tasks.errors import SpecError
from tasks.kinds import REGISTRY, counts, planning
from tasks.kinds.histogram import node_columns
from tasks.kinds.uncertainty import replicates_of
from tasks.run import META
from tasks.spec import parse_spec
from tasks.uncertainty import add_uncertainty

LOG = logging.getLogger("test-uncertainty")
LAWS = [NoiseLaw("laplace", True, 0.4), NoiseLaw("laplace", True, 3.0), NoiseLaw("laplace", True, 47.5),
        NoiseLaw("laplace", False, 2.0), NoiseLaw("gaussian", False, 2.0), NoiseLaw("gaussian", True, 0.7),
        NoiseLaw("gaussian", True, 5.3)]


def _pmf(law: NoiseLaw) -> tuple[np.ndarray, np.ndarray]:
    """The integer law's probabilities by brute-force summation, over +-60 scales."""
    k = np.arange(-math.ceil(60 * law.scale) - 5, math.ceil(60 * law.scale) + 6, dtype=np.float64)
    w = np.exp(-np.abs(k) / law.scale) if law.distribution == "laplace" else np.exp(-k * k / (2 * law.scale ** 2))
    return k, w / w.sum()


@pytest.mark.parametrize("law", [law for law in LAWS if law.integer], ids=str)
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_integer_laws_std_and_the_smallest_interval_from_the_exact_probabilities(law, confidence):
    k, p = _pmf(law)
    assert law.std() == pytest.approx(math.sqrt((p * k * k).sum()), rel=1e-9)
    h = law.half_width(confidence)
    assert h == int(h) and p[np.abs(k) <= h].sum() >= confidence > p[np.abs(k) <= h - 1].sum()
    assert law.attained(confidence) == pytest.approx(p[np.abs(k) <= h].sum(), abs=1e-12)


@pytest.mark.parametrize("law", [law for law in LAWS if law.integer], ids=str)
@pytest.mark.parametrize("confidence", [0.9, 0.95])
def test_randomised_direct_intervals_cover_exactly_at_the_confidence(law, confidence):
    """h or h - 1 by a public coin: the coverage, summed over the exact probabilities, is the confidence (the fixed
    h alone attains more: 97.3 % at b = 1); the coins' share of h is the rule's p."""
    k, p = _pmf(law)
    h = law.half_width(confidence)
    coins = np.random.default_rng(1).random(400_000)
    widths = law.randomised_half_widths(confidence, coins)
    assert set(np.unique(widths)) <= {h, h - 1}
    share = np.mean(widths == h)
    covered = share * p[np.abs(k) <= h].sum() + (1 - share) * p[np.abs(k) <= h - 1].sum()
    assert covered == pytest.approx(confidence, abs=0.002)
    assert np.mean(law.randomised_half_widths(confidence, np.zeros(10)) == h) == 1.0


def test_discrete_laplace_std_closed_form_and_opendp_accuracy():
    from opendp import accuracy

    b = 3.0
    q = math.exp(-1 / b)
    law = NoiseLaw("laplace", True, b)
    assert law.std() == pytest.approx(math.sqrt(2 * q) / (1 - q))
    assert law.half_width(0.95) == math.floor(accuracy.discrete_laplacian_scale_to_accuracy(b, 0.05))


@pytest.mark.parametrize("law", [law for law in LAWS if not law.integer], ids=str)
def test_real_laws_interval_is_the_exact_quantile(law):
    h = law.half_width(0.95)
    expected = (law.scale * math.log(20) if law.distribution == "laplace" else 1.959963984540054 * law.scale)
    assert h == pytest.approx(expected, rel=1e-9) and law.attained(0.95) == pytest.approx(0.95)


@pytest.mark.parametrize("law", LAWS, ids=str)
def test_public_draws_follow_the_law(law):
    """The bootstrap's draws: standard deviation within 2 %, interval mass within 0.005 of the exact one (a scale
    off by 1.5x moves both far more)."""
    x = law.sample(np.random.default_rng(1), (200_000,))
    assert x.std() == pytest.approx(law.std(), rel=0.02)
    assert np.mean(np.abs(x) <= law.half_width(0.95)) == pytest.approx(law.attained(0.95), abs=0.005)
    if law.integer:
        assert np.array_equal(x, np.rint(x))


def test_replicate_ranks_and_their_minimum():
    assert replicate_ranks(39, 0.95) == (0, 38) and replicate_ranks(199, 0.95) == (4, 194)
    assert replicate_ranks(19, 0.9) == (0, 18)
    assert (min_replicates(0.95), min_replicates(0.9), min_replicates(0.99)) == (39, 19, 199)
    with pytest.raises(ValueError, match="at least 39"):
        replicate_ranks(38, 0.95)
    lo, hi = percentile_interval(np.arange(39.0)[:, None], 0.95)
    assert (lo[0], hi[0]) == (0.0, 38.0)


def _spec(tmp_path, **release):
    (tmp_path / "v.csv").write_text("v\n1\n")
    return parse_spec({"dataset": {"id": "u", "path": str(tmp_path / "v.csv"), "bounds": {"v": [0, 16]}},
                       "release": {"kind": "histogram", "bins": 16, "branching": 4, "epsilon": 1.0,
                                   "strategy": "tree", **release}})


@pytest.mark.parametrize("release,message", [({"confidence": 1.5}, "release.confidence: Input should be less than 1"),
                                             ({"confidence": 0}, "release.confidence: Input should be greater than 0"),
                                             ({"replicates": 10}, "too few for a 0.95 interval: at least 39")])
def test_bad_uncertainty_fields_are_refused_on_one_line(tmp_path, release, message):
    with pytest.raises(SpecError, match=message) as err:
        _spec(tmp_path, **release)
    assert "\n" not in str(err.value)


def test_uncertainty_fields_stay_out_of_the_fingerprint(tmp_path):
    """They change no measurement: a release committed before them (or with another confidence) resumes as it was."""
    assert _spec(tmp_path).fingerprint() == _spec(tmp_path, confidence=0.9, replicates=0).fingerprint()


def test_default_replicates_follow_the_public_cost(tmp_path, monkeypatch):
    hist = REGISTRY["histogram"]
    assert replicates_of(hist.bind(_spec(tmp_path))) == 199
    assert replicates_of(hist.bind(_spec(tmp_path, replicates=0))) == 0
    assert replicates_of(hist.bind(_spec(tmp_path, confidence=0.99))) == 199
    big = parse_spec({"dataset": {"id": "u", "path": "x.csv", "bounds": {"v": [0, 1]}},
                      "release": {"kind": "matrix_mechanism", "bins": 1024, "epsilon": 1.0}})
    mm = REGISTRY["matrix_mechanism"]
    assert replicates_of(mm.bind(big)) == 199  # a replicate is least squares: 4 ms at 1,024 bins
    monkeypatch.setattr(type(mm), "replicate_seconds", lambda self, measurements=None: 0.1)
    assert replicates_of(mm.bind(big)) == 79  # 8 s of replicates at 0.1 s each, rounded to an exact order statistic
    monkeypatch.setattr(type(mm), "replicate_seconds", lambda self, measurements=None: 0.5)
    assert replicates_of(mm.bind(big)) == 39  # the fewest at 0.95



def test_the_default_replicates_fit_the_default_bootstrap_memory(tmp_path):
    """A 2^20-bin tree's time-chosen default (119 replicates, about 24 GB) made the whole release refused: the default
    B is bounded by MAX_DEFAULT_BOOTSTRAP_BYTES too, and skipped (null intervals, the reason naming the memory) when
    even the fewest replicates would not fit; a 2^18-bin tree keeps a smaller B within it, a 2^16-bin one all 199."""
    from tasks.kinds.uncertainty import MAX_DEFAULT_BOOTSTRAP_BYTES, replicate_bytes, skipped_reason

    hist = REGISTRY["histogram"]
    for bins, expected in ((2 ** 16, lambda b: b == 199), (2 ** 18, lambda b: 39 <= b < 199),
                           (2 ** 20, lambda b: b == 0)):
        spec = parse_spec({"dataset": {"id": "u", "path": "x.csv", "bounds": {"v": [0, 1]}},
                           "release": {"kind": "histogram", "bins": bins, "epsilon": 1.0, "strategy": "tree",
                                       "branching": 4}})
        count = replicates_of(hist.bind(spec))
        assert expected(count) and count * replicate_bytes(hist.bind(spec)) <= MAX_DEFAULT_BOOTSTRAP_BYTES
    assert "GiB" in skipped_reason(hist.bind(spec), tmp_path)


def test_a_default_bootstrap_too_costly_is_skipped_with_null_intervals_and_a_reason(tmp_path, monkeypatch):
    """A refinement's replicates grow with the noisy record count: at 1 s each the fewest (39) would take 39 s, past
    MAX_DEFAULT_BOOTSTRAP_SECONDS, so the default skips it (null interval columns that still pass the release
    contract, the reason in uncertainty.json); a spec that asks for replicates gets them whatever they cost."""
    from data_contracts.validate import validate_parquet
    from tasks.kinds.uncertainty import MAX_DEFAULT_BOOTSTRAP_SECONDS

    hist = REGISTRY["histogram"]
    monkeypatch.setattr(type(hist), "replicate_seconds", lambda self, measurements=None: 1.0)
    assert 39 * 1.0 > MAX_DEFAULT_BOOTSTRAP_SECONDS
    spec = _spec(tmp_path)
    made = []
    release = _release(spec, tmp_path / "r", np.random.default_rng(3), made)
    leaves = pq.read_table(release / "histogram.parquet")
    assert all(leaves[c].null_count == 16 for c in ("count_std", "count_lo", "count_hi"))
    assert not (release / "histogram_replicates.parquet").exists()
    reason = json.loads((release / "uncertainty.json").read_text())["bootstrap"]["reason"]
    assert "skipped by default" in reason and "about 39 s" in reason
    name, contract = hist.bind(spec).release_contract
    validate_parquet(release / name, contract)
    for file, c in made[0].contracts.items():
        validate_parquet(release / file, c)
    asked = _release(_spec(tmp_path, replicates=39), tmp_path / "asked", np.random.default_rng(3))
    assert pq.read_table(asked / "histogram.parquet")["count_lo"].null_count == 0

TRUTH = np.array([0, 0, 1, 3, 40, 80, 120, 60, 30, 10, 5, 2, 0, 150, 200, 90], dtype=float)


def _release(spec, folder: Path, rng: np.random.Generator, made: list | None = None) -> Path:
    """A histogram release made as the flow makes it, on noisy measurements of TRUTH (the plan's discrete Laplace,
    drawn from a seeded public generator here: this is a test, not a release); `made` receives what the
    uncertainty step reports."""
    kind, tree = REGISTRY["histogram"].bind(spec), Tree(16, 4)
    plan = kind.plan
    measurements, release = folder / "measurements", folder / "release"
    measurements.mkdir(parents=True)
    release.mkdir()
    noisy = tree.aggregate(TRUTH) + NoiseLaw.of(plan["tree"]).sample(rng, (tree.size,))
    counts.write_vector(measurements / "noisy_tree.parquet", "node", {"noisy_count": noisy}, **node_columns(tree))
    (measurements / META).write_text(json.dumps({"plan": plan.to_json()}))
    kind.postprocess(measurements, release, folder / "internal", LOG)
    report = add_uncertainty(kind, measurements, release, LOG)
    if made is not None:
        made.append(report)
    return release


def test_histogram_intervals_cover_at_their_confidence(tmp_path):
    """80 releases (B = 39): the direct intervals of the noisy tree, the bootstrap intervals of the signed estimate
    and those of the non-negative counts hold the truth about 95 % of the time, every bin included (near zero
    too: the estimate is linear, and the counts' intervals are its intervals cut at zero); a standard deviation off
    by 1.5x gives about 80 % or 99.7 %."""
    spec = _spec(tmp_path, replicates=39)
    rng = np.random.default_rng(7)
    direct, post, counted = [], [], []
    for i in range(80):
        release = _release(spec, tmp_path / f"r{i}", rng)
        tree_tab, leaves = pq.read_table(release / "noisy_tree.parquet"), pq.read_table(release / "histogram.parquet")
        exact = Tree(16, 4).aggregate(TRUTH)
        lo, hi = tree_tab["noisy_count_lo"].to_numpy(), tree_tab["noisy_count_hi"].to_numpy()
        direct.append((lo <= exact) & (exact <= hi))
        post.append((leaves["estimate_lo"].to_numpy() <= TRUTH) & (TRUTH <= leaves["estimate_hi"].to_numpy()))
        counted.append((leaves["count_lo"].to_numpy() <= TRUTH) & (TRUTH <= leaves["count_hi"].to_numpy()))
    assert 0.93 <= np.mean(direct) <= 0.985
    assert 0.92 <= np.mean(post) <= 0.985
    assert np.mean(post) <= np.mean(counted) <= 0.995


def test_bootstrap_is_centred_at_the_signed_estimate_and_count_intervals_hold_their_value(tmp_path):
    """The replicates redraw the noise around the tree of the released signed estimate (a consistent tree), never
    around the noisy measurements; each non-negative count's interval is the estimate's cut at zero and widened
    to hold the count (`bounded_interval`), so it holds its own value."""
    from tasks.kinds.uncertainty import bounded_interval

    spec = _spec(tmp_path, replicates=39)
    kind, tree = REGISTRY["histogram"].bind(spec), Tree(16, 4)
    release = _release(spec, tmp_path / "r", np.random.default_rng(11))
    measurements = tmp_path / "r" / "measurements"
    (center,) = kind.bootstrap(measurements, release, kind.plan).centers
    table = pq.read_table(release / "histogram.parquet").to_pandas()
    noisy = pq.read_table(measurements / "noisy_tree.parquet")["noisy_count"].to_numpy()
    assert np.allclose(center.values, tree.aggregate(table["estimate"])) and not np.allclose(center.values, noisy)
    lo, hi = bounded_interval(table["count"].to_numpy(), table["estimate_lo"].to_numpy(),
                              table["estimate_hi"].to_numpy())
    assert np.array_equal(lo, table["count_lo"]) and np.array_equal(hi, table["count_hi"])
    assert (table["count_lo"] <= table["count"]).all() and (table["count"] <= table["count_hi"]).all()
    assert (table["count_lo"] >= 0).all() and (table["count"] >= 0).all()


def test_replicates_reproducible_from_the_measurements_and_no_noise_source(tmp_path, monkeypatch):
    from dpalgos import noise

    def refuse(*args, **kwargs):
        raise AssertionError("the uncertainty step reached a noise source")
    for name in ("add", "step_generator"):
        monkeypatch.setattr(noise.ExactNoise, name, refuse)
    monkeypatch.setattr(noise.Measure, "secret_generator", refuse)
    spec = _spec(tmp_path, replicates=39)
    first = _release(spec, tmp_path / "a", np.random.default_rng(3))
    second = tmp_path / "b" / "release"
    second.mkdir(parents=True)
    kind = REGISTRY["histogram"].bind(spec)
    kind.postprocess(first.parent / "measurements", second, tmp_path / "b", LOG)
    add_uncertainty(kind, first.parent / "measurements", second, LOG)
    for f in sorted(first.iterdir()):
        assert f.read_bytes() == (second / f.name).read_bytes(), f.name
    other = _release(spec, tmp_path / "c", np.random.default_rng(4))  # other measurements, another seed
    seeds = [json.loads((r / "uncertainty.json").read_text())["bootstrap"]["seed"] for r in (first, other)]
    assert seeds[0] != seeds[1]


def test_queries_through_the_replicates_agree_with_the_published_columns(tmp_path):
    """Sums are answered from the signed estimate, cut at zero (the truth is a count); one bin reproduces its
    published estimate and interval; a difference of bins (a weight below zero) is not cut."""
    from tasks.replicates import Replicates

    release = _release(_spec(tmp_path, replicates=39), tmp_path / "r", np.random.default_rng(5))
    hist = Replicates.open(release)
    table = pq.read_table(release / "histogram.parquet").to_pandas()
    one = hist.range_sum(5, 6)
    cut = lambda v: max(v, 0.0)
    assert (one.estimate, one.lo, one.hi) == pytest.approx((cut(table["estimate"][5]), cut(table["estimate_lo"][5]),
                                                            cut(table["estimate_hi"][5])))
    assert one.std == pytest.approx(table["estimate_std"][5])
    both = hist.linear({4: 1.0, 5: -1.0})
    assert both.estimate == pytest.approx(table["estimate"][4] - table["estimate"][5]) and both.lo <= both.hi
    wide = hist.range_sum(0, 16, confidence=0.9)
    assert wide.estimate == pytest.approx(cut(table["estimate"].sum())) and wide.replicates == 39
    estimates, lo, hi = hist.range_sums([0, 5, 2], [16, 6, 9], confidence=0.9)
    assert estimates[0] == pytest.approx(wide.estimate) and (lo[0], hi[0]) == pytest.approx((wide.lo, wide.hi))
    assert (estimates[1], lo[1], hi[1]) == pytest.approx((one.estimate, hist.range_sum(5, 6, confidence=0.9).lo,
                                                          hist.range_sum(5, 6, confidence=0.9).hi))
    with pytest.raises(ValueError, match="start < stop"):
        hist.range_sum(3, 3)


def test_planner_least_squares_std_matches_simulated_releases():
    """The planner's exact figure for Htree's released leaves and a range, against 400 simulated postprocessings
    of a histogram far from zero (within 10 %)."""
    from tasks.kinds.histogram import consistent_leaves

    spec = parse_spec({"dataset": {"id": "u", "path": "x.csv", "bounds": {"v": [0, 16]}},
                       "release": {"kind": "histogram", "bins": 16, "branching": 4, "epsilon": 1.0,
                                   "consistency": "htree"}})
    rows = {r.quantity: r.std for r in REGISTRY["histogram"].bind(spec).accuracy()}
    tree, law = Tree(16, 4), NoiseLaw("laplace", True, 3.0)
    truth = np.full(16, 500.0)
    rng = np.random.default_rng(0)
    err = np.array([consistent_leaves(tree, tree.aggregate(truth) + law.sample(rng, (tree.size,)), "htree",
                                      noise_scale=3.0, penalty="elastic", alpha=0.9, rho=2.0)[0] - truth
                    for _ in range(400)])
    assert np.sqrt(err.var(axis=0).mean()) == pytest.approx(rows["released bin count"], rel=0.1)
    cumulative = np.concatenate([np.zeros((400, 1)), np.cumsum(err, axis=1)], axis=1)
    starts = planning.range_starts(16, 8)  # the planner's public positions
    ranges = cumulative[:, starts + 8] - cumulative[:, starts]
    assert np.sqrt(ranges.var(axis=0).mean()) == pytest.approx(rows["range sum of 8 bins (random position)"], rel=0.1)


def test_planner_centroid_formula_matches_the_noisy_ratio():
    from tasks.kinds.kmeans import centroid_std

    counts_law, sums_law = NoiseLaw("laplace", True, 6.0), NoiseLaw("laplace", False, 4.0)
    rng = np.random.default_rng(0)
    n, c = 400.0, 0.6
    ratio = (c * n + sums_law.sample(rng, (100_000,))) / (n + counts_law.sample(rng, (100_000,)))
    assert ratio.std() == pytest.approx(centroid_std(counts_law, sums_law, n, c), rel=0.1)
    assert ratio.std() != pytest.approx(sums_law.std() / n, rel=0.1)  # the count's term matters at c = 0.6


def test_accuracy_command_reads_neither_data_nor_ledger(tmp_path, monkeypatch, capsys):
    from flows.cli import main
    from tasks.ledger import LEDGER_ENV

    ledger = tmp_path / "no-such-folder" / "ledger.sqlite"
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    spec = {"dataset": {"id": "planned", "path": str(tmp_path / "missing.csv"), "bounds": {"v": [0, 16]}},
            "release": {"kind": "histogram", "bins": 16, "branching": 4, "epsilon": 1.0}}
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    assert main(["accuracy", str(tmp_path / "s.yaml"), "--epsilon", "0.5", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stds = [e["quantities"][0]["std"] for e in out["epsilons"]]
    assert [e["epsilon"] for e in out["epsilons"]] == [0.5, 2.0] and stds[0] > 3 * stds[1]
    assert not ledger.parent.exists() and not (tmp_path / "missing.csv").exists()
    with pytest.raises(SystemExit) as exit_:
        main(["accuracy", str(tmp_path / "s.yaml"), "--epsilon", "0"])
    assert exit_.value.code == 2


def test_query_command_answers_a_range_with_its_interval(tmp_path, capsys):
    from flows.cli import main

    release = _release(_spec(tmp_path, replicates=39), tmp_path / "r", np.random.default_rng(6))
    assert main(["query", str(release), "--range", "4", "8", "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    total = max(pq.read_table(release / "histogram.parquet").column("estimate").to_numpy()[4:8].sum(), 0.0)
    assert answer["estimate"] == pytest.approx(total) and answer["lo"] <= answer["hi"] and answer["replicates"] == 39
    assert main(["query", str(release), "--weights", "4:1,9:-1", "--column", "nope"]) == 1


def test_no_friendly_core_publishes_null_intervals_and_no_replicates(tmp_path):
    """A mean that was not released ("no friendly core") keeps its columns, with null uncertainty columns."""
    spec = parse_spec({"dataset": {"id": "u", "path": "x.parquet", "numeric": ["a", "b"]},
                       "release": {"kind": "mean", "epsilon": 1.0, "delta": 1e-6, "r": 1.0}})
    kind = REGISTRY["mean"].bind(spec)
    measurements, release = tmp_path / "measurements", tmp_path / "release"
    measurements.mkdir()
    release.mkdir()
    from tasks.kinds.friendlycore import _write

    _write(measurements, ["a", "b"], None, 1, {"released": False, "radius": 1.0, "noisy_core_weight": -3.0,
                                               "weight_lower_bound": -20.0})
    (measurements / META).write_text(json.dumps({"plan": kind.plan.to_json()}))
    kind.postprocess(measurements, release, tmp_path, LOG)
    made = add_uncertainty(kind, measurements, release, LOG)
    result = pq.read_table(release / "result.parquet").to_pandas()
    assert list(result.columns) == ["released", "a", "b", "a_std", "a_lo", "a_hi", "b_std", "b_lo", "b_hi"]
    assert result[["a_std", "a_lo", "b_hi"]].isna().all().all()
    assert "result_replicates.parquet" not in made.files and not (release / "result_replicates.parquet").exists()


def test_uncertainty_files_pass_their_contracts_and_a_broken_interval_is_caught(tmp_path):
    from data_contracts.validate import ContractViolation, validate_parquet

    spec, made = _spec(tmp_path, replicates=39), []
    release = _release(spec, tmp_path / "r", np.random.default_rng(8), made)
    contracts = made[0].contracts
    assert set(contracts) == {"noisy_tree.parquet", "histogram.parquet", "tree.parquet", "histogram_replicates.parquet"}
    for name, contract in contracts.items():
        validate_parquet(release / name, contract)
    name, release_contract = REGISTRY["histogram"].bind(spec).release_contract
    validate_parquet(release / name, release_contract)
    table = pq.read_table(release / name).to_pandas()
    table.loc[3, "count_lo"] = table.loc[3, "count_hi"] + 1.0  # an interval whose ends are swapped
    table.to_parquet(release / name)
    for contract in (contracts[name], release_contract):
        with pytest.raises(ContractViolation, match="interval_violations"):
            validate_parquet(release / name, contract)
    reps = pq.read_table(release / "histogram_replicates.parquet").to_pandas()
    reps.loc[7, "estimate"] = np.inf
    reps.to_parquet(release / "histogram_replicates.parquet")
    with pytest.raises(ContractViolation, match="non_finite_values"):
        validate_parquet(release / "histogram_replicates.parquet", contracts["histogram_replicates.parquet"])


def test_report_plots_and_tables_a_value_outside_its_bootstrap_interval(tmp_path):
    """A percentile interval need not contain the released value (postprocessing is biased near zero): the report's
    plot and table must still be made (an error-bar plot refused it and failed the run's report)."""
    from tasks import intervals_report

    release = _release(_spec(tmp_path, replicates=39), tmp_path / "r", np.random.default_rng(9))
    table = pq.read_table(release / "histogram.parquet").to_pandas()
    table.loc[0, "estimate"] = table.loc[0, "estimate_hi"] + 5.0
    table.to_parquet(release / "histogram.parquet")
    uncertainty = json.loads((release / "uncertainty.json").read_text())
    assert intervals_report.plot(release, uncertainty, tmp_path / "i.png").stat().st_size > 0
    header, rows = intervals_report.table(release, uncertainty)
    assert header[1].startswith("histogram.parquet: count") and header[2].startswith("histogram.parquet: estimate")
    assert len(rows) == intervals_report.TABLE_ROWS


def test_query_of_a_damaged_release_or_a_bad_column_is_one_line_through_the_entry_point(tmp_path):
    """`dprelease query` as a shell calls it: a release whose replicates are missing or unreadable, an unreadable
    uncertainty.json, and a sum asked of `count` (no replicates: sums come from `estimate`) each give one `error:`
    line and exit 1, no traceback."""
    import subprocess
    import sys

    release = _release(_spec(tmp_path, replicates=39), tmp_path / "r", np.random.default_rng(6))
    query = lambda *args: subprocess.run([sys.executable, "-m", "flows.cli", "query", str(release), *args],
                                         capture_output=True, text=True, timeout=120)
    answer = query("--range", "4", "8", "--json")
    assert answer.returncode == 0 and json.loads(answer.stdout)["column"] == "estimate"
    wrong = query("--range", "0", "16", "--column", "count")
    assert "answered from 'estimate'" in wrong.stderr
    replicates = release / "histogram_replicates.parquet"
    damaged = [lambda: replicates.unlink(), lambda: replicates.write_text("not parquet"),
               lambda: (release / "uncertainty.json").write_text("{")]
    outcomes = [wrong]
    for damage in damaged:
        damage()
        outcomes.append(query("--range", "4", "8"))
    for out in outcomes:
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1 and lines[0].startswith("error:"), out.stderr
        assert "Traceback" not in out.stderr
