"""MST (McKenna et al. 2021) and AIM (McKenna et al. 2022), both from the `dpmm` package, as peers of DPGM: run by
tests/benchmarks/dpgm_counting.py in their own interpreter (`dpmm` pins numpy and pandas versions the project's
venv must not get).

    <python with dpmm> _dpmm_peer.py MODEL IN.npy OUT.npy EPSILON DELTA SEED ITERATIONS

MODEL: mst or aim. IN: (n, d) 0/1 records; OUT: the model's synthetic records, as many as its own noisy total.
ITERATIONS: the mirror-descent iterations of every estimation (MST estimates once; AIM, warm-started, after
each of its rounds: 16 d rounds at most, dpmm's default, with the 2-way workload of every pair of columns).
"""

import sys
import time

import numpy as np
import pandas as pd
from dpmm.models.aim import AIMGM
from dpmm.models.mst import MSTGM

MODELS = {"mst": MSTGM, "aim": AIMGM}


def main() -> None:
    name, src, dst, epsilon, delta, seed, iterations = sys.argv[1:8]
    X = np.load(src)
    columns = [f"i{j}" for j in range(X.shape[1])]
    t0 = time.perf_counter()
    model = MODELS[name](epsilon=float(epsilon), delta=float(delta), domain={c: 2 for c in columns},
                         n_iters=int(iterations), n_jobs=1, random_state=np.random.RandomState(int(seed)))
    model.fit(pd.DataFrame(X.astype(np.int64), columns=columns))
    np.save(dst, model.generate()[columns].to_numpy().astype(np.uint8))
    print(f"{name.upper()}: fitted and sampled in {time.perf_counter() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
