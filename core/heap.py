"""The garbage collector of a long-lived engram process (the API's, a worker's).

Two settings, each measured under the load mix (`engram bench load --clients 50`, one API process):

- What the process loaded before serving lives as long as it does: ``gc.freeze()`` moves it out of the
  collector's sight, so a full collection no longer walks those ~170,000 objects (it stopped every request for
  ~50-100 ms every few seconds; in a worker, three quarters less time in the collector over a run of embed jobs).
- The youngest generation is collected after YOUNG_THRESHOLD net allocations instead of CPython's 700. A request
  allocates thousands of container objects that all die when it ends, but with a dozen requests running at
  once a collection every 700 found most of them alive, walked them and moved them on to the older generations
  to be walked again: ~2,300 young collections in 40 s of the mix took 1.6 s of the API's ~38 s of CPU in the
  collector (all generations: 4.2%). At 20,000 it took 0.4 s (1.1%; at 5,000 0.5 s, at 2,000 0.9 s); the longest
  pause, a full collection, is ~0.2 s of wall time with either. Cyclic garbage waits a little longer: at most that
  many objects.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000


def settle_heap() -> None:
    """Collect, freeze what is left (the process's start-up heap), and collect the young generation less often."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
