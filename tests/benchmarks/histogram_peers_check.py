"""Sanity check of the 1-D histogram peers (tests/benchmarks/_histogram_peers.py) on the DPBench histograms:
every peer at epsilon 0.1 and 1, a few runs each, the MSE of 1,000 random ranges [lo, hi) (lo < hi uniform over
the pairs of bin boundaries; the same ranges for every peer and run) and of all unit queries (one bin each),
mean over runs, and the seconds per call. Ranges and units are answered from each peer's per-bin estimate by
prefix sums, signed (nothing clipped).

Besides the four peers, two kinds of rows that are NOT peers, for reading the figures:
  htree2, htree16       the project's hierarchical least squares (dpalgos.baselines.htree, Hay et al.) on a
                        binary / 16-ary tree, the histogram padded with empty bins to a power of the branching
                        factor: what HDMM should beat on ranges by a modest factor;
  dawa_refnoise         DAWA with the reference implementation's stage-1 noise (half the scale, none on
                        singletons, costs clamped at 1/eps2), which is NOT epsilon-DP (_histogram_peers.py,
                        dawa_partition_scale): how much the privacy fix costs DAWA, never a figure to publish.

HDMM's strategy for n bins is read from the benchmarks' cache folder or optimised first (minutes at n = 4096,
once; tests/benchmarks/_peer_venv.py says where the cache lives).

    nice -n 10 python tests/benchmarks/histogram_peers_check.py [--runs 5] [--eps 0.1,1] [--data DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from dpalgos import baselines  # noqa: E402
from dpalgos.hierarchy import Tree  # noqa: E402
from tests.benchmarks import _histogram_peers as peers  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "histograms"


def _htree(branching: int):
    def run(h, epsilon, rng):
        m = 1
        while m < h.size:
            m *= branching
        hp = np.concatenate([np.asarray(h, dtype=np.float64), np.zeros(m - h.size)])
        return baselines.htree(Tree(m, branching), hp, epsilon=epsilon, rng=rng)[:h.size]
    return run


METHODS = {
    **peers.PEERS,
    "htree2": _htree(2),
    "htree16": _htree(16),
    "dawa_refnoise": lambda h, eps, rng: peers.dawa(h, eps, rng, reference_stage1=True),
}


def random_ranges(n: int, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """`count` ranges [lo, hi), {lo, hi} uniform over the pairs of distinct bin boundaries 0..n."""
    a = rng.integers(0, n + 1, count)
    b = rng.integers(0, n, count)
    b = b + (b >= a)
    return np.minimum(a, b), np.maximum(a, b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(DATA), help="folder of .npy histograms (default: the six DPBench ones)")
    ap.add_argument("--eps", default="0.1,1")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranges", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    args = ap.parse_args()
    epsilons = [float(e) for e in args.eps.split(",")]
    methods = args.methods.split(",")
    files = sorted(Path(args.data).glob("*.npy"))
    if not files:
        raise SystemExit(f"no .npy histograms in {args.data}")
    rng = np.random.default_rng(args.seed)
    sizes = {np.load(f).size for f in files}
    if "hdmm" in methods:
        for n in sorted(sizes):
            s = peers.hdmm_strategy(n, log=print)
            identity = peers.range_gram_diag(n).sum()
            print(f"hdmm strategy n={n} p={s.B.shape[0]}: loss {s.loss:.4g} (identity {identity:.4g}), "
                  f"{s.iterations} L-BFGS-B iterations in {s.starts} start(s), optimised in {s.seconds:.0f}s"
                  f"{' (read from the cache)' if s.cached else ''}")
    summary = {}
    for f in files:
        h = np.load(f).reshape(-1)
        name = f.name.split(".")[0]
        n = h.size
        lo, hi = random_ranges(n, args.ranges, rng)
        cs = np.concatenate([[0], np.cumsum(h)])
        truth = (cs[hi] - cs[lo]).astype(np.float64)
        print(f"\n{name}: {n} bins, {h.sum()} records, {np.mean(h == 0):.1%} empty; {args.runs} runs")
        print(f"{'method':<16}" + "".join(f"{f'range eps={e:g}':>16}{f'unit eps={e:g}':>14}" for e in epsilons)
              + f"{'s/call':>9}")
        for m in methods:
            fn = METHODS[m]
            row, secs = [], []
            for eps in epsilons:
                r_mse, u_mse = [], []
                for _ in range(args.runs):
                    t0 = time.perf_counter()
                    est = np.asarray(fn(h, eps, rng), dtype=np.float64)
                    secs.append(time.perf_counter() - t0)
                    assert est.shape == (n,), (m, est.shape)
                    ce = np.concatenate([[0.0], np.cumsum(est)])
                    r_mse.append(np.mean((ce[hi] - ce[lo] - truth) ** 2))
                    u_mse.append(np.mean((est - h) ** 2))
                row += [np.mean(r_mse), np.mean(u_mse)]
                summary[name, eps, m] = (np.mean(r_mse), np.mean(u_mse))
            print(f"{m:<16}" + "".join(f"{row[2 * i]:>16.4g}{row[2 * i + 1]:>14.4g}" for i in range(len(epsilons)))
                  + f"{np.median(secs):>9.3f}")
    for eps in epsilons:
        print(f"\nbest peer on ranges at eps={eps:g} (peers only): "
              + ", ".join(f"{name} {min(peers.PEERS, key=lambda m: summary[name, eps, m][0])}"
                          for name in dict.fromkeys(k[0] for k in summary) if all(
                              (name, eps, m) in summary for m in peers.PEERS)))


if __name__ == "__main__":
    main()
