"""The release flow end to end: real Prefect (test harness API), real dask cluster, real GX, real Parquet."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import flows.release
from data_contracts import ContractViolation
from dpalgos import domain, leekifer, metrics
from dpalgos.intervals import min_replicates
from flows.release import TEST_RUN
from tasks.errors import BudgetExceeded, DrawFailed, InputError, Refused, ReleaseConflict, StageFailed
from tasks.kinds import kind_of
from tasks.kinds.kmeans import postprocessing_seed
from tasks.kinds.uncertainty import replicates_of
from tasks.spec import parse_spec
from tests.conftest import blobs, budget, ledger, spec_dict, write_csv, write_parquet

pytestmark = pytest.mark.usefixtures("prefect_api")

RELEASE_FILES = {"manifest.json", "centroids.parquet", "dpkm_centroids.parquet",
                 "refinement.json", "measurements/trajectory.parquet", "measurements/measurements.json",
                 "uncertainty.json", "trajectory.parquet", "centroids_replicates.parquet",
                 "dpkm_centroids_replicates.parquet"}


def _run(spec_d: dict):
    from flows.release import release

    return release(spec=parse_spec(spec_d))


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _table(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


@pytest.fixture
def csv_data(tmp_path) -> Path:
    return write_csv(tmp_path / "blobs.csv", blobs(3000))


@pytest.fixture
def count_dp_runs(monkeypatch) -> list:
    """Counts calls of the noise-drawing algorithm inside the DP task."""
    import tasks.kinds.kmeans

    calls, real = [], tasks.kinds.kmeans.dpkmeans.dp_kmeans

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)
    monkeypatch.setattr(tasks.kinds.kmeans.dpkmeans, "dp_kmeans", counting)
    return calls


def test_release_end_to_end(tmp_path, csv_data):
    s = _run({**spec_dict(tmp_path, csv_data, confidence=0.9), "release_id": "blobs-r1"})
    run = Path(s["release_dir"]).parent
    assert s["status"] == "published" and s["release_id"] == "blobs-r1" and s["private"]

    # release/ holds exactly the DP products and the manifest, nothing raw-derived
    release = run / "release"
    assert {str(p.relative_to(release)) for p in release.rglob("*") if p.is_file()} == RELEASE_FILES
    manifest = json.loads((release / "manifest.json").read_text())
    assert manifest["privacy"]["epsilon"] == pytest.approx(1.0) and manifest["privacy"]["delta"] == 0.0
    assert manifest["randomness"]["mode"] == "production" and "OpenDP" in manifest["randomness"]["noise"]
    spec = parse_spec({**spec_dict(tmp_path, csv_data, confidence=0.9), "release_id": "blobs-r1"})
    assert [m["scale"] for m in manifest["privacy"]["mechanisms"]] == [m.scale for m in kind_of(spec).plan]
    # every published value with its uncertainty at the spec's confidence (kept through Prefect's parameters)
    uncertainty = manifest["uncertainty"]
    # B as many replicates as fit the bootstrap's time at the kind's cost estimate (each reruns the refinement where
    # the release is refined): at least the fewest a 0.9 interval needs
    replicates = uncertainty["bootstrap"]["replicates"]
    assert uncertainty["confidence"] == 0.9
    assert replicates == replicates_of(kind_of(spec), release / "measurements")
    assert min_replicates(0.9) <= replicates <= 199
    assert set(uncertainty["direct"]["files"]["trajectory.parquet"]) == {"noisy_count", "noisy_sum_0", "noisy_sum_1"}
    released = pq.read_table(release / "centroids.parquet").to_pandas()
    assert (released["x_lo"] <= released["x_hi"]).all() and (released["y_std"] > 0).all()
    # the seeding round (the default at T >= 2), then Algorithm 1's iterations
    assert [m["name"] for m in manifest["privacy"]["mechanisms"]] == ["seed_counts", "seed_sums", "counts", "sums"]
    assert [m["distribution"] for m in manifest["privacy"]["mechanisms"]] == ["discrete_laplace", "opendp_laplace"] * 2
    assert manifest["provenance"]["flow_run_id"] and manifest["provenance"]["deployment_id"] is None
    assert {"scikit-learn", "numba", "pyarrow", "opendp"} <= set(manifest["software"])
    for name, info in manifest["files"].items():
        assert _sha(release / name) == info["sha256"]

    # the released centroids are what postprocessing derives from the published measurements alone: Lee &
    # Kifer's refinement where the noisy trajectory calls for it, else the last noisy iterate (released beside)
    traj = kind_of(spec).trajectory(release / "measurements")
    info = json.loads((release / "refinement.json").read_text())
    assert info["refinement_expected_to_help"] == leekifer.refinement_expected_to_help(traj)
    cents = pq.read_table(release / "centroids.parquet").to_pandas()[["x", "y"]].to_numpy()
    # the refinement where the gate released it (its exact reproduction from the published measurements:
    # test_the_published_refinement_is_reproduced_from_the_measurements), else the last noisy iterate
    misfit = info.get("refinement_misfit")
    refined = leekifer.refinement_released(float("nan") if misfit is None else misfit, traj)
    assert np.allclose(cents, traj.final_centroids) != refined
    assert info["released"] == ("Lee & Kifer §3.2-3.3" if refined else "last noisy iterate of DP k-means")
    dpkm = pq.read_table(release / "dpkm_centroids.parquet").to_pandas()[["x", "y"]].to_numpy()
    assert np.allclose(dpkm, traj.final_centroids)

    # internal/: contracts of every stage passed; the evaluation's dask WCSS (on the data scaled to [-1, 1] by the
    # public bounds) equals a direct computation on the points as ingested (the CSV holds 6 decimals: the
    # unrounded points differ in WCSS by about 1e-9 relative)
    internal = run / "internal"
    for stage in ("ingested", "normalised", "measurements", "release"):
        assert json.loads((internal / "contracts" / f"{stage}.json").read_text())["success"]
    # owner-only, whatever the umask: internal/ holds a copy of the raw data
    written = [run, internal, *internal.rglob("*"), *release.rglob("*")]
    assert all(p.stat().st_mode & 0o077 == 0 for p in written), [p for p in written if p.stat().st_mode & 0o077]
    P = domain.scale_to_unit_box(np.loadtxt(csv_data, delimiter=",", skiprows=1), [0, 0], [100, 100])[0]
    ev = json.loads((internal / "evaluation" / "evaluation.json").read_text())
    assert ev["wcss"] == pytest.approx(metrics.wcss(P, cents), rel=1e-9)
    single = metrics.wcss(P, P.mean(axis=0, keepdims=True))
    assert ev["single_centroid_wcss"] == pytest.approx(single, rel=1e-9)
    assert ev["beats_single_centroid"] and not ev["headline"].startswith("FAILED")
    assert (internal / "evaluation" / "wcss.png").stat().st_size > 0
    assert (internal / "uncertainty" / "intervals.png").stat().st_size > 0
    assert "## Uncertainty of the published values" in (internal / "report.md").read_text()
    # the dataset's great-expectations project (beside the runs by default): a suite per stage, a checkpoint per
    # whole-table stage, and one result per stage named by the release id, counting what the contract report counts
    gx_dir = run.parent / ".gx" / "blobs" / "gx"
    assert (gx_dir / "uncommitted" / "data_docs" / "local_site" / "index.html").exists()
    for stage in ("measurements", "release"):
        assert (gx_dir / "checkpoints" / f"kmeans.{stage}.json").exists()
    assert '"$PARAMETER": "expected_rows"' in (gx_dir / "expectations" / "kmeans" / "measurements.json").read_text()
    for stage in ("ingested", "normalised", "measurements", "release"):
        [result] = (gx_dir / "uncommitted" / "validations" / "kmeans" / stage / "blobs-r1").glob("*/*.json")
        counted = json.loads((internal / "contracts" / f"{stage}.json").read_text())["expectations"]
        assert json.loads(result.read_text())["statistics"]["evaluated_expectations"] == counted
    written = [gx_dir.parent, *gx_dir.rglob("*")]  # internal too: owner-only
    assert all(p.stat().st_mode & 0o077 == 0 for p in written), [p for p in written if p.stat().st_mode & 0o077][:5]

    assert [(r["release_id"], r["status"]) for r in ledger().releases("blobs")] == [("blobs-r1", "published")]


def test_the_postprocessing_seed_is_the_measurements_values_not_the_published_files_bytes(tmp_path):
    """Publishing rewrites every Parquet file with the release's metadata (`describe`), the copy of the measurements
    too: the seed of the published copy is the one postprocessing read, and the in-memory trajectory's."""
    from dpalgos.dpkmeans import Trajectory
    from tasks.kinds.kmeans import TRAJECTORY, trajectory_seed, write_trajectory
    from tasks.manifest import describe

    rng = np.random.default_rng(3)
    T, K, d = 4, 3, 2
    traj = Trajectory(initial_centroids=rng.uniform(-0.5, 0.5, (K, d)), noisy_counts=rng.normal(300, 5, (T, K)),
                      noisy_sums=rng.normal(0, 20, (T, K, d)), centroids=rng.uniform(-0.5, 0.5, (T, K, d)),
                      noise_scale=8.0, domain="l2_ball", sum_noise_scale=8.0 * np.sqrt(2))
    measurements = tmp_path / "staging" / "measurements"
    measurements.mkdir(parents=True)
    write_trajectory(measurements, traj)
    before, seed = (measurements / TRAJECTORY).read_bytes(), postprocessing_seed(measurements)
    manifest = {"release_id": "r", "dataset_id": "blobs", "kind": "kmeans", "privacy": {"epsilon": 1.0, "delta": 0}}
    describe(tmp_path / "staging", manifest, "0" * 64)
    assert (measurements / TRAJECTORY).read_bytes() != before  # published: other bytes, the same values
    assert postprocessing_seed(measurements) == seed == trajectory_seed(traj)
    traj.noisy_counts[-1, 0] += 1.0  # other measurements, another seed
    assert trajectory_seed(traj) != seed


