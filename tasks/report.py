"""The release report: internal/report.md, a human summary of one run for the data team (internal: it quotes
the raw-data evaluation)."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks.ledger import PrivacyLedger
from tasks.run import RunPaths
from tasks.spec import ReleaseSpec


def _sensitivity(m: dict) -> str:
    return f"L1 {m['l1_sensitivity']:g}" if "l1_sensitivity" in m else f"L2 {m['l2_sensitivity']}"


def _noise(m: dict) -> str:
    return f"Laplace scale {m['scale']:.4g}" if "scale" in m else f"Gaussian std {m['std']}"


def _table(header: list[str], rows: list[list]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return out + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]


@task(name="report", cache_policy=NO_CACHE)
def write_report(spec: ReleaseSpec, release_id: str, run: RunPaths, manifest: dict, evaluation: dict | None,
                 timings: dict) -> Path:
    """Spend and remaining budget of the dataset, contract results per stage, stage timings, evaluation and
    its plots, as Markdown with relative links to the PNG figures."""
    privacy = manifest["privacy"]
    budget = privacy["dataset_budget"]
    ledger = PrivacyLedger(spec.ledger_path)
    lines = [f"# Release {release_id}", "",
             f"Kind `{spec.release.kind}` on dataset `{spec.dataset.id}`, published {manifest['created_at']}.",
             f"Published files: `{run.release}` (safe to publish). This report and everything under `internal/` "
             f"are derived from the raw data: do not publish them.", "",
             "## Privacy", "",
             f"This release: epsilon = {privacy['epsilon']:.6g}, delta = {privacy['delta']:.3g} "
             f"({privacy['accounting']}); neighbours: {privacy['neighbouring_relation']}.", ""]
    lines += _table(["mechanism", "query", "sensitivity", "noise", "repetitions"],
                    [[m["mechanism"], m["query"], _sensitivity(m), _noise(m), m["repetitions"]]
                     for m in privacy["mechanisms"]])
    lines += ["", f"Dataset `{spec.dataset.id}`: lifetime budget epsilon = {budget['epsilon']:g}, delta = "
                  f"{budget['delta']:g}; spent epsilon = {budget['spent_epsilon']:.6g} ({budget['spent_accounting']}); "
                  f"remaining epsilon = {budget['remaining_epsilon']:.6g}.", "", "Releases in the ledger:", ""]
    lines += _table(["release", "kind", "epsilon", "delta", "status", "created"],
                    [[r["release_id"], r["kind"], f"{r['epsilon']:.4g}", f"{r['delta']:.3g}", r["status"],
                      r["created_at"]] for r in ledger.releases(spec.dataset.id)])
    lines += ["", "## Data contracts", ""]
    contract_rows = []
    for stage_file in sorted((run.internal / "contracts").glob("*.json"), key=lambda p: p.stat().st_mtime):
        c = json.loads(stage_file.read_text())
        n = sum(len(s.get("expectations", [])) for s in c.get("suites", {}).values())
        contract_rows.append([c["stage"], n, c.get("rows", ""), c.get("files", ""), "passed" if c["success"] else
                              "FAILED"])
    lines += _table(["stage", "expectations", "rows", "files", "result"], contract_rows)
    lines += ["", "## Stage timings", ""]
    lines += _table(["stage", "seconds"], [[k, f"{v:.2f}"] for k, v in timings.items()])
    lines += ["", "## Evaluation (against the raw data)", ""]
    lines.append(evaluation["headline"] if evaluation else "Not run (evaluate: false).")
    for png in sorted(run.internal.rglob("*.png")):
        lines += ["", f"![{png.stem}]({png.relative_to(run.internal)})"]
    path = run.internal / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
