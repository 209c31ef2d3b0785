"""The conformance suite: every registered release kind passes the privacy rules of docs/design.md
(as scikit-learn's `parametrize_with_checks`). Registering a kind in tasks/kinds/__init__.py gives it all
of these; the machinery and its arguments are in tests/conformance.py."""

from __future__ import annotations

import filecmp
import json
import math
import shutil
from pathlib import Path

import pytest

from tasks import stages
from tasks.errors import StageFailed
from tasks.kinds import REGISTRY
from tasks.ledger import configured_ledger
from tasks.retry import RETRIES
from tasks.spec import parse_spec
from tests import conformance as C

KINDS = sorted(REGISTRY)


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster, set_as_default=True) as c:
        yield c


@pytest.mark.parametrize("name", KINDS)
def test_charged_event_composes_within_the_spec_budget(name, tmp_path):
    kind = REGISTRY[name]
    spec = parse_spec(C.spec_for(kind, tmp_path))
    delta = getattr(spec.release, "delta", 0.0)
    g = kind.bind(spec).plan.guarantee(delta)
    assert g.epsilon <= spec.release.epsilon * (1 + 1e-6) and g.delta <= max(delta, 0.0) + 1e-15


@pytest.mark.parametrize("name", KINDS)
def test_plan_equals_opendp_privacy_map(name, tmp_path):
    kind = REGISTRY[name]
    for m in kind.bind(parse_spec(C.spec_for(kind, tmp_path))).plan:
        if m.per_step_generator:  # DP-SGD: numpy noise, dp_accounting's own Gaussian (tests/test_dpgm.py)
            continue
        # A bound chosen during the release: the query's sensitivity is bound_multiple x C, here with C = 1.
        d_in = m.bound_multiple if m.sensitivity is None else (
            int(m.sensitivity) if m.integer and float(m.sensitivity).is_integer() else m.sensitivity)
        claimed = m.manifest().get("epsilon_each", m.manifest().get("rho_each"))
        scale = m.scale if m.sensitivity is not None else m.scale_for(1.0)
        assert m.opendp_measurement(size=3, scale=scale).map(d_in) == pytest.approx(claimed, rel=1e-9), m.name


def _neighbour_worst(kind, tmp_path, client, plan_of=None) -> C.Worst:
    base_spec = C.spec_for(kind, tmp_path / "D")
    plan = plan_of(parse_spec(base_spec)) if plan_of else None
    base = C.measure_calls(kind, base_spec, tmp_path / "D", client, plan=plan)
    worst = C.Worst()
    for i, record in enumerate(C.EXTREMES[kind.shape]):
        folder = tmp_path / f"D{i}"
        calls = C.measure_calls(kind, C.spec_for(kind, folder, extra=[record]), folder, client, replay=base, plan=plan)
        C.worst_changes(plan or kind.bind(parse_spec(base_spec)).plan, base, calls, worst)
    return worst


@pytest.mark.parametrize("name", KINDS)
def test_sensitivities_hold_on_worst_case_neighbours_and_the_audit_stays_within_epsilon(name, tmp_path, client):
    kind = REGISTRY[name]
    worst = _neighbour_worst(kind, tmp_path, client)
    plan = kind.bind(parse_spec(C.spec_for(kind, tmp_path / "D"))).plan
    measured = {m.name for m in plan if not m.per_step_generator}
    assert set(worst.change) == measured, "every mechanism of the plan was exercised"
    assert C.sensitivity_violations(worst) == []
    audited = 0
    for m in plan:
        if m.per_step_generator:
            continue
        a, b = worst.pair[m.name]
        estimate, claimed = C.audit(m, a, b)
        audited += not math.isnan(estimate)
        assert not estimate > claimed, f"{m.name}: audited {estimate:.4g} > claimed {claimed:.4g}"
    assert audited, "at least one entry of every kind is audited"


@pytest.mark.parametrize("radius", [{"r": "max"}, {"r_min": 0.5, "r_max": "max"}])
@pytest.mark.parametrize("name", ["mean", "friendly_kmeans"])
def test_friendlycore_at_the_largest_radius_a_far_record_stays_within_the_sensitivity(name, radius, tmp_path, client):
    """A record at 1e300 beside D, with the largest public radius the schema accepts (a public r, or a grid up to
    it): every statistic moves by at most the plan's sensitivity. With r = 1e155 (r^2 = inf) the record was
    everyone's friend and moved the mean by 1e300 / n (an attacker's review)."""
    from dpalgos.friendlycore import MAX_RADIUS

    kind = REGISTRY[name]
    release = {k: v for k, v in kind.example().items() if k not in ("r_min", "r_max")}
    release.update({k: MAX_RADIUS if v == "max" else v for k, v in radius.items()})
    base_spec = {**C.spec_for(kind, tmp_path / "D"), "release": release}
    plan = kind.bind(parse_spec(base_spec)).plan
    base = C.measure_calls(kind, base_spec, tmp_path / "D", client)
    folder = tmp_path / "far"
    far = {**C.spec_for(kind, folder, extra=[[1e300, -1e300]]), "release": release}
    worst = C.worst_changes(plan, base, C.measure_calls(kind, far, folder, client, replay=base), C.Worst())
    assert C.sensitivity_violations(worst) == []