@pytest.mark.slow  # one release of 3,000 points with the refinement: about a minute on the loaded 2-core machine
def test_the_published_refinement_is_reproduced_from_the_measurements(tmp_path, csv_data):
    """A rerun of the postprocessing on the published measurements, with the published refinement's parameters
    (here the defaults of `leekifer.refine`), reproduces the published refinement exactly, and its misfit the
    published one that decided it."""
    s = _run({**spec_dict(tmp_path, csv_data), "release_id": "blobs-refined"})
    release = Path(s["release_dir"])
    spec = parse_spec({**spec_dict(tmp_path, csv_data), "release_id": "blobs-refined"})
    info = json.loads((release / "refinement.json").read_text())
    assert info["released"] == "Lee & Kifer §3.2-3.3"
    traj = kind_of(spec).trajectory(release / "measurements")
    rerun = leekifer.refine(traj, seed=postprocessing_seed(release / "measurements"))
    cents = pq.read_table(release / "centroids.parquet").to_pandas()[["x", "y"]].to_numpy()
    assert np.array_equal(cents, rerun.centroids)
    assert info["refinement_misfit"] == leekifer.misfit(rerun, traj)
    assert leekifer.refinement_released(info["refinement_misfit"], traj)


def test_rerun_of_a_published_release_changes_nothing(tmp_path, csv_data, count_dp_runs):
    d = {**spec_dict(tmp_path, csv_data), "release_id": "blobs-r2"}
    first = _run(d)
    manifest = Path(first["release_dir"]) / "manifest.json"
    before = _sha(manifest)
    again = _run(d)
    assert again["status"] == "already published" and _sha(manifest) == before
    assert len(count_dp_runs) == 1
    assert len(ledger().releases("blobs")) == 1


