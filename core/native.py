"""Native thread pools: engram runs its work one request or job per thread, so BLAS runs on one thread.

numpy's OpenBLAS splits each product over every core and spin-waits its helper threads. Searches and jobs
already run side by side with each other, PostgreSQL and the API on few cores, so the split only burns CPU
they need (measured on 2 cores: a search's matrix-vector product 1.6 ms on one thread, 5 ms split; an embed
job's similarity product less wall time and a third less CPU). An explicit OPENBLAS_NUM_THREADS wins.
"""

from __future__ import annotations

import os
import threading

from threadpoolctl import threadpool_limits

_done = False
_lock = threading.Lock()


def single_threaded_blas() -> None:
    """Hold BLAS to one thread in this process (once; respects OPENBLAS_NUM_THREADS / OMP_NUM_THREADS)."""
    global _done
    with _lock:
        if _done:
            return
        _done = True
    if "OPENBLAS_NUM_THREADS" in os.environ or "OMP_NUM_THREADS" in os.environ:
        return
    threadpool_limits(limits=1, user_api="blas")
