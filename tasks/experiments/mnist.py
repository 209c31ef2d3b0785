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


EPSILONS = (0.1, 0.25, 0.5, 1.0, 2.0)
FEATURE_DIMS = (100, 200, 500)
K, ITERATIONS, C_MAX, NORM_BINS = 10, 20, 28.0, 100


def kernel_spec(epsilon: float, features: int, records: int, *, k: int = K, iterations: int = ITERATIONS,
                items: int = 784):
    """The `kernel_kmeans` release spec of the experiment: binarised images as sets of their on pixels (784 items),
    delta = 1/N, clip C_s = 1 (the kind's default, no DPNorm), gamma by the kind's median heuristic on the public
    sample (the MNIST test split) and initial centres drawn from it."""
    from tasks.spec import parse_spec

    return parse_spec({"dataset": {"id": "mnist", "path": "mnist-train.parquet", "items_column": "pixels",
                                   "item_count": items},
                       "release": {"kind": "kernel_kmeans", "k": k, "iterations": iterations, "epsilon": epsilon,
                                   "delta": 1.0 / records, "features": features,
                                   "public_sample": "MNIST t10k (public)"}})


def kernel_release(X, public, spec, rng: np.random.Generator):
    """What the `kernel_kmeans` kind publishes on the records X (CSR sets) with the public sample `public` (CSR):
    its own clustering (`tasks.kinds.kernel_kmeans.clustering`) through its plan, the noise simulated from `rng`
    (not private; `rng` is the public randomness too). Returns (feature map, clipping bound, released centres: the
    last iteration's, centres.parquet)."""
    from dpalgos.noise import simulated
    from tasks.kinds.kernel_kmeans import KIND, clustering
    from tasks.partitions import InMemory

    rff, _gamma, clip, res = clustering(spec, public, InMemory(X), simulated(KIND.bind(spec).plan, rng), rng)
    return rff, clip, res.trajectory[-1]


def released_labels(X, rff, clip: float, centres: np.ndarray) -> np.ndarray:
    """Every record's cluster by the release's published assignment rule (`assignment_rule.json`)."""
    from tasks.kinds.kernel_kmeans import partition_assignment

    return partition_assignment(X, rff, clip, centres)


def accuracy_table(X: np.ndarray, y: np.ndarray, public: np.ndarray, *, runs: int, seed: int, epsilons=EPSILONS,
                   dims=FEATURE_DIMS, plain: bool = True):
    """Acs et al. Figure 3: clustering accuracy (Hungarian matching) of DP kernel k-means (RBF, d random
    Fourier features, clip C_s = 1, no DPNorm) and of plain DP k-means on the raw records (clip by DPNorm),
    k = 10, 20 iterations, delta = 1/N, sigma calibrated to each epsilon with dp_accounting.
    Initial centres are random records of the PUBLIC set (the MNIST test split); gamma by the median
    heuristic on it. The kernel rows are the `kernel_kmeans` kind's release (`kernel_spec`, `kernel_release`),
    every record assigned by its published rule; the plain rows are the paper's baseline."""
    import pandas as pd
    import scipy.sparse as sp

    from dpalgos import kernel_kmeans as kk
    from dpalgos.noise import simulated

    delta = 1.0 / len(X)
    sets, public_sets = sp.csr_matrix(X), sp.csr_matrix(public)
    rng = np.random.default_rng(seed)
    rows = []
    for eps in epsilons:
        for d in dims:
            spec = kernel_spec(eps, d, len(X), items=X.shape[1])
            for run in range(runs):
                rff, clip, centres = kernel_release(sets, public_sets, spec, rng)
                rows.append({"method": f"kernel d={d}", "d": d, "epsilon": eps, "run": run,
                             "accuracy": kk.clustering_accuracy(released_labels(sets, rff, clip, centres), y)})
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