def test_failed_postprocessing_keeps_measurements_and_a_rerun_finishes_without_new_noise(
        tmp_path, csv_data, count_dp_runs, monkeypatch):
    from prefect import task

    monkeypatch.setenv("DPRELEASE_SCRATCH_KEEP_DAYS", "1")  # the stage outputs outlive the publication: compared below

    @task(name="postprocess")
    def broken(*args, **kwargs):
        raise OSError("disk full while writing the release")

    d = {**spec_dict(tmp_path, csv_data), "release_id": "blobs-r3"}
    with monkeypatch.context() as m:
        m.setattr(flows.release, "postprocess", broken)
        with pytest.raises(StageFailed, match="OSError"):  # the error's own text stays in the internal log
            _run(d)
    run = tmp_path / "runs" / "blobs-r3"
    assert not (run / "release").exists() and not list(run.glob(".staging-*"))
    stored = _table(run / "measurements" / "trajectory.parquet")
    validated = {p: p.stat().st_mtime_ns for p in (run / "internal").glob("[in]*/*.parquet")}
    assert validated  # ingested/ and normalised/ partitions

    s = _run(d)
    assert s["status"] == "published"
    # the same values; the published copy's key-value metadata names the release (tasks.manifest.describe)
    assert _table(run / "release" / "measurements" / "trajectory.parquet") == stored
    assert {p: p.stat().st_mtime_ns for p in validated} == validated  # resumed: the raw data was not read again
    assert len(count_dp_runs) == 1
    rows = ledger().releases("blobs")
    assert len(rows) == 1 and rows[0]["status"] == "published"

    # A kill during the evaluation left a published release without its report: the next run writes them.
    manifest = _sha(run / "release" / "manifest.json")
    (run / "internal" / "report.md").unlink()
    shutil.rmtree(run / "internal" / "evaluation")
    again = _run(d)
    assert again["status"] == "already published" and (run / "internal" / "report.md").exists()
    assert (run / "internal" / "evaluation" / "evaluation.json").exists()
    assert _sha(run / "release" / "manifest.json") == manifest and len(count_dp_runs) == 1
    assert [(r["status"], r["attempts"]) for r in ledger().releases("blobs")] == [("published", 1)]


