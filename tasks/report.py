"""The release report: internal/report.md, a human summary of one run for the data team (internal: it quotes
the raw-data evaluation)."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from tasks import intervals_report
from tasks.artifacts import markdown_table, privacy_lines
from tasks.kinds import kind_of
from tasks.kinds.base import Heatmap
from tasks.ledger import configured_ledger
from tasks.retry import sanitised
from tasks.run import RunPaths
from tasks.spec import ReleaseSpec


def _sensitivity(m: dict) -> str:
    value = m["sensitivity"]
    return f"{m['norm'].upper()} {value:g}" if isinstance(value, (int, float)) else f"{m['norm'].upper()} {value}"


def _noise(m: dict) -> str:
    scale = f"scale {m['scale']:.4g}" if m["scale"] is not None else f"multiplier {m['noise_multiplier']:.4g} x C"
    sampled = f", Poisson sampling rate {m['sampling_rate']:g}" if m["sampling_rate"] else ""
    return f"{m['distribution']} {scale}{sampled}"


def _uncertainty(run: RunPaths, manifest: dict) -> list[str]:
    """How wrong the published values may be: the method, the main product's first rows with their intervals, and
    its plot with error bars (from release/ only)."""
    uncertainty = manifest.get("uncertainty")
    lines = ["", "## Uncertainty of the published values", "", *intervals_report.summary_lines(uncertainty),
             *intervals_report.caveat_lines(manifest)]
    header, rows = intervals_report.table(run.release, uncertainty)
    if rows:
        lines += ["", *markdown_table(header, rows)]
    png = intervals_report.plot(run.release, uncertainty, run.internal / "uncertainty" / "intervals.png")
    return lines + (["", f"![intervals]({png.relative_to(run.internal)})"] if png else [])


#: Tick labels are written on a heat map's axis up to this many rows or columns (more would overlap).
MAX_TICK_LABELS = 40
HEATMAP = "heatmap.png"


def heatmap(shown: Heatmap, path: Path) -> Path:
    """A released matrix as a heat map (PNG): a kind's `heatmap` (the `od` table; any 2-D release can use it). Its
    values are released ones: the picture may be published with them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm

    rows, cols = shown.values.shape
    fig, ax = plt.subplots(figsize=(5.2, 4.4) if shown.extent else
                           (min(12.0, 3.0 + 0.35 * cols), min(10.0, 2.5 + 0.3 * rows)))
    values, norm, label = shown.values, None, None
    if shown.log_floor is not None:
        values = np.where(shown.values >= shown.log_floor, shown.values, np.nan)
        if np.isfinite(values).any():
            norm = LogNorm(vmin=shown.log_floor, vmax=max(float(np.nanmax(values)), 1.0))
        label = f"log scale; blank: below {shown.log_floor:g}"
    place = {"origin": "lower", "extent": shown.extent} if shown.extent else {}
    image = ax.imshow(values, cmap="viridis", aspect="auto", interpolation="nearest", norm=norm, **place)
    fig.colorbar(image, ax=ax, label=label)
    for ticks, labels, axis in ((ax.set_yticks, shown.rows, "y"), (ax.set_xticks, shown.columns, "x")):
        if labels and len(labels) <= MAX_TICK_LABELS:
            ticks(range(len(labels)), labels, **({"rotation": 90} if axis == "x" else {}))
    ax.set_ylabel(shown.row_name)
    ax.set_xlabel(shown.column_name)
    ax.set_title(shown.title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


@task(name="report", cache_policy=NO_CACHE, persist_result=False)
@sanitised
def write_report(spec: ReleaseSpec, release_id: str, run: RunPaths, manifest: dict, evaluation: dict | None,
                 timings: dict) -> Path:
    """Spend and remaining budget of the dataset, contract results per stage, stage timings, evaluation and
    its plots, as Markdown with relative links to the PNG figures."""
    privacy = manifest["privacy"]
    budget = privacy.get("dataset_budget")
    lines = [f"# Release {release_id}", "",
             f"Kind `{spec.release.kind}` on dataset `{spec.dataset.id}`, published {manifest['created_at']}.",
             f"Published files: `{run.release}` (safe to publish). This report and everything under `internal/` "
             f"are derived from the raw data: do not publish them.", "",
             *privacy_lines(privacy)]
    lines += markdown_table(["mechanism", "query", "neighbours", "sensitivity", "noise", "repetitions"],
                    [[m["name"], m["query"], m["relation"], _sensitivity(m), _noise(m), m["repetitions"]]
                     for m in privacy["mechanisms"]])
    if budget:
        lines += ["", f"Dataset `{spec.dataset.id}`: lifetime budget epsilon = {budget['epsilon']:g}, delta = "
                      f"{budget['delta']:g}; spent epsilon = {budget['spent_epsilon']:.6g} "
                      f"({budget['spent_accounting']}); remaining epsilon = {budget['remaining_epsilon']:.6g}.", "",
                  "Releases in the ledger:", ""]
        lines += markdown_table(["release", "kind", "epsilon", "delta", "status", "attempts", "created"],
                        [[r["release_id"], r["kind"], f"{r['epsilon']:.4g}", f"{r['delta']:.3g}", r["status"],
                          r["attempts"], r["created_at"]] for r in configured_ledger().releases(spec.dataset.id)])
    lines += _uncertainty(run, manifest)
    shown = kind_of(spec).heatmap(run.release)
    if shown is not None:  # the released matrix, as users would rather look than read
        png = heatmap(shown, run.internal / HEATMAP)
        lines += ["", "## The released table", "", f"![{shown.title}]({png.relative_to(run.internal)})"]
    lines += ["", "## Data contracts", ""]
    contract_rows = []
    for stage_file in sorted((run.internal / "contracts").glob("*.json"), key=lambda p: p.stat().st_mtime):
        c = json.loads(stage_file.read_text())
        n = sum(len(s.get("expectations", [])) for s in c.get("suites", {}).values())
        contract_rows.append([c["stage"], n, c.get("rows", ""), c.get("files", ""), "passed" if c["success"] else
                              "FAILED"])
    lines += markdown_table(["stage", "expectations", "rows", "files", "result"], contract_rows)
    lines += ["", "## Stage timings", ""]
    lines += markdown_table(["stage", "seconds"], [[k, f"{v:.2f}"] for k, v in timings.items()])
    lines += ["", "## Evaluation (against the raw data)", ""]
    lines.append(evaluation["headline"] if evaluation else "Not run (evaluate: false).")
    for png in sorted(run.internal.rglob("*.png")):
        if png.parent.name != "uncertainty" and png.name != HEATMAP:
            lines += ["", f"![{png.stem}]({png.relative_to(run.internal)})"]
    path = run.internal / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
