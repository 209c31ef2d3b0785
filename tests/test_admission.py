"""The admission rules (tasks/admission): what they refuse, in which order, and that a refusal costs nothing: no
budget, no run folder, no file read that the rule forbids, nothing of the data in what it says."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from tasks import admission
from tasks.errors import Refused
from tests.conftest import blobs, budget, flow_run_logs, ledger, spec_dict, write_csv

ROOT = Path(__file__).resolve().parents[1]


def _spec(tmp_path, dataset: dict, release: dict) -> dict:
    budget(dataset["id"], 100.0, 1e-5)
    return {"dataset": dataset, "release": release, "output_dir": str(tmp_path / "runs")}


def _numbers(tmp_path) -> dict:
    path = write_csv(tmp_path / "v.csv", blobs(20))
    return {"id": "v", "path": str(path), "bounds": {"x": [0, 100]}}


def _sets(tmp_path, item_count: int) -> dict:
    (tmp_path / "s.dat").write_text("1 2\n3\n")
    return {"id": "s", "path": str(tmp_path / "s.dat"), "format": "transactions", "items_column": "items",
            "item_count": item_count}


#: The oversized specs of a review of 132 bad inputs, each charged and then out of memory or time, and what the
#: refusal names.
OVERSIZED = {
    "matrix mechanism, 2^16 bins, all ranges": (
        lambda t: _numbers(t), {"kind": "matrix_mechanism", "bins": 2 ** 16, "workload": "all_range",
                                "epsilon": 1.0}, "the factorisation of the 65,536 x 65,536 normal matrix"),
    "histogram, 2^30 bins": (lambda t: _numbers(t), {"kind": "histogram", "bins": 2 ** 30, "branching": 2,
                                                    "epsilon": 1.0}, "the consistency of 2,147,483,647 tree nodes"),
    "kernel k-means, k 1000, 10^4 features": (
        lambda t: _sets(t, 50), {"kind": "kernel_kmeans", "k": 1000, "features": 10_000, "gamma": 0.1,
                                 "epsilon": 1.0, "delta": 1e-6}, "the random Fourier features of one partition"),
    "synthetic, 10^7 items": (lambda t: _sets(t, 10 ** 7), {"kind": "synthetic", "gamma": 0.1, "epsilon": 1.0,
                                                           "delta": 1e-6}, "the 8 models of 4,000,000,000 weights"),
    "friendly k-means, 10^6 subsets": (
        lambda t: {"id": "f", "path": str(write_csv(t / "f.csv", blobs(50))), "numeric": ["x", "y"]},
        {"kind": "friendly_kmeans", "k": 2, "subsets": 10 ** 6, "epsilon": 1.0, "delta": 1e-6, "r": 1.0},
        "the tuple predicate over 1,000,000 subsets"),
}


@pytest.mark.parametrize("case", list(OVERSIZED))
def test_sizes_that_do_not_fit_are_refused_before_anything_is_charged(case, tmp_path, monkeypatch):
    monkeypatch.setenv("DPRELEASE_MEMORY_LIMIT_GIB", "16")
    monkeypatch.setenv("DPRELEASE_TASK_TIMEOUT_SECONDS", "14400")
    make, release, what = OVERSIZED[case]
    dataset = make(tmp_path)
    with pytest.raises(Refused, match=f"for {what}") as refused:
        admission.admit_spec(_spec(tmp_path, dataset, release))
    assert "Nothing was run" in str(refused.value) and "\n" not in str(refused.value)
    assert ledger().releases(dataset["id"]) == [] and not (tmp_path / "runs").exists()


def test_a_spec_that_fits_is_admitted_and_a_larger_limit_admits_more(tmp_path, monkeypatch):
    dataset = _numbers(tmp_path)
    release = {"kind": "matrix_mechanism", "bins": 2 ** 12, "workload": "all_range", "epsilon": 1.0}
    monkeypatch.setenv("DPRELEASE_MEMORY_LIMIT_GIB", "16")
    assert admission.admit_spec(_spec(tmp_path, dataset, release)).release.bins == 2 ** 12
    monkeypatch.setenv("DPRELEASE_MEMORY_LIMIT_GIB", "0.05")  # its 134 MB normal matrix
    with pytest.raises(Refused, match="more than the 0.05 GiB"):
        admission.admit_spec(_spec(tmp_path, dataset, release))


def test_large_k_on_tiny_data_is_admitted_and_its_seeding_costs_seconds(tmp_path):
    """A 5-row dataset with k: 1000 spent minutes in data-independent seeding after its charge: the packing of
    4 x K candidates now takes one pass over its candidates (a grid of cells of the packing's radius)."""
    import numpy as np

    from dpalgos import dpkmeans

    # Without the refinement: its consistency over the trajectory's 15,000 values is counted since (minutes).
    spec = admission.admit_spec(_spec(tmp_path, {**_numbers(tmp_path), "bounds": {"x": [0, 100], "y": [0, 100]}},
                                      {"kind": "kmeans", "k": 1000, "epsilon": 1.0, "postprocess": []}))
    from tasks.kinds import kind_of

    assert kind_of(spec).footprint.seconds < 60
    rng = np.random.default_rng(1)
    for d in (1, 2, 3):
        cands = rng.uniform(-1, 1, (5000, d))
        for a in (0.01, 0.05, 0.3):
            assert np.array_equal(dpkmeans._greedy_grid(cands, 10 ** 6, a), dpkmeans._greedy(cands, 10 ** 6, 4 * a * a))


@pytest.mark.usefixtures("prefect_api")
def test_a_flow_run_reads_spec_files_only_from_the_operators_folders(tmp_path, monkeypatch):
    """The attacker's review: `spec_file` pointed at a private CSV put `bob,51,diagnosis: HIV positive` into the flow
    run's state, a log record and an event (the YAML parser's error quoted the line), and answered for free whether
    any path exists on the worker. A file outside the operator's spec folders is neither read nor asked about; one
    inside them that does not parse is reported by line and column only."""
    from prefect import get_client

    from flows.release import release

    private = tmp_path / "private" / "patients.csv"
    private.parent.mkdir()
    private.write_text("name,age,note\nbob,51,diagnosis: HIV positive\n  x: [\n")
    allowed = tmp_path / "specs"
    allowed.mkdir()
    monkeypatch.setenv("DPRELEASE_SPEC_FOLDERS", str(allowed))
    outside = release(spec_file=str(private), return_state=True)
    absent = release(spec_file=str(tmp_path / "private" / "absent.yaml"), return_state=True)
    assert outside.is_failed() and "not in a folder the operator lets flow runs read specs from" in outside.message
    assert absent.message.replace("absent.yaml", "patients.csv") == outside.message  # no existence answer
    (allowed / "copy.yaml").write_text(private.read_text())
    inside = release(spec_file=str(allowed / "copy.yaml"), return_state=True)
    assert inside.is_failed() and re.search(r"is not valid YAML/JSON \(line \d+, column \d+\)$", inside.message)
    with get_client(sync_client=True) as client:
        said = [s.message or "" for s in (outside, absent, inside)]
        for state in (outside, absent, inside):
            run = client.read_flow_run(state.state_details.flow_run_id)
            said += [run.state.message or "", run.name]
            said += flow_run_logs(client, run.id)
    assert said and not any("HIV" in text or "bob" in text for text in said)


def test_the_cli_prints_every_refusal_as_json_with_json(tmp_path):
    import subprocess
    import sys

    d = spec_dict(tmp_path, write_csv(tmp_path / "x.csv", blobs(10)), epsilon=-1)
    (tmp_path / "s.json").write_text(json.dumps(d))
    out = subprocess.run([sys.executable, "-m", "flows.cli", "run", str(tmp_path / "s.json"), "--json"],
                         capture_output=True, text=True, timeout=120)
    failure = json.loads(out.stdout)
    assert out.returncode == 2 and failure["status"] == "refused" and failure["exit_code"] == 2
    assert "release.epsilon" in failure["error"] and out.stderr.startswith("error: ")


# ---- the layers: imports go downwards, and no module imports one that imports it back ------------------------
LAYERS = {"dpalgos": set(), "data_contracts": set(), "tasks": {"dpalgos", "data_contracts"},
          "flows": {"tasks", "dpalgos", "data_contracts"}}


def _imports() -> dict[str, set[str]]:
    """Module -> the project's modules it imports at module level (function-level imports are deferrals)."""
    sources = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
               for package in LAYERS for p in (ROOT / package).rglob("*.py")}
    graph = {}
    for name, path in sources.items():
        found = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.If):  # `if TYPE_CHECKING:` holds types only
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from package import module` imports the module; `from module import name`, the module
                found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in sources else node.module
                          for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[name] = {m for m in found if m in sources and m != name}
    return graph


def test_imports_go_down_the_layers_only():
    wrong = sorted(f"{m} -> {i}" for m, deps in _imports().items() for i in deps
                   if i.split(".")[0] != m.split(".")[0] and i.split(".")[0] not in LAYERS[m.split(".")[0]])
    assert wrong == []


def test_no_module_imports_one_that_imports_it_back():
    graph = _imports()
    state: dict[str, int] = {}

    def cycle_from(m, path):
        state[m] = 1
        for i in sorted(graph[m]):
            if state.get(i) == 1:
                return path + [i]
            if state.get(i) is None and (found := cycle_from(i, path + [i])):
                return found
        state[m] = 2
        return None

    cycles = [c for m in sorted(graph) if state.get(m) is None and (c := cycle_from(m, [m]))]
    assert cycles == []


@pytest.mark.usefixtures("prefect_api")
def test_a_spec_file_of_another_dataset_than_its_deployments_tag_is_refused(tmp_path, monkeypatch):
    """A deployment tagged `dataset:sensors` whose spec_file names dataset `clinic` ran tagged with both: refused in
    one line before anything is read or charged; the spec of the tagged dataset runs."""
    from prefect import tags

    from flows.release import release

    allowed = tmp_path / "specs"
    allowed.mkdir()
    monkeypatch.setenv("DPRELEASE_SPEC_FOLDERS", str(allowed))
    spec = spec_dict(tmp_path, write_csv(tmp_path / "x.csv", blobs(200)), epsilon=0.5, iterations=2)
    spec["dataset"]["id"] = "clinic"
    (allowed / "clinic.yaml").write_text(json.dumps(spec))
    budget("clinic")
    with tags("dataset:sensors", "kind:kmeans"):
        state = release(spec_file=str(allowed / "clinic.yaml"), return_state=True)
    assert state.is_failed() and state.message.count("\n") == 0
    assert "releases dataset 'clinic', but this run is tagged dataset:sensors" in state.message, state.message
    assert ledger().releases("clinic") == [] and not (tmp_path / "runs").exists()
    with tags("dataset:clinic", "kind:kmeans"):
        assert release(spec_file=str(allowed / "clinic.yaml"), return_state=True).is_completed()