def test_forced_task_retry_reuses_the_stored_measurements(tmp_path, csv_data, count_dp_runs, monkeypatch):
    """The DP task fails after committing its noise; Prefect retries it; no fresh noise is drawn."""
    import tasks.ledger

    real_mark, failures = tasks.ledger.PrivacyLedger.mark, []

    def flaky_mark(self, release_id, status):
        if status == "measured" and not failures:
            failures.append(release_id)
            raise ConnectionError("ledger briefly unreachable")
        return real_mark(self, release_id, status)
    monkeypatch.setattr(tasks.ledger.PrivacyLedger, "mark", flaky_mark)

    s = _run({**spec_dict(tmp_path, csv_data), "release_id": "blobs-r4"})
    assert failures == ["blobs-r4"]  # the first attempt really failed after drawing noise
    assert s["status"] == "published"
    assert len(count_dp_runs) == 1  # the retry reused the measurements
    rows = ledger().releases("blobs")
    assert len(rows) == 1 and rows[0]["epsilon"] == pytest.approx(1.0)


def test_an_error_after_the_draw_is_charged_once_and_never_retried(tmp_path, csv_data, count_dp_runs, monkeypatch):
    """A review's weighted table failed inside the sampler after the charge, and Prefect retried the deterministic
    error twice, each retry charged again: epsilon 1.5 spent on a 0.5 release that never appeared."""
    import tasks.kinds.kmeans

    real = tasks.kinds.kmeans.dpkmeans.dp_kmeans

    def fails_after_drawing(*args, measure, **kwargs):
        measure("counts", [3.0, 1.0, 2.0])  # noise drawn
        raise ValueError("a library's deterministic error")
    monkeypatch.setattr(tasks.kinds.kmeans.dpkmeans, "dp_kmeans", fails_after_drawing)
    d = {**spec_dict(tmp_path, csv_data), "release_id": "blobs-once"}
    with pytest.raises(DrawFailed, match="after noise was drawn \\(ValueError"):
        _run(d)
    assert [(r["status"], r["attempts"]) for r in ledger().releases("blobs")] == [("drawing", 1)]
    monkeypatch.setattr(tasks.kinds.kmeans.dpkmeans, "dp_kmeans", real)
    assert _run(d)["status"] == "published"  # the operator's rerun: charged again, as the message said
    assert [(r["status"], r["attempts"]) for r in ledger().releases("blobs")] == [("published", 2)]


def test_a_deterministic_error_is_not_retried_and_io_is(tmp_path, csv_data, monkeypatch):
    from prefect import task

    from tasks.retry import SAFE, sanitised

    calls = []

    def ingest_that_fails(error):
        @task(name="ingest", **SAFE)
        @sanitised
        def ingest(*args, **kwargs):
            calls.append(error.__name__)
            raise error("x")
        return ingest
    for error, tries in ((ValueError, 1), (OSError, 3)):
        calls.clear()
        monkeypatch.setattr(flows.release, "ingest", ingest_that_fails(error))
        with pytest.raises(StageFailed, match=error.__name__):
            _run({**spec_dict(tmp_path, csv_data), "release_id": f"retry-{error.__name__}"})
        assert calls == [error.__name__] * tries


def test_over_budget_release_is_refused_before_any_noise(tmp_path, csv_data, count_dp_runs):
    d = spec_dict(tmp_path, csv_data)
    budget("blobs", 1.5, 0.0)
    _run({**d, "release_id": "blobs-b1"})
    with pytest.raises(BudgetExceeded, match="would exceed the lifetime budget"):
        _run({**d, "release_id": "blobs-b2"})
    assert len(count_dp_runs) == 1
    assert not (tmp_path / "runs" / "blobs-b2").exists()
    assert [r["release_id"] for r in ledger().releases("blobs")] \
        == ["blobs-b1"]


def _nan_csv(tmp_path):
    X = blobs(200).astype(object)
    X[17, 1] = "nan"
    return write_csv(tmp_path / "nan.csv", X)


def _inf_csv(tmp_path):
    X = blobs(200).astype(object)
    X[5, 0] = "inf"
    return write_csv(tmp_path / "inf.csv", X)


def _text_column(tmp_path):
    return write_parquet(tmp_path / "t.parquet", {"x": np.ones(10), "y": np.array(["a"] * 10)})


