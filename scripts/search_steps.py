"""Where a search's CPU goes, step by step: thread CPU around each step of the search service, per search.

    python scripts/search_steps.py [--mode hybrid] [--searches 300] [--memories 10000] [--entities 1000]
        [--pause-ms 0]

Builds the `engram bench search` tenant on a throwaway stack, warms every mode, then times `--searches`
generated searches of `--mode` with `time.thread_time_ns` around the steps of core.search.service and the
parts of the dense and full-text channels named below (their wrappers cost ~1 µs a call). A step's figure
includes the steps it calls: `open_channels` holds the entity channel's round trip and the full-text searches
run while it is out; `sql.run_many` holds what runs meanwhile. CPU of this thread only: PostgreSQL's is not in it.
`--pause-ms` idles the process that long before each search, as an API process that is not kept busy idles between
requests: the same searches then cost more CPU (docs/benchmarks.md, Processes).
"""

from __future__ import annotations

import argparse
import base64
import functools
import importlib
import os
import statistics
import sys
import time
from collections import Counter
from typing import Any

# What is timed: (module, attribute path, label).
STEPS = (
    ("core.search.service", "run_search", "run_search"),
    ("core.search.service", "open_channels", "open_channels"),
    ("core.search.service", "_entity_bm25", "  entity channel (its round trip, full-text meanwhile)"),
    ("core.search.service", "memory_candidates", "memory_candidates"),
    ("core.search.service", "eligible_candidates", "eligible_candidates"),
    ("core.search.service", "fuse", "fuse"),
    ("core.search.service", "relevance", "  fusion: relevance"),
    ("core.search.service", "with_hops", "  fusion: graph hops"),
    ("core.search.service", "hydrate", "hydrate"),
    ("core.sql", "run_many", "sql.run_many (with what runs meanwhile)"),
    ("core.search.fulltext", "FulltextIndex.search", "full-text: searches"),
    ("core.search.dense", "DenseSearch._exact_rank", "dense: exact rankings"),
    ("core.search.dense", "DenseSearch._product", "  dense: the memories' product"),
    ("core.search.dense", "refined_top", "  dense: the rows that could rank, scored exactly"),
    ("core.search.dense", "DenseSearch._query_for", "  dense: feedback query"),
    ("core.search.dense", "top_rows", "  dense: top rows"),
    ("core.search.dense", "DenseSearch._above_floor", "  dense: similarity floor"),
)


def _timed(spent: Counter[str], label: str, function: Any) -> Any:
    @functools.wraps(function)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time_ns()
        try:
            return function(*args, **kwargs)
        finally:
            spent[label] += time.thread_time_ns() - started

    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", default="hybrid", choices=("hybrid", "question", "entities"))
    parser.add_argument("--searches", type=int, default=300)
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--entities", type=int, default=1_000)
    parser.add_argument("--pause-ms", type=float, default=0.0, help="idle this long before each timed search")
    args = parser.parse_args()
    os.environ.setdefault("ENGRAM_SECRET_KEY", base64.urlsafe_b64encode(os.urandom(32)).decode())
    from api.bench import machine_speed_ms
    from api.bench.search import MODES, build, measure_answers
    from api.bench.stack import bench_stack
    from core.config import reset_settings_cache

    reset_settings_cache()
    spent: Counter[str] = Counter()
    for module_name, path, label in STEPS:
        owner: Any = importlib.import_module(module_name)
        *parents, name = path.split(".")
        for parent in parents:
            owner = getattr(owner, parent)
        setattr(owner, name, _timed(spent, label, getattr(owner, name)))
    with bench_stack():
        corpus = build(memories=args.memories, entities=args.entities, log=lambda m: print(m, file=sys.stderr))
        for mode in MODES:
            measure_answers(corpus, mode=mode, queries=30)  # (the index opened, the matrix read, the facts loaded)
        spent.clear()
        started = time.monotonic()
        _, cpu, _ = measure_answers(corpus, mode=args.mode, queries=args.searches, seed=1, pause=args.pause_ms / 1000)
        took = time.monotonic() - started
    print(f"python_loop_ms {machine_speed_ms():.1f}")
    p50, mean = statistics.median(cpu), statistics.fmean(cpu)
    paused = f", {args.pause_ms:g} ms idle before each" if args.pause_ms else ""
    print(f"{args.mode}: {args.searches} searches{paused}, CPU p50 {p50:.3f} ms, mean {mean:.3f}, in {took:.2f} s")
    for _, _, label in STEPS:
        print(f"{label:55s} {spent[label] / args.searches / 1000:8.1f} µs a search")


if __name__ == "__main__":
    main()
