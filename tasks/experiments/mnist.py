"""Binarised MNIST from ../shared/data/mnist (IDX format, gzip) for the clustering experiments."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np


def read_idx(path: str | Path) -> np.ndarray:
    with gzip.open(path, "rb") as fh:
        data = fh.read()
    dims = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load_binarised(folder: str | Path, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
    """Images as binary vectors (n, 784) float64 (pixel > 127) and their labels; split: train or t10k."""
    folder = Path(folder)
    images = read_idx(folder / f"{split}-images-idx3-ubyte.gz").reshape(-1, 784)
    labels = read_idx(folder / f"{split}-labels-idx1-ubyte.gz")
    return (images > 127).astype(np.float64), labels.astype(np.int64)


def median_gamma(public: np.ndarray, pairs: int = 5000, seed: int = 0) -> float:
    """RBF width by the median heuristic on PUBLIC records: gamma = 1 / median ||x - y||^2."""
    rng = np.random.default_rng(seed)
    i, j = rng.integers(0, len(public), pairs), rng.integers(0, len(public), pairs)
    d2 = ((public[i] - public[j]) ** 2).sum(axis=1)
    return 1.0 / float(np.median(d2[d2 > 0]))


EPSILONS = (0.1, 0.25, 0.5, 1.0, 2.0)
FEATURE_DIMS = (100, 200, 500)
K, ITERATIONS, C_MAX, NORM_BINS = 10, 20, 28.0, 100


def accuracy_table(X: np.ndarray, y: np.ndarray, public: np.ndarray, *, runs: int, seed: int, epsilons=EPSILONS,
                   dims=FEATURE_DIMS, plain: bool = True):
    """Acs et al. Figure 3: clustering accuracy (Hungarian matching) of DP kernel k-means (RBF, d random
    Fourier features, clip C_s = 1, no DPNorm) and of plain DP k-means on the raw records (clip by DPNorm),
    k = 10, 20 iterations, delta = 1/N, sigma calibrated to each epsilon with dp_accounting.
    Initial centres are random records of the PUBLIC set (the MNIST test split); gamma by the median
    heuristic on it."""
    import pandas as pd

    from dpalgos import kernel_kmeans as kk
    from dpalgos.noise import simulated

    delta = 1.0 / len(X)
    gamma = median_gamma(public)
    rng = np.random.default_rng(seed)
    rows = []
    for eps in epsilons:
        sigma_kernel = kk.calibrate_sigma(epsilon=eps, delta=delta, iterations=ITERATIONS)
        for d in dims:
            for run in range(runs):
                rff = kk.rbf_features(X.shape[1], d, gamma, rng)
                Z = kk.clip_rows(rff.transform(X), 1.0)
                init = rff.transform(public[rng.choice(len(public), K, replace=False)])
                measure = simulated(kk.plan(iterations=ITERATIONS, sigma=sigma_kernel), rng)
                res = kk.dp_lloyd(lambda C: kk.grouped_stats(Z, C), init, iterations=ITERATIONS, clip=1.0,
                                  measure=measure)
                rows.append({"method": f"kernel d={d}", "d": d, "epsilon": eps, "run": run,
                             "accuracy": kk.clustering_accuracy(kk.nearest(Z, res.centres), y)})
        if plain:
            sigma_plain = kk.calibrate_sigma(epsilon=eps, delta=delta, iterations=ITERATIONS, dpnorm=True)
            hist = kk.norm_histogram(np.linalg.norm(X, axis=1), C_MAX, NORM_BINS)
            for run in range(runs):
                measure = simulated(kk.plan(iterations=ITERATIONS, sigma=sigma_plain, dpnorm=True), rng)
                clip = kk.dp_norm(hist, c_max=C_MAX, measure=measure)
                Xc = kk.clip_rows(X, clip)
                init = public[rng.choice(len(public), K, replace=False)]
                res = kk.dp_lloyd(lambda C: kk.grouped_stats(Xc, C), init, iterations=ITERATIONS, clip=clip,
                                  measure=measure)
                rows.append({"method": "plain", "d": X.shape[1], "epsilon": eps, "run": run,
                             "accuracy": kk.clustering_accuracy(kk.nearest(Xc, res.centres), y)})
    return pd.DataFrame(rows)