BAD_INPUTS = {
    "nan": (_nan_csv, {}, ContractViolation, "expect_column_values_to_not_be_null"),
    "inf": (_inf_csv, {}, ContractViolation, "column 'x': expect_column_values_to_be_between"),
    # The file's structure: the admission's (rule 13b), before anything runs.
    "missing column": (lambda p: write_parquet(p / "m.parquet", {"x": np.ones(10)}), {}, Refused,
                       r"columns \['y'\] are missing"),
    "non-numeric column": (_text_column, {}, Refused, "must be numeric"),
    "empty file": (lambda p: (p / "e.csv").write_text("") and None or p / "e.csv", {}, Refused, "is empty"),
    "header only": (lambda p: write_csv(p / "h.csv", np.empty((0, 2))), {}, Refused, "no data rows"),
    "corrupt parquet": (lambda p: (p / "c.parquet").write_bytes(b"PAR1 not really") and p / "c.parquet", {},
                        Refused, "is not a Parquet file"),
    "short line": (lambda p: (p / "s.csv").write_text("x,y\n1,2\n3\n") and p / "s.csv", {}, InputError,
                   "has a malformed line: 1 field"),  # the ingest's: every line is read
    "missing file": (lambda p: p / "absent.csv", {}, Refused, "does not exist"),  # the admission's (rule 4)
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_fails_clearly_and_leaves_nothing(tmp_path, case):
    make, release, error, message = BAD_INPUTS[case]
    data = make(tmp_path)
    with pytest.raises(error, match=message):
        _run({**spec_dict(tmp_path, data, **release), "release_id": "bad"})
    runs = tmp_path / "runs"
    assert not (runs / "bad").exists()
    assert ledger().releases("blobs") == []
    if error is ContractViolation:  # the failed contract has its Data Docs, built as the failed release ended
        site = runs / ".gx" / "blobs" / "gx" / "uncommitted" / "data_docs" / "local_site"
        assert "bad" in (site / "index.html").read_text()
        assert [p for p in (site / "validations").rglob("*.html") if "bad" in p.parts]


def test_test_mode_is_not_a_release(tmp_path, csv_data):
    """A seeded run writes test-output/ (never release/), says it is not private, and charges nothing."""
    s = _run({**spec_dict(tmp_path, csv_data), "release_id": "blobs-t", "mode": "test", "seed": 3})
    run = tmp_path / "runs" / "blobs-t"
    assert not s["private"] and Path(s["release_dir"]) == run / "test-output" and not (run / "release").exists()
    assert s["status"] == TEST_RUN
    manifest = json.loads((run / "test-output" / "manifest.json").read_text())
    assert manifest["privacy"]["private"] is False and "NOT differentially private" in manifest["privacy"]["warning"]
    assert manifest["randomness"]["mode"] == "test" and manifest["randomness"]["seed"] == 3
    assert {m["distribution"] for m in manifest["privacy"]["mechanisms"]} == {"numpy_laplace"}
    assert "dataset_budget" not in manifest["privacy"] and s["dataset_budget"] is None
    assert ledger().releases("blobs") == []
    # reproducible: the same seed gives the same measurements
    again = _run({**spec_dict(tmp_path / "b", csv_data), "release_id": "blobs-t", "mode": "test", "seed": 3})
    assert _sha(run / "measurements" / "trajectory.parquet") == \
        _sha(Path(again["release_dir"]).parent / "measurements" / "trajectory.parquet")
    # A release under the test run's id is refused for its stored measurements before it is charged.
    budget("blobs")
    with pytest.raises(ReleaseConflict, match="with other data or parameters"):
        _run({**spec_dict(tmp_path, csv_data), "release_id": "blobs-t"})
    assert ledger().releases("blobs") == []


def test_an_over_budget_release_is_refused_before_its_data_is_read(tmp_path, count_dp_runs):
    """A refusal after reading the data (here the contract's NaN check) would be a free query about it, and for a
    spec over the budget one it could ask without end: the budget refuses it first."""
    d = spec_dict(tmp_path, _nan_csv(tmp_path))
    budget("blobs", 0.5, 0.0)
    with pytest.raises(BudgetExceeded, match="would exceed the lifetime budget"):
        _run({**d, "release_id": "nan-over"})
    assert not (tmp_path / "runs" / "nan-over").exists() and ledger().releases("blobs") == []
    budget("blobs", 10.0, 0.0)
    with pytest.raises(ContractViolation):  # within the budget, the same input fails where it did
        _run({**d, "release_id": "nan-within"})
    assert ledger().releases("blobs") == [] and not count_dp_runs


def test_centroids_no_better_than_the_single_mean_are_reported_as_a_failure(tmp_path):
    """40 records in 8 dimensions at epsilon 0.05: the noise dwarfs every cluster, the released centroids are
    further from the points than their one mean, and the evaluation says FAILED, not only a ratio."""
    cols = [f"a{j}" for j in range(8)]
    data = write_csv(tmp_path / "small.csv", np.random.default_rng(0).uniform(60, 100, (40, 8)), header=cols)
    spec = {**spec_dict(tmp_path, data), "release_id": "small-t", "mode": "test", "seed": 1}
    spec["dataset"] = {"id": "blobs", "path": str(data), "bounds": {c: [0, 100] for c in cols}}
    spec["release"] = {**spec["release"], "epsilon": 0.05, "postprocess": []}
    s = _run(spec)
    ev = json.loads((Path(s["release_dir"]).parent / "internal" / "evaluation" / "evaluation.json").read_text())
    assert ev["wcss"] >= ev["single_centroid_wcss"] and not ev["beats_single_centroid"]
    assert ev["headline"].startswith("FAILED: the released centroids are no better than the data's single mean")


PLANTED = "John Doe HIV+"


def _texts(caplog, *extra) -> str:
    """Every run log record (what Prefect stores and shows) and the extra texts, without the links to the
    Prefect UI: their port and run ids are random digits that may contain a planted number."""
    runs = [r.getMessage() for r in caplog.records if r.name.startswith(("prefect.flow_runs", "prefect.task_runs"))]
    return re.sub(r"https?://\S+", "<link>", "\n".join(runs + [str(e) for e in extra]))


def test_no_raw_value_reaches_logs_exceptions_or_flow_states(tmp_path, caplog, monkeypatch):
    """Planted raw values (a categorical value outside the public levels, an exact row count, an outlier) never
    appear in a log record, an exception text or a flow-run state message, failing or succeeding."""
    import logging

    from flows.release import release

    caplog.set_level(logging.INFO)
    (tmp_path / "c").mkdir()  # the contingency's data: both its files, one bound source
    ledger().set_budget("c", 10.0, 1e-6, source=str(tmp_path / "c"))
    bad = write_parquet(tmp_path / "c" / "bad.parquet", {"a": ["u"] * 1235 + [PLANTED, None], "count": np.ones(1237)})
    d = {"dataset": {"id": "c", "path": str(bad), "categories": {"a": ["u", "v"]}, "weight_column": "count",
                     "weights_count_records": True},
         "release": {"kind": "contingency", "epsilon": 1.0},
         "output_dir": str(tmp_path / "runs"), "release_id": "planted"}
    state = release(spec=parse_spec(d), return_state=True)
    assert state.is_failed()
    with pytest.raises(ContractViolation) as failure:
        state.result()
    texts = _texts(caplog, failure.value, state.message)
    assert "expect_column_values_to_not_be_null" in texts and PLANTED not in texts
    assert "1237" not in texts and "rows break it" not in texts  # no count at all (a free counting query)
    # the detailed record of the failure is kept, internally, in the quarantine
    assert list((tmp_path / "runs" / ".quarantine").glob("planted-*/contracts/ingested.json"))

    caplog.clear()
    outside = write_parquet(tmp_path / "c" / "outside.parquet", {"a": ["u"] * 1236 + [PLANTED], "count": np.ones(1237)})
    caplog.clear()  # a level outside the public ones is left out: a release, and nothing of it in the texts
    state = release(spec=parse_spec({**d, "dataset": {**d["dataset"], "path": str(outside)}, "release_id": "left-out"}),
                    return_state=True)
    assert state.is_completed() and PLANTED not in _texts(caplog, state.message, json.dumps(state.result()))

    X = blobs(4321)
    X[7] = [123456.789, 50.0]  # an outlier, clipped to the public bounds
    ok = write_csv(tmp_path / "ok.csv", X)
    state = release(spec=parse_spec({**spec_dict(tmp_path, ok), "release_id": "ok"}), return_state=True)
    assert state.is_completed()
    texts = _texts(caplog, state.message, json.dumps(state.result()))
    assert "4321" not in texts and "123456" not in texts

    # a library's error quoting a raw value: Prefect's logs, state and the failure keep its type only
    caplog.clear()
    import tasks.kinds.kmeans

    def quoting(*args, **kwargs):
        raise ValueError(f"could not convert {PLANTED!r} to float")
    monkeypatch.setattr(type(tasks.kinds.kmeans.KIND), "postprocess", quoting)
    state = release(spec=parse_spec({**spec_dict(tmp_path, ok), "release_id": "quoting"}), return_state=True)
    assert state.is_failed()
    with pytest.raises(StageFailed, match="ValueError in stage 'postprocess'") as failure:
        state.result()
    runs = [r for r in caplog.records if r.name.startswith(("prefect.flow_runs", "prefect.task_runs"))]
    assert runs and PLANTED not in _texts(caplog, failure.value, state.message)
    assert not any(PLANTED in str(r.exc_info) for r in runs if r.exc_info)
    assert any(PLANTED in str(r.exc_info) for r in caplog.records if r.name == "dprelease.internal")


def test_a_release_id_is_drawn_in_one_place_only(tmp_path, csv_data):
    """Re-running a measured release id into another output folder, with the same ledger, is refused: it
    would publish a second, independent release under one charge."""
    from tasks.errors import ReleaseConflict

    d = {**spec_dict(tmp_path, csv_data), "release_id": "one-place"}
    _run(d)
    with pytest.raises(ReleaseConflict, match="drawn once, in one place"):
        _run({**d, "output_dir": str(tmp_path / "elsewhere")})
    assert not (tmp_path / "elsewhere" / "one-place" / "release").exists()
    rows = ledger().releases("blobs")
    assert [(r["release_id"], r["attempts"]) for r in rows] == [("one-place", 1)]
    # a published release id reused with other parameters is an error, not "already published"
    with pytest.raises(ReleaseConflict, match="other data or parameters"):
        _run({**d, "release": {**d["release"], "epsilon": 0.5}})


def test_a_failed_run_never_deletes_a_folder_it_did_not_create(tmp_path):
    keep = tmp_path / "runs" / "keep"
    keep.mkdir(parents=True)
    (keep / "precious.txt").write_text("mine")
    (tmp_path / "c.csv").write_text("x,y\n1,2\n3\n")
    with pytest.raises(InputError, match="malformed line"):  # fails after the run folder was opened: the ingest's
        _run({**spec_dict(tmp_path, tmp_path / "c.csv"), "release_id": "keep"})
    assert (keep / "precious.txt").read_text() == "mine"


def test_scratch_folders_of_dead_runs_are_cleared_and_live_ones_kept(tmp_path):
    """A run killed while staging or committing leaves .<name>-<pid>-* folders: the next run removes those of
    dead processes and keeps those of live ones (a concurrent run)."""
    import subprocess
    import sys

    from tasks.run import RunPaths, _scratch

    run = RunPaths(tmp_path)
    live = [run.new_staging(), _scratch("test-output", tmp_path), _scratch("measurements", tmp_path)]
    code = (f"from pathlib import Path; from tasks.run import _scratch; "
            f"print(_scratch('staging', Path({str(tmp_path)!r}))); "
            f"print(_scratch('test-output', Path({str(tmp_path)!r})))")
    dead = [Path(p) for p in subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                            check=True).stdout.split()]
    assert all(p.is_dir() for p in live + dead)
    run.clear_stale_staging()
    assert all(p.is_dir() for p in live) and not any(p.exists() for p in dead)


