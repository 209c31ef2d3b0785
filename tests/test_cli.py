"""The `dprelease` command: help on every subcommand, exit codes, budget inspection, one real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import blobs, ledger, spec_dict, write_csv

HELP = [[], ["run"], ["experiment"], ["generate"], ["budget"], ["budget", "show"], ["budget", "set"], ["public"],
        ["public", "register"], ["public", "list"], ["ledger"], ["ledger", "migrate"], ["ledger", "reconcile"],
        ["spec"], ["spec", "check"], ["accuracy"], ["query"]]


def dprelease(*args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PREFECT_HOME": str(Path(cwd or ".").resolve() / ".prefect-home")}
    return subprocess.run([sys.executable, "-m", "flows.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=timeout)


@pytest.mark.parametrize("words", HELP, ids=lambda w: " ".join(w) or "top")
def test_every_subcommand_has_help(words):
    out = dprelease(*words, "--help")
    assert out.returncode == 0 and "usage: dprelease" in out.stdout


def started_by(marker: str) -> set[int]:
    """PIDs of the live processes whose environment holds `marker` (those a test started, and their children):
    never another process of the machine (a test that counted every Prefect server failed when another job ran
    one)."""
    pids = set()
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and marker.encode() in (proc / "environ").read_bytes():
                pids.add(int(proc.name))
        except OSError:
            continue
    return pids


def test_invalid_spec_exits_2_with_the_field_named_and_starts_nothing(tmp_path):
    d = spec_dict(tmp_path, write_csv(tmp_path / "x.csv", blobs(10)), epsilon=-1)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    marker = f"DPRELEASE_TEST_MARKER={tmp_path.name}"
    # Output to files, not pipes: a server and its guard would inherit the CLI's streams, and reading pipes to
    # their end would wait for them too.
    with open(tmp_path / "out", "w") as stdout, open(tmp_path / "err", "w") as stderr:
        cli = subprocess.Popen([sys.executable, "-m", "flows.cli", "run", str(tmp_path / "s.yaml")], stdout=stdout,
                               stderr=stderr, env={**os.environ, "PREFECT_HOME": str(tmp_path / ".prefect-home",),
                                                   "DPRELEASE_TEST_MARKER": tmp_path.name})
        assert cli.wait(300) == 2
    assert started_by(marker) == set()  # the admission refused it before any server was launched
    err = (tmp_path / "err").read_text()
    assert "release.epsilon" in err and err.splitlines() == [l for l in err.splitlines() if l.startswith("error:")]
    out = dprelease("spec", "check", str(tmp_path / "s.yaml"))
    assert out.returncode == 2


def test_run_then_budget_show(tmp_path, operator_ledger):
    """One real run of the CLI (its own temporary Prefect API), then the ledger."""
    d = spec_dict(tmp_path, write_csv(tmp_path / "b.csv", blobs(2000)))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    ok = dprelease("budget", "set", "blobs", "--epsilon", "1.5", "--delta", "1e-6", "--source", str(tmp_path / "b.csv"),
                   "--reading-from", str(tmp_path / "s.yaml"))
    assert ok.returncode == 0 and str(operator_ledger) in ok.stdout
    ok = dprelease("run", str(tmp_path / "s.yaml"), "--release-id", "cli-1", "--json", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr[-3000:]
    summary = json.loads(ok.stdout)
    assert summary["status"] == "published" and summary["release_id"] == "cli-1"
    assert (tmp_path / "runs" / "cli-1" / "release" / "manifest.json").exists()
    assert "Traceback" not in (tmp_path / "runs" / ".logs" / "cli-1.log").read_text()

    ledger = str(operator_ledger)
    shown = dprelease("budget", "show", "blobs", "--json")  # the configured ledger
    assert shown.returncode == 0
    info = json.loads(shown.stdout)
    assert [r["release_id"] for r in info["releases"]] == ["cli-1"]
    assert info["budget"]["epsilon"] == 1.5 and 0.99 < info["spent"]["epsilon"] <= 1.0 + 1e-9
    assert "cli-1" in dprelease("budget", "show", "blobs", "--ledger", ledger).stdout
    assert dprelease("budget", "show", "other", "--ledger", ledger).returncode == 1


@pytest.mark.slow  # two CLI runs, ~45 s (pytest -m slow)
def test_a_run_refused_at_run_time_prints_one_error_line_and_logs_the_traceback(tmp_path, operator_ledger):
    """A failure only the read can find (a value that is not a number, past the parser's first sample), once the
    run has started: one `error:` line, the traceback in the run's log file, nothing charged or kept. (A budget the
    release would exceed, this test's case before, is now refused by the admission, before the run.)"""
    points = [f"{x:.6f},{y:.6f}" for x, y in blobs(2000)]
    points[-3] = "12.5,not-a-number"
    (tmp_path / "b.csv").write_text("x,y\n" + "\n".join(points) + "\n")
    d = spec_dict(tmp_path, tmp_path / "b.csv")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    assert dprelease("budget", "set", "blobs", "--epsilon", "1.5", "--delta", "1e-6", "--source",
                     str(tmp_path / "b.csv"), "--reading-from", str(tmp_path / "s.yaml")).returncode == 0
    refused = dprelease("run", str(tmp_path / "s.yaml"), "--release-id", "cli-2", cwd=tmp_path)
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert refused.returncode == 1 and len(errors) == 1, refused.stderr
    assert "not-a-number" not in refused.stderr + refused.stdout  # nothing of the data in the line
    assert "Traceback" not in refused.stderr + refused.stdout  # tracebacks go to the run's log file only
    assert "Traceback" in (tmp_path / "runs" / ".logs" / "cli-2.log").read_text()
    assert not (tmp_path / "runs" / "cli-2").exists() and ledger().releases("blobs") == []


def test_readme_kinds_table_is_the_registry():
    """The README's table of release kinds is `dprelease kinds`, derived from the registry."""
    from pathlib import Path

    from flows.cli.kinds import kinds_table
    from tasks.kinds import REGISTRY

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert kinds_table() in readme
    assert all(f"| `{name}` |" in kinds_table() for name in REGISTRY)


def test_a_dataset_without_a_registered_budget_is_refused_before_anything_runs(tmp_path):
    """Budgets are operator decisions: a spec cannot bring its own, and a dataset without one is refused in
    a second or two, before Prefect starts, with nothing written."""
    d = {k: v for k, v in spec_dict(tmp_path, write_csv(tmp_path / "b.csv", blobs(50))).items()}
    d["dataset"]["id"] = "unregistered"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    refused = dprelease("run", str(tmp_path / "s.yaml"), cwd=tmp_path)
    assert refused.returncode == 2 and "has no lifetime budget" in refused.stderr
    assert "budget set unregistered" in refused.stderr
    assert not (tmp_path / "runs").exists()
    budgeted = {**d, "dataset": {**d["dataset"], "id": "blobs"}}  # a spec of a budgeted dataset bringing its own
    (tmp_path / "l.yaml").write_text(yaml.safe_dump({**budgeted, "ledger": {"lifetime_epsilon": 1e6}}))
    own = dprelease("run", str(tmp_path / "l.yaml"), cwd=tmp_path)
    assert own.returncode == 2 and "operator configuration, not spec fields" in own.stderr


def test_missing_inputs_fail_fast_one_line_each(tmp_path):
    """Missing files are found before Prefect starts: one `error:` line per problem, exit 2, in seconds."""
    d = spec_dict(tmp_path, tmp_path / "absent.csv")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    for command in (("spec", "check"), ("run",)):
        out = dprelease(*command, str(tmp_path / "s.yaml"), cwd=tmp_path)
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 2 and lines == [line for line in lines if line.startswith("error:")], out.stderr
        assert any("dataset.path" in line and "does not exist" in line for line in lines)
        assert "Traceback" not in out.stderr and "prefect" not in out.stderr.lower()  # before Prefect started
    assert not (tmp_path / "runs").exists()
    assert dprelease("--version").stdout.startswith("dprelease ")


@pytest.mark.parametrize("args", [("budget", "set", "d", "--epsilon", "inf"), ("budget", "set", "d", "--epsilon", "0"),
                                  ("budget", "set", "d", "--epsilon", "1", "--delta", "1"),
                                  ("generate", "cdr", "--users", "-5", "--out", "x")], ids=" ".join)
def test_out_of_range_arguments_are_refused_with_exit_2(args, tmp_path):
    out = dprelease(*args, cwd=tmp_path)
    assert out.returncode == 2 and "Traceback" not in out.stderr and not (tmp_path / "x").exists()


def test_spec_check_json(tmp_path):
    d = spec_dict(tmp_path, write_csv(tmp_path / "b.csv", blobs(10)))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(d))
    out = json.loads(dprelease("spec", "check", str(tmp_path / "s.yaml"), "--json").stdout)
    assert out["valid"] and out["kind"] == "kmeans" and out["dataset_id"] == "blobs"
    # the accuracy planner at the spec's epsilon: a noisy count's error is exact (discrete Laplace, b = 2T/eps)
    count = next(r for r in out["accuracy"] if r["quantity"].startswith("noisy cluster count"))
    assert out["confidence"] == 0.95 and count["std"] > 0 and count["basis"].startswith("exact")