@pytest.mark.parametrize("field", ["r", "r_max"])
def test_friendlycore_radius_whose_square_overflows_is_refused_by_the_schema(field, tmp_path):
    from tasks.errors import SpecError

    kind = REGISTRY["mean"]
    release = {**{k: v for k, v in kind.example().items() if k not in ("r_min", "r_max")},
               **({"r": 1e155} if field == "r" else {"r_min": 1.0, "r_max": 1e200})}
    with pytest.raises(SpecError, match=f"release.{field}"):
        parse_spec({**C.spec_for(kind, tmp_path), "release": release})


@pytest.mark.parametrize("name", KINDS)
def test_a_halved_sensitivity_is_caught(name, tmp_path, client):
    """The suite fails when a plan entry understates its sensitivity by half (its noise halves with it)."""
    kind = REGISTRY[name]
    plan = kind.bind(parse_spec(C.spec_for(kind, tmp_path / "D"))).plan
    entry = next(m.name for m in plan if not m.per_step_generator)
    worst = _neighbour_worst(kind, tmp_path, client, plan_of=lambda spec: kind.bind(spec).plan.scaled(entry, 0.5))
    assert any(v.startswith(entry + ":") for v in C.sensitivity_violations(worst))
    m = plan.scaled(entry, 0.5)[entry]
    a, b = worst.pair[entry]
    # A halved sensitivity doubles a small Gaussian's total variation (0.02 -> 0.04 for synthetic's sizes),
    # which the usual draws' margin (0.017) left within a hair of the claim (a failure in 1 of ~20 runs).
    estimate, claimed = C.audit(m, a, b, detect_doubling=True)
    assert estimate > claimed, f"the audit missed the halved sensitivity of {entry}"


@pytest.mark.parametrize("entry", ["fc_clip", "fc_outside", "fc_refine"])
def test_the_mean_refinements_halved_sensitivity_is_caught(entry, tmp_path, client):
    """The refinement of `mean` (docs/friendlycore.md §13): halving the claim of its clip-radius counts, of its count
    of records beyond the clip radius or of its clipped sum is caught on the worst-case neighbours (the far record
    is clipped onto the sphere: the sum moves by exactly C, the tightest case of Lemma 13.1)."""
    kind = REGISTRY["mean"]
    assert kind.Params.model_fields["refine"].default is True
    worst = _neighbour_worst(kind, tmp_path, client, plan_of=lambda spec: kind.bind(spec).plan.scaled(entry, 0.5))
    assert any(v.startswith(entry + ":") for v in C.sensitivity_violations(worst))
    if entry == "fc_refine":  # tight: the far record's clipped term has norm C (1 - 1e-9)
        assert worst.change[entry] / worst.allowed[entry] == pytest.approx(2.0, rel=1e-6)