def test_more_clusters_than_rows_is_released_not_refused(tmp_path):
    """A refusal on K > N would be a free, uncharged answer to "is N < K?" (for any K a spec picks): the release
    is made, charged, from noise alone where the clusters are empty, and evaluated (a failing evaluation
    answered the same question through the run's state)."""
    s = _run({**spec_dict(tmp_path, write_csv(tmp_path / "s.csv", blobs(4)), k=5, postprocess=[]),
              "release_id": "k-gt-n"})
    assert s["status"] == "published" and [r["status"] for r in ledger().releases("blobs")] == ["published"]
    evaluation = tmp_path / "runs" / "k-gt-n" / "internal" / "evaluation" / "evaluation.json"
    assert json.loads(evaluation.read_text())["kmeanspp_wcss"] == 0.0


def test_a_failing_evaluation_leaves_the_published_run_published(tmp_path, monkeypatch):
    """The evaluation reads raw data after the release is published: a failed run (or task, or retry) would
    say the data tripped it. Its failure is in the evaluation file and the internal log only."""
    from tasks.kinds.kmeans import KMeansKind

    def trips(*args, **kwargs):
        raise ValueError("a value only this data has")

    monkeypatch.setattr(KMeansKind, "evaluate", trips)
    s = _run({**spec_dict(tmp_path, write_csv(tmp_path / "s.csv", blobs(60)), postprocess=[]),
              "release_id": "eval-trips"})
    assert s["status"] == "published"
    evaluation = json.loads((tmp_path / "runs" / "eval-trips" / "internal" / "evaluation" / "evaluation.json")
                            .read_text())
    assert evaluation["failed"] == "ValueError" and "only this data" not in json.dumps(evaluation)


