"""MST (McKenna et al. 2021, the `dpmm` package) as a peer of DPGM: run by tests/benchmarks/dpgm_counting.py in
its own interpreter (`dpmm` pins numpy and pandas versions the project's venv must not get).

    <python with dpmm> _mst_peer.py IN.npy OUT.npy EPSILON DELTA SEED ITERATIONS

IN: (n, d) 0/1 records; OUT: MST's synthetic records, as many as its own noisy total.
"""

import sys
import time

import numpy as np
import pandas as pd
from dpmm.models.mst import MSTGM


def main() -> None:
    src, dst, epsilon, delta, seed, iterations = sys.argv[1:7]
    X = np.load(src)
    columns = [f"i{j}" for j in range(X.shape[1])]
    t0 = time.perf_counter()
    model = MSTGM(epsilon=float(epsilon), delta=float(delta), domain={c: 2 for c in columns},
                  n_iters=int(iterations), n_jobs=1, random_state=np.random.RandomState(int(seed)))
    model.fit(pd.DataFrame(X.astype(np.int64), columns=columns))
    np.save(dst, model.generate()[columns].to_numpy().astype(np.uint8))
    print(f"MST: fitted and sampled in {time.perf_counter() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
