"""OpenDP's exact samplers against DP-SGD's per-step volume: values per second of each sampler (the one the
release kinds use for every published measurement) and the seconds one DP-SGD step would take with them.

    python tests/benchmarks/opendp_throughput.py [--values 100000]

Last line: RESULT <sampler>=<values/s> ... cdr_step_s=<s> retail_step_s=<s>
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dpalgos.noise import ExactNoise  # noqa: E402
from dpalgos.plan import Mechanism  # noqa: E402


#: Gaussians per DP-SGD step (10 VAEs, hidden 200, 2-D latent): weights and biases of encoder and decoder.
def vae_parameters(items: int, hidden: int = 200, latent: int = 2) -> int:
    return items * hidden + hidden + 2 * (hidden * latent + latent) + latent * hidden + hidden + hidden * items + items


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--values", type=int, default=100_000)
    args = ap.parse_args()
    rates = {}
    for dist in ("laplace", "gaussian"):
        for integer in (True, False):
            m = Mechanism("m", "q", dist, 1.0, "a", 5.0, integer=integer)
            noise = ExactNoise()
            noise.add(m, np.zeros(10), 5.0)  # build the measurement outside the timing
            t0 = time.perf_counter()
            noise.add(m, np.zeros(args.values), 5.0)
            rates[f"{'discrete' if integer else 'float'}_{dist}"] = args.values / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    np.random.default_rng().normal(size=args.values)
    rates["numpy_normal"] = args.values / (time.perf_counter() - t0)
    steps = {"cdr": 10 * vae_parameters(1303), "retail": 10 * vae_parameters(16470)}
    for name, r in rates.items():
        print(f"{name:18s} {r:14,.0f} values/s")
    for name, n in steps.items():
        print(f"{name}: {n:,} Gaussians per DP-SGD step -> {n / rates['float_gaussian']:,.0f} s with OpenDP, "
              f"{n / rates['numpy_normal']:.3f} s with numpy")
    print("RESULT " + " ".join(f"{k}={v:.0f}" for k, v in rates.items()) + " " +
          " ".join(f"{k}_step_s={n / rates['float_gaussian']:.0f}" for k, n in steps.items()))


if __name__ == "__main__":
    main()
