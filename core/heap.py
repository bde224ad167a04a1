"""The garbage collector of a long-lived engram process (the API's, a worker's).

Two settings, each measured under the load mix (`engram bench load --clients 50`, one API process):

- What the process loaded before serving lives as long as it does: ``gc.freeze()`` moves it out of the
  collector's sight, so a full collection no longer walks those ~170,000 objects (it stopped every request for
  ~50-100 ms every few seconds; in a worker, three quarters less time in the collector over a run of embed jobs).
- The youngest generation is collected after YOUNG_THRESHOLD net allocations instead of CPython's 700. A request
  allocates thousands of container objects that all die when it ends, but with a dozen requests running at
  once a collection every 700 found most of them alive, walked them and moved them on to the older generations
  to be walked again: ~2,300 young collections in 40 s of the mix took 4% of the API's CPU (0.36 ms each). At
  20,000 the same run collects ~25 times (0.3 s of collector time against 1.6 s) and the API's CPU per request
  fell by 8-12% in turns. Cyclic garbage waits a little longer: at most that many objects.
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
