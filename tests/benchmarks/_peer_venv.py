"""The peers' own interpreters: each benchmark peer runs in a venv of its own, created on first use in a cache
folder with pinned versions, so that a fresh clone runs `kmeans_peers.py`, `contingency_peers.py` and
`dpgm_counting.py --peers mst,aim` with no argument beyond the data (and the Tumult Analytics helpers of
`_tumult_peer.py`).

Why a venv per peer: their dependencies conflict with the pipeline's (dpmm pins numpy 1.26 and opendp 0.12,
diffprivlib 0.6.6 fails to import with scikit-learn 1.9, mbi pulls jax) and with each other.

Cache folder: $DPRELEASE_BENCH_CACHE, else $XDG_CACHE_HOME/dprelease-bench, else ~/.cache/dprelease-bench; one
folder per peer and pin set, `<peer>-<version>/`. A venv is created with the interpreter running the benchmark
(`python -m venv`), its pins installed with pip from the ordinary package index, and a file `pins.txt` written
last: a folder without it (an interrupted install) is removed and made again. Delete a folder to rebuild it.
An explicit interpreter (--mst-python, --peer-python, --mbi-python) is used as given and nothing is created.

    python tests/benchmarks/_peer_venv.py [mst|diffprivlib|mbi|tumult ...]     # create (or show) the peers' venvs
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Peer:
    """A peer package and the pins of its venv, each with the reason for its version."""
    name: str
    version: str
    pins: dict[str, str]          # requirement -> why this version
    imports: str                  # a module the venv must import (checked after the install)

    @property
    def folder_name(self) -> str:
        return f"{self.name}-{self.version}"


PEERS = {
    "mst": Peer("mst", "dpmm-0.1.9", {
        "dpmm==0.1.9": "MST of McKenna et al. 2021 as the DPGM benchmark has run it since it was added (the release "
                       "whose figures README quotes), and AIM (McKenna et al. 2022) from the same release "
                       "(tests/benchmarks/_dpmm_peer.py); dpmm itself pins numpy 1.26 and opendp 0.12, which is "
                       "why it cannot share the pipeline's venv",
    }, "dpmm.models.mst, dpmm.models.aim"),
    "diffprivlib": Peer("diffprivlib", "0.6.6-sklearn-1.6.1", {
        "diffprivlib==0.6.6": "the latest release (2025-04); the k-means peer figures were measured with it",
        "scikit-learn==1.6.1": "diffprivlib 0.6.6 fails to import with scikit-learn 1.9 (it imports private "
                               "helpers that moved) and runs with 1.6-1.8; 1.6.1 is the version it was measured "
                               "with",
    }, "diffprivlib.models"),
    "mbi": Peer("mbi", "2.0.0", {
        "mbi==2.0.0": "Private-PGM (McKenna et al.), the version of the project's `bench` extra; its mirror-descent "
                      "estimation is the contingency benchmark's peer (early-stopped at 3,000 iterations and "
                      "converged at 20,000)",
    }, "mbi"),
    "tumult": Peer("tumult", "0.21.0-pyspark-3.5.9", {
        "tmlt.analytics==0.21.0": "Tumult Analytics, the newest release; it runs here with the machine's Java 17 "
                                  "(histogram counts and means of tests/benchmarks/_tumult_peer.py); it and "
                                  "tmlt.core 0.19 pin numpy<2 and pandas<2 on Python 3.11, which the pipeline's "
                                  "venv has moved past",
        "pyspark==3.5.9": "on Python 3.11 tmlt.analytics 0.21 requires pyspark>=3.4,<3.6 (Spark 4 only from "
                          "Python 3.12); 3.5.9 is the newest 3.5 release and Spark 3.5 supports Java 17",
    }, "tmlt.analytics"),
}


def cache_root() -> Path:
    env = os.environ.get("DPRELEASE_BENCH_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "dprelease-bench"


def _python_in(folder: Path) -> Path:
    return folder / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def ensure(name: str, *, log=print) -> str:
    """The interpreter of the peer's venv, created (and its pins installed) on first use."""
    peer = PEERS[name]
    folder = cache_root() / peer.folder_name
    stamp = folder / "pins.txt"
    python = _python_in(folder)
    if stamp.exists() and python.exists():
        return str(python)
    if folder.exists():  # an interrupted install: start again
        shutil.rmtree(folder)
    log(f"creating the {name} peer's venv in {folder} (first use; pins: {', '.join(peer.pins)})", flush=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *peer.pins], check=True)
    subprocess.run([str(python), "-c", f"import {peer.imports}"], check=True)
    frozen = subprocess.run([str(python), "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout
    stamp.write_text("".join(f"# {req}: {why}\n" for req, why in peer.pins.items()) + frozen)
    return str(python)


def interpreter(name: str, given: str | None, *, log=print) -> str:
    """`given` if the user named an interpreter, else the cached venv's (created on first use)."""
    return given if given else ensure(name, log=log)


if __name__ == "__main__":
    for peer_name in sys.argv[1:] or list(PEERS):
        print(peer_name, ensure(peer_name))