@pytest.mark.usefixtures("prefect_api")
@pytest.mark.parametrize("name", KINDS)
def test_release_through_the_flow(name, tmp_path, monkeypatch, client):
    """Through the real flow, in production mode: noise drawn once across a forced task retry and a resume;
    the manifest's mechanisms are the plan; every product passes its contract; postprocessing, intervals and
    replicates rerun with internal/ and the source deleted and no noise source reachable give byte-identical
    products (the rerun's dask work, synthetic records, runs on the module's client)."""
    import tasks.ledger
    from flows.release import release

    kind = REGISTRY[name]
    spec_d = {**C.spec_for(kind, tmp_path), "release_id": f"conf-{name}", "evaluate": False}
    draws, failures = [], []
    real_draw, real_post, real_mark = type(kind).draw, type(kind).postprocess, tasks.ledger.PrivacyLedger.mark

    def counting_draw(*args, **kwargs):
        draws.append(1)
        return real_draw(*args, **kwargs)

    disk_full = [True]

    def failing_post(*args, **kwargs):
        if disk_full[0]:
            failures.append("post")
            raise OSError("disk full while writing the release")
        return real_post(*args, **kwargs)

    def flaky_mark(self, release_id, status):
        if status == "measured" and "mark" not in failures:
            failures.append("mark")
            raise ConnectionError("ledger briefly unreachable")  # after the commit: Prefect retries the task
        return real_mark(self, release_id, status)
    monkeypatch.setattr(type(kind), "draw", counting_draw)  # every kind bound to a spec draws through it
    monkeypatch.setattr(type(kind), "postprocess", failing_post)
    monkeypatch.setattr(tasks.ledger.PrivacyLedger, "mark", flaky_mark)
    spec = parse_spec(spec_d)
    with pytest.raises(StageFailed, match="OSError in stage 'postprocess'"):
        release(spec=spec)  # retried (transient I/O), then the run fails; the error's text stays internal
    disk_full[0] = False
    summary = release(spec=spec)  # the resume
    assert failures == ["mark"] + ["post"] * (1 + RETRIES["retries"]) and len(draws) == 1
    assert summary["status"] == "published"
    rows = configured_ledger().releases("conf")
    assert [(r["status"], r["attempts"]) for r in rows] == [("published", 1)]

    rel = Path(summary["release_dir"])
    manifest = json.loads((rel / "manifest.json").read_text())
    plan = kind.bind(spec).plan
    samplers = [m["distribution"] for m in manifest["privacy"]["mechanisms"]]
    assert manifest["privacy"]["mechanisms"] == json.loads(json.dumps(plan.manifest(
        {m.name: s for m, s in zip(plan, samplers)})))
    assert all(s in ("discrete_laplace", "opendp_laplace", "discrete_gaussian", "opendp_gaussian", "numpy_gaussian")
               for s in samplers)
    assert all((s == "numpy_gaussian") == m.per_step_generator for s, m in zip(samplers, plan))
    contracts = rel.parent / "internal" / "contracts"
    for stage in ("ingested", "measurements", "release") + ((kind.prepared_stage,) if kind.prepared_stage else ()):
        assert json.loads((contracts / f"{stage}.json").read_text())["success"], stage

    assert manifest["uncertainty"]["confidence"] == spec.release.confidence
    # Postprocessing, intervals and replicates from the published measurements alone, raw data and internal/
    # gone, and no noise source reachable (the bootstrap's randomness is public, seeded from the measurements).
    shutil.rmtree(rel.parent / "internal")
    shutil.rmtree(tmp_path / "data")
    again = tmp_path / "again"
    again.mkdir()
    _no_noise_source(monkeypatch)
    products, _ = stages.products(kind.bind(spec), rel / "measurements", again, tmp_path / "scratch-internal", C.LOG)
    assert "uncertainty.json" in products
    assert all(any(f == p or f.startswith(p + "/") for f in manifest["files"]) for p in products), "all published"
    from tasks.manifest import describe

    describe(again, manifest, manifest["manifest_sha256"]["sha256"])  # the released files' metadata, as published
    for product in products:
        a, b = rel / product, again / product
        if a.is_dir():
            cmp = filecmp.dircmp(a, b)
            assert not (cmp.left_only or cmp.right_only or cmp.diff_files), product
            assert all(filecmp.cmp(a / f, b / f, shallow=False) for f in cmp.common_files)
        else:
            assert filecmp.cmp(a, b, shallow=False), product


def _no_noise_source(monkeypatch) -> None:
    """Every way to the noise stream raises: OpenDP's samplers, the secret and per-step generators."""
    from dpalgos import noise

    def refuse(*args, **kwargs):
        raise AssertionError("post-processing reached a noise source")
    for name in ("add", "step_generator"):
        monkeypatch.setattr(noise.ExactNoise, name, refuse)
        monkeypatch.setattr(noise.SeededNoise, name, refuse)
    monkeypatch.setattr(noise.Measure, "secret_generator", refuse)
    monkeypatch.setattr(noise.Mechanism, "opendp_measurement", refuse)


@pytest.mark.parametrize("name,entry", [("histogram", "tree"), ("contingency", "cells"),
                                        ("matrix_mechanism", "strategy")])
def test_postprocessing_reads_the_plan_committed_with_the_measurements(name, entry, tmp_path, client, monkeypatch):
    """A resume after an upgrade that changed a default scale postprocesses with the scale the noise was drawn at
    (the plan committed beside the measurements), not the one the running code builds from the spec."""
    import json
    import logging

    from tasks import stages
    from tasks.ingest import ingest_dataset
    from tasks.run import META, RunPaths, read_meta

    log = logging.getLogger("conformance")
    kind = REGISTRY[name]
    data = C.spec_for(kind, tmp_path)
    if name == "histogram":  # its default consistency for range workloads (HTree) is invariant to a common scale
        data = {**data, "release": {**data["release"], "consistency": "admm"}}
    spec = parse_spec({**data, "mode": "test", "seed": 1})
    run = RunPaths(tmp_path / "run")
    run.internal.mkdir(parents=True)
    bound = kind.bind(spec)
    prepared = bound.prepare(ingest_dataset(spec.dataset, run.stage("ingested"), run.internal, log), run, log)
    plan = bound.plan
    stages._draw_and_commit(bound, "r1", run, prepared, None, None, log)

    def products(folder):
        folder.mkdir()
        kind.bind(spec).postprocess(run.measurements, folder, run.internal, log)
        return {f.name: f.read_bytes() for f in sorted(folder.iterdir()) if f.suffix == ".parquet"}

    committed = products(tmp_path / "a")
    monkeypatch.setattr(type(kind), "plan", property(lambda self: plan.scaled(entry, 4.0)))  # an upgrade's default
    assert products(tmp_path / "b") == committed
    monkeypatch.undo()
    meta = read_meta(run.measurements)
    (run.measurements / META).write_text(json.dumps({**meta, "plan": plan.scaled(entry, 4.0).to_json()}))
    assert products(tmp_path / "c") != committed, "the committed scale decides the products"
