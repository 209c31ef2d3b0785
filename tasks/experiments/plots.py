"""Paper-style figures of experiment tables: one panel per facet, one line per method, mean over runs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def line_grid(frame: pd.DataFrame, *, x: str, y: str, path: Path, rows: str | None = None, cols: str | None = None,
              hue: str = "method", logx: bool = False, logy: bool = True, title: str = "",
              band: tuple[float, float] | None = None) -> None:
    """Mean of `y` over the other columns against `x`, one line per `hue` value; with `band` (q_lo, q_hi),
    the median and a shaded quantile band instead of the mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # One colour per hue value across every panel, and a legend on every panel: a panel shows a subset of the
    # methods, and colours assigned per panel would make the same colour mean two methods.
    colours = {h: f"C{i}" for i, h in enumerate(sorted(frame[hue].unique(), key=str))}
    row_vals = sorted(frame[rows].unique()) if rows else [None]
    col_vals = sorted(frame[cols].unique()) if cols else [None]
    fig, axes = plt.subplots(len(row_vals), len(col_vals), figsize=(4.2 * len(col_vals), 3.2 * len(row_vals)),
                             squeeze=False)
    for i, rv in enumerate(row_vals):
        for j, cv in enumerate(col_vals):
            ax = axes[i][j]
            sub = frame
            if rows:
                sub = sub[sub[rows] == rv]
            if cols:
                sub = sub[sub[cols] == cv]
            for h, g in sub.groupby(hue):
                stats = g.groupby(x)[y]
                if band:
                    mid = stats.median()
                    ax.fill_between(mid.index, stats.quantile(band[0]), stats.quantile(band[1]), alpha=0.2,
                                    color=colours[h])
                else:
                    mid = stats.mean()
                ax.plot(mid.index, mid.values, "o-", ms=3, label=str(h), color=colours[h])
            ax.set_xscale("log" if logx else "linear")
            ax.set_yscale("log" if logy else "linear")
            ax.set_xlabel(x)
            ax.set_ylabel(y)
            ax.set_title(" / ".join(str(v) for v in (rv, cv) if v is not None), fontsize=9)
            if ax.lines:
                ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def bars(frame: pd.DataFrame, *, group: str, y: str, path: Path, cols: str, hue: str = "method",
         logy: bool = True, title: str = "") -> None:
    """Mean of `y` per (`group`, `hue`) as grouped bars, one panel per `cols` value."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    col_vals = sorted(frame[cols].unique())
    fig, axes = plt.subplots(1, len(col_vals), figsize=(4.2 * len(col_vals), 3.2), squeeze=False)
    for ax, cv in zip(axes[0], col_vals):
        table = frame[frame[cols] == cv].groupby([group, hue])[y].mean().unstack()
        table.plot.bar(ax=ax, logy=logy, rot=0)
        ax.set_title(str(cv), fontsize=9)
        ax.set_ylabel(y)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