def test_the_terminal_summary_names_the_evaluation_but_shows_none_of_its_figures(tmp_path):
    """The evaluation's figures are raw-derived (with the published values they can single out a record): the
    summary printed on the terminal names the file only."""
    from flows.cli.run import format_summary

    evaluation = tmp_path / "evaluation.json"
    evaluation.write_text(json.dumps({"headline": "unit-query MSE 11.78 (noisy leaves: 25)"}))
    summary = {"release_id": "r", "kind": "histogram", "dataset_id": "d", "status": "published", "private": True,
               "release_dir": "rel", "internal_dir": "int", "epsilon": 1.0, "delta": 0.0, "accounting": "pure",
               "dataset_budget": None, "evaluation": str(evaluation)}
    text = format_summary(summary)
    assert str(evaluation) in text and "11.78" not in text and "MSE" not in text


def test_the_operator_binds_how_the_data_is_read_before_any_release_does(tmp_path):
    """Bound by the first release only, the reading was trust on first use: whoever ran first chose the
    delimiter, the user column, what one record is (a probe that the binding then kept). The operator's reading
    names the exact file too: a review read the first line of a note beside the data, in the bound folder,
    through the missing-column refusal."""
    (tmp_path / "data").mkdir()
    data = write_csv(tmp_path / "data" / "b.csv", blobs(50))
    (tmp_path / "data" / "note.txt").write_text("secret other words\n")
    for name, change in (("reviewed", {}), ("probe", {"delimiter": ";"}), ("other-id", {"id": "other"}),
                         ("other-data", {"path": str(tmp_path / "c.csv")}),
                         ("sibling", {"path": str(tmp_path / "data" / "note.txt"), "bounds": {"secret": [0, 1]}}),
                         ("other-column", {"bounds": {"x": [0, 100], "label": [0, 1]}}),
                         ("absent", {"path": str(tmp_path / "data" / "city=Springfield")}),
                         ("absent-bad-id", {"path": str(tmp_path / "data" / "city=Springfield"), "id": 5}),
                         ("dotdot", {"path": f"{tmp_path}/data/city=Shelbyville/../b.csv"}),
                         ("x-categorical", {"bounds": None, "categories": {"x": ["1", "2"]}})):  # a table of x
        d = spec_dict(tmp_path, data)
        d["dataset"].update(change)
        if "categories" in change:
            d["release"] = {"kind": "contingency", "epsilon": 1.0}
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(d))

    def budget_set(*specs):
        return dprelease("budget", "set", "blobs", "--epsilon", "1", "--source", str(tmp_path / "data"),
                         "--reading-from", *(str(tmp_path / spec) for spec in specs), cwd=tmp_path)

    for specs, problem in ((["other-id.yaml"], "is a spec of dataset 'other'"),
                           (["other-data.yaml"], "not the dataset's data"), (["."], "cannot be read"),
                           (["reviewed.yaml", "x-categorical.yaml"], "parses column(s) x otherwise")):
        refused = budget_set(*specs)
        assert refused.returncode == 2 and problem in refused.stderr and len(refused.stderr.splitlines()) == 1
    bound = budget_set("reviewed.yaml")
    assert bound.returncode == 0 and "'delimiter': None" in bound.stdout
    for spec, problem in (("probe", " (delimiter=None)"), ("sibling", f" (path='{data}')"),
                          ("absent", f" (path='{data}')"),  # not "does not exist": a free question on the folder
                          ("other-column", ", whose columns are x (numeric), y (numeric); this spec reads label")):
        refused = dprelease("run", str(tmp_path / f"{spec}.yaml"), cwd=tmp_path)
        assert refused.returncode == 2 and f"is read as bound to its budget{problem}" in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()
    checked = dprelease("spec", "check", str(tmp_path / "absent.yaml"), cwd=tmp_path)
    assert checked.returncode == 2 and f"is read as bound to its budget (path='{data}')" in checked.stderr
    unparsed = dprelease("spec", "check", str(tmp_path / "absent-bad-id.yaml"), cwd=tmp_path)
    assert unparsed.returncode == 2 and "dataset.id" in unparsed.stderr and "exist" not in unparsed.stderr
    # `..` past a missing folder: existence is asked of the path the ledger judged, not of the spelling.
    assert dprelease("spec", "check", str(tmp_path / "dotdot.yaml"), cwd=tmp_path).returncode == 0
    inside = yaml.safe_load((tmp_path / "reviewed.yaml").read_text())
    inside["output_dir"] = str(tmp_path / "data" / "b.csv" / "runs")  # "not writable" named what exists in it
    (tmp_path / "inside.yaml").write_text(yaml.safe_dump(inside))
    refused = dprelease("run", str(tmp_path / "inside.yaml"), cwd=tmp_path)
    assert refused.returncode == 2 and "is inside a dataset's data" in refused.stderr
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["b.csv", "note.txt"]


def test_a_budget_is_set_for_named_data_and_a_release_of_other_data_is_refused(tmp_path):
    no_source = dprelease("budget", "set", "blobs", "--epsilon", "1")
    assert no_source.returncode == 2 and "--source" in no_source.stderr
    no_reading = dprelease("budget", "set", "blobs", "--epsilon", "1", "--source", str(tmp_path / "a.csv"))
    assert no_reading.returncode == 2 and "--reading-from" in no_reading.stderr
    (tmp_path / "a.yaml").write_text(yaml.safe_dump(spec_dict(tmp_path, tmp_path / "a.csv")))
    assert dprelease("budget", "set", "blobs", "--epsilon", "1", "--source", str(tmp_path / "a.csv"),
                     "--reading-from", str(tmp_path / "a.yaml")).returncode == 0
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec_dict(tmp_path, write_csv(tmp_path / "b.csv", blobs(50)))))
    refused = dprelease("run", str(tmp_path / "s.yaml"), cwd=tmp_path)
    assert refused.returncode == 2 and "is bound to the data" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and not (tmp_path / "runs").exists()