@pytest.mark.slow  # 17 s: tests/test_ledger.py checks the same refusal without a run
def test_a_spec_cannot_make_a_file_public_by_naming_it(tmp_path):
    """The audit's attack: the data's own file named as its public marginals released the exact table (every
    cell 'consistent' with itself). A public input is one the operator declared public; the data cannot be."""
    data = tmp_path / "t.csv"
    data.write_text("a,count\nu,7\nv,3\n")
    ledger().set_budget("t", 10.0, 1e-6, source=str(data))
    with pytest.raises(Refused, match="was not declared public"):  # refused by the admission, before the run
        _run(_contingency(tmp_path, data, data, "self-public", 0.01))
    assert not (tmp_path / "runs" / "self-public").exists() and ledger().releases("t") == []
    with pytest.raises(ReleaseConflict, match="holds the data of dataset 't'"):
        ledger().register_public(str(data), "census")


def test_a_malformed_public_sample_is_refused_before_the_charge(tmp_path):
    from tasks import generators

    generators.generate(generators.CDR, tmp_path / "cdr", users=200, seed=1, partition_rows=100)
    sample = tmp_path / "public.dat"
    sample.write_text("1 2\n3 foo\n")
    ledger().set_budget("cdr", 10.0, 1e-6, source=str(tmp_path / "cdr"))
    ledger().register_public(str(sample), "the test's own")
    d = {"dataset": {"id": "cdr", "path": str(tmp_path / "cdr"), "items_column": "towers", "item_count": 1303},
         "release": {"kind": "kernel_kmeans", "k": 2, "iterations": 2, "epsilon": 1.0, "delta": 1e-6,
                     "features": 16, "public_sample": str(sample)},
         "output_dir": str(tmp_path / "runs"), "release_id": "bad-sample"}
    with pytest.raises(InputError, match="item ids must be integers"):
        _run(d)
    assert ledger().releases("cdr") == []


