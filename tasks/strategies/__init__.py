"""The data-independent strategies the `histogram` kind measures range workloads with: HDMM's p-Identity strategy
for all ranges of n bins (`dpalgos.hdmm`), by the public number of bins only.

Where a strategy comes from, in order: shipped with the package (`hdmm/*.npz`, every power of two from 16 to 4,096
bins, made by `python -m tasks.strategies`: their optimisation takes up to about 15 minutes of one core at 4,096
bins), the operator's cache ($XDG_CACHE_HOME/dprelease/strategies, written the first time another size is asked
for), or `dpalgos.hdmm.optimise` now (then cached). All three are the same deterministic optimisation from the
public seed `SEED`; and a release commits the strategy it measured with beside its measurements, so its
postprocessing never depends on recomputing it. Nothing here reads data: the strategies are public.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from dpalgos import hdmm

SEED = 0
#: The most bins an optimised strategy is used for: its p x n matrix (p = n / 16) and the optimisation's O(n p^2)
#: steps grow quickly (4,096 bins: 256 x 4,096, about 0.2 s a step, 3,000 steps); above it the tree is measured.
MAX_BINS = 4096
SHIPPED = tuple(2 ** k for k in range(4, 13))
_HERE = Path(__file__).resolve().parent / "hdmm"


def _name(n: int, p: int) -> str:
    return f"pidentity-allranges-n{n}-p{p}-seed{SEED}.npz"


def cache_folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dprelease" / "strategies"


def located(n: int) -> Path | None:
    """Where the strategy for n bins already is (shipped, or in the operator's cache), or None."""
    name = _name(n, hdmm.default_rows(n))
    for folder in (_HERE, cache_folder()):
        if (folder / name).is_file():
            return folder / name
    return None


def optimise_seconds(n: int) -> float:
    """A public estimate of optimising the strategy for n bins (about 3,000 steps of 4 n p^2 flops at 10^9 a second),
    0 where it is shipped or cached."""
    return 0.0 if located(n) is not None else 3000 * 4.0 * n * hdmm.default_rows(n) ** 2 / 1e9


def pidentity(n: int) -> np.ndarray:
    """B of the p-Identity strategy for all ranges of n bins (p = n / 16): shipped, cached, or optimised now. A cached
    B that is not `hdmm.sane` (written before the optimiser checked its runs) is optimised again."""
    path = located(n)
    if path is not None:
        with np.load(path) as f:
            B = f["B"].astype(np.float64)
        if hdmm.sane(B):
            return B
    B = hdmm.optimise(n, seed=SEED).B
    _save(cache_folder() / _name(n, hdmm.default_rows(n)), B)
    return B


def _save(path: Path, B: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    np.savez_compressed(tmp, B=B)
    os.replace(tmp, path)


def main(argv: list[str]) -> None:
    """Optimise and write the shipped strategies (all of SHIPPED, or the sizes given)."""
    for n in [int(a) for a in argv] or SHIPPED:
        result = hdmm.optimise(n, seed=SEED)
        _save(_HERE / _name(n, hdmm.default_rows(n)), result.B)
        print(f"n={n} p={hdmm.default_rows(n)}: loss {result.loss:.6g} (identity {hdmm.identity_loss(n):.6g}), "
              f"{result.iterations} steps, {result.starts} start(s), {result.seconds:.0f} s", flush=True)
