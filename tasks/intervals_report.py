"""The published intervals where people look: a summary and a table of the main product's values with their
intervals (the release report and the Prefect report artifact), and a plot of them with error bars (the report).
Everything here reads release/ only, the published values and their uncertainty.json: it may reach the UI."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

#: Rows of the main product shown in a table; value columns shown in the plot.
TABLE_ROWS = 12
PLOT_COLUMNS = 4


def main_product(uncertainty: dict) -> tuple[str, list[str]] | None:
    """The file and value columns whose intervals are shown: the first bootstrap product (its bounded counts, then
    its replicated columns), else the first file of direct measurements published at the top level (the
    FriendlyCore result)."""
    for name, product in (uncertainty.get("bootstrap", {}).get("products") or {}).items():
        if product["intervals"] == "bootstrap":  # a count product: its non-negative counts first
            return name, list(product.get("bounded", {})) + product["columns"]
    for name, columns in uncertainty["direct"]["files"].items():
        return name, list(columns)
    return None


def summary_lines(uncertainty: dict | None) -> list[str]:
    if not uncertainty:
        return ["No intervals: the release was made before they existed."]
    boot = uncertainty["bootstrap"]
    lines = [(f"Intervals at confidence {uncertainty['confidence']:g}: direct measurements analytic (exact "
              f"quantiles of their plan entry's noise).")]
    if boot.get("replicates"):
        lines.append(f"Postprocessed values: parametric bootstrap, B = {boot['replicates']} replicates, published "
                     f"({', '.join(p['replicates_file'] for p in boot['products'].values() if p['replicates_file'])}); "
                     f"seed {boot['seed']} from the measurements.")
    else:
        lines.append(f"No bootstrap ({boot['reason']}).")
    return lines + [uncertainty["privacy"].capitalize() + "."]


def caveat_lines(manifest: dict) -> list[str]:
    """The release's caveats (`ReleaseKind.caveats`): how far its numbers reach."""
    return [f"**Caveat:** {c}" for c in manifest.get("caveats") or []]


def table(release: Path, uncertainty: dict | None) -> tuple[list[str], list[list]]:
    """(header, rows) of the main product's first rows: value, standard deviation and interval per column."""
    found = main_product(uncertainty) if uncertainty else None
    if found is None:
        return [], []
    name, columns = found
    frame = pq.read_table(release / name).to_pandas().head(TABLE_ROWS)
    shown = columns[:PLOT_COLUMNS]
    header = ["row"] + [f"{name}: {c} (std) [lo, hi]" for c in shown]
    rows = [[i] + [f"{r[c]:.4g} ({r[c + '_std']:.3g}) [{r[c + '_lo']:.4g}, {r[c + '_hi']:.4g}]" for c in shown]
            for i, r in frame.iterrows()]
    return header, rows


def plot(release: Path, uncertainty: dict | None, path: Path) -> Path | None:
    """The main product's values per row with their intervals (bars up to 100 rows, a band beyond)."""
    found = main_product(uncertainty) if uncertainty else None
    if found is None:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name, columns = found
    frame = pq.read_table(release / name).to_pandas()
    shown = columns[:PLOT_COLUMNS]
    fig, axes = plt.subplots(len(shown), 1, figsize=(7, 2.6 * len(shown)), squeeze=False)
    x = range(len(frame))
    for ax, c in zip(axes[:, 0], shown):
        lo, hi, v = frame[c + "_lo"], frame[c + "_hi"], frame[c]
        if len(frame) <= 100:  # a bootstrap interval need not contain the value: bars from lo to hi, not +- errors
            ax.vlines(x, lo, hi, lw=1.5, alpha=0.6, label=f"{uncertainty['confidence']:g} interval")
            ax.plot(x, v, "o", ms=3, label="released")
            ax.legend(fontsize=8)
        else:
            ax.fill_between(x, lo, hi, alpha=0.35, step="mid", label=f"{uncertainty['confidence']:g} interval")
            ax.plot(x, v, lw=0.8, drawstyle="steps-mid", label="released")
            ax.legend(fontsize=8)
        ax.set_ylabel(c)
    axes[0, 0].set_title(f"{name}: released values and their {uncertainty['confidence']:g} intervals", fontsize=10)
    axes[-1, 0].set_xlabel("row")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