@pytest.mark.slow  # 24 s: tests/test_ledger.py checks the same refusal without a run
def test_a_spec_cannot_choose_how_the_data_is_parsed_once_a_release_has(tmp_path, csv_data):
    """A delimiter of the spec's choice made the parser's refusals answer questions about the data for free:
    the first release binds how the dataset is read, and a spec that reads it otherwise is refused before
    anything is read."""
    d = {**spec_dict(tmp_path, csv_data), "release_id": "first"}
    _run(d)
    probe = {**d, "dataset": {**d["dataset"], "delimiter": "5", "header": False}, "release_id": "probe"}
    with pytest.raises(Refused, match="is read as bound to its budget") as refused:  # by the admission
        _run(probe)
    assert "fields per line" not in str(refused.value) and not (tmp_path / "runs" / "probe").exists()
    assert [r["release_id"] for r in ledger().releases("blobs")] == ["first"]


def test_the_data_path_is_resolved_once_for_the_check_and_the_read(tmp_path, csv_data, monkeypatch):
    """An audit swapped a symlink between the ledger's check of the bound source and the ingest: the run reads
    the file the check resolved."""
    monkeypatch.setenv("DPRELEASE_SCRATCH_KEEP_DAYS", "1")  # the ingested records outlive the publication: read below
    (tmp_path / "bound").mkdir()
    real = tmp_path / "bound" / "blobs.csv"
    shutil.copy(csv_data, real)
    other = write_csv(tmp_path / "other.csv", blobs(15))
    link = tmp_path / "bound" / "current.csv"
    link.symlink_to(real)
    ledger().set_budget("blobs", 10.0, 1e-6, source=str(tmp_path / "bound"))
    _swap_after_the_check(monkeypatch, link, other)
    _run({**spec_dict(tmp_path, link), "release_id": "swap"})
    ingested = tmp_path / "runs" / "swap" / "internal" / "ingested"
    assert pq.ParquetDataset(ingested).read().num_rows == 3000


@pytest.mark.slow  # 20 s: tests/test_ledger.py checks the copy without a run
def test_public_marginals_swapped_after_the_check_are_refused_not_released(tmp_path, monkeypatch):
    """The audit's attack: registered marginals swapped for the data file once the run had checked them
    released the exact table. The kind reads a private copy, checked against the registration."""
    data, public = tmp_path / "t.csv", tmp_path / "m0.csv"
    data.write_text("a,count\nu,7\nv,3\n")
    public.write_text("a,count\n,10\n")
    ledger().set_budget("t", 10.0, 1e-6, source=str(data))
    ledger().register_public(str(public), "census")
    _swap_after_the_check(monkeypatch, public, data)
    with pytest.raises(ReleaseConflict, match="no longer, what the operator declared public"):
        _run(_contingency(tmp_path, data, public, "swapped", 0.5))
    assert not (tmp_path / "runs" / "swapped" / "release").exists()


def test_a_probe_refused_while_reading_fixes_the_reading_for_the_next(tmp_path, csv_data):
    """The third audit: delimiters probed one after another, each refused while reading (now by the admission's
    look at the first line, after the binding) and so never charged."""
    d = spec_dict(tmp_path, csv_data)
    probe = {**d, "dataset": {**d["dataset"], "delimiter": ";", "header": False}, "release_id": "probe-1"}
    with pytest.raises(Refused, match="does not have one field per column"):
        _run(probe)
    again = {**probe, "dataset": {**probe["dataset"], "delimiter": "|"}, "release_id": "probe-2"}
    with pytest.raises(Refused, match="is read as bound to its budget"):
        _run(again)
    assert ledger().releases("blobs") == [] and not (tmp_path / "runs" / "probe-2").exists()


def _contingency(tmp_path, data, public, release_id: str, epsilon: float) -> dict:
    """A contingency release of the two-level column `a` (weights count records) with public marginals."""
    return {"dataset": {"id": "t", "path": str(data), "categories": {"a": ["u", "v"]}, "weight_column": "count",
                        "weights_count_records": True},
            "release": {"kind": "contingency", "epsilon": epsilon, "public_marginals": str(public),
                        "public_marginals_source": "census"},
            "output_dir": str(tmp_path / "runs"), "release_id": release_id}


def _swap_after_the_check(monkeypatch, link, target) -> None:
    """Point `link` at `target` right after the run's check (the audits' race, made deterministic)."""
    from tasks import admission

    checked = admission.admit_run

    def check_then_swap(*args):
        plan = checked(*args)
        link.unlink()
        link.symlink_to(target)
        return plan
    monkeypatch.setattr(admission, "admit_run", check_then_swap)
