"""Thread pools of the numerical libraries under dask.

A dask worker runs `nthreads` tasks at once, and inside each task OpenBLAS / MKL (numpy, scipy), OpenMP
(scikit-learn) and numba would each start a pool as large as the machine: workers x threads x library threads
would exceed the cores many times over and the passes would slow down by contention. The rule here: on a host
whose dask workers hold T threads in all, every library pool gets max(1, cores // T) threads. dask supplies
the parallelism of the data passes (one partition per task); the fused Lloyd kernels (`dpalgos.lloyd`) are
serial for that reason.

`limit_threads(client)` registers `ThreadLimits` on the client: the scheduler installs it on every worker,
present and future, of a local cluster or of an external scheduler (workers started with `dask worker`), so
external deployments need nothing beyond the project installed on their workers (which the partition
functions already need). In-process workers (a local cluster without processes) run in the driver process,
so the limits then also hold for the driver's own numerical work. A worker process's limits are set for the
libraries it has loaded (threadpoolctl) and, through the environment, for those it loads later (the
variables are read when a library starts). A worker process started by a nanny already has
OMP/MKL/OPENBLAS_NUM_THREADS=1 (distributed's `nanny.pre-spawn-environ`); numba's pool is never started,
because no kernel of this project is compiled with parallel=True.
"""

from __future__ import annotations

import os
import sys
from collections import Counter

from distributed.comm.addressing import get_address_host
from distributed.diagnostics.plugin import WorkerPlugin

#: Variables the libraries read when they start: OpenMP, OpenBLAS, MKL, Accelerate, numexpr, numba.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS",
                    "NUMEXPR_NUM_THREADS", "NUMBA_NUM_THREADS")
#: numba re-reads its variable at every compilation and fails every one after it changed once its pool has
#: started: it is only set before numba is imported.
NUMBA_VARIABLE = "NUMBA_NUM_THREADS"


def host_cores() -> int:
    """Cores this process may run on (its CPU affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def library_threads(cores: int, dask_threads: int) -> int:
    """Threads per library pool so that pools x dask threads on the host stay within its cores."""
    return max(1, cores // max(1, dask_threads))


def apply_limits(threads: int) -> None:
    """Limit this process's library pools to `threads` (an operator's lower setting is kept)."""
    import threadpoolctl

    for var in THREAD_VARIABLES:
        if var == NUMBA_VARIABLE and "numba" in sys.modules:
            continue
        current = os.environ.get(var, "")
        if not (current.isdigit() and 0 < int(current) <= threads):
            os.environ[var] = str(threads)
    over = {pool["prefix"]: threads for pool in threadpoolctl.threadpool_info() if pool["num_threads"] > threads}
    threadpoolctl.threadpool_limits(limits=over)


class ThreadLimits(WorkerPlugin):
    """Applies `library_threads` on each worker, for the dask threads of all workers on its host."""
    name = "dprelease-thread-limits"

    def __init__(self, threads_by_host: dict[str, int]):
        self.threads_by_host = dict(threads_by_host)

    def setup(self, worker) -> None:
        # A worker on a host unknown at registration counts its own threads only.
        host_threads = self.threads_by_host.get(get_address_host(worker.address), worker.state.nthreads)
        apply_limits(library_threads(host_cores(), host_threads))


def threads_by_host(client) -> dict[str, int]:
    """Dask threads of the client's current workers, summed per host."""
    counts: Counter = Counter()
    for address, info in client.scheduler_info()["workers"].items():
        counts[get_address_host(address)] += info["nthreads"]
    return dict(counts)


def limit_threads(client) -> dict[str, int]:
    """Register `ThreadLimits` on the client's cluster; returns the dask threads per host it used."""
    hosts = threads_by_host(client)
    client.register_plugin(ThreadLimits(hosts))
    return hosts
