"""What scoring a full-text index's held docs costs a question (core.search.delta), at a few delta sizes.

A delta of `--held` docs in the load mix's vocabulary (every doc matches the question's words, the worst case),
searched as a question's full-text searches are: one per doc kind (memories, example queries, the catalog's
kinds), scored once for the first and read from the delta's kept scores by the others. Printed per size: the
thread CPU of a question's three searches when it scores (`scored_ms`) and when every search finds its scores
kept (`kept_ms`), medians of `--rounds` rounds of `--questions` questions. No database: the delta alone. Run it
for two trees in turns:

    PYTHONPATH=/path/to/other/tree python scripts/bench_fulltext_delta.py
    python scripts/bench_fulltext_delta.py
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--held", default="60,250,512", help="delta sizes, comma-separated")
    parser.add_argument("--questions", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from core.search.delta import Bm25Stats, Delta
    from core.search.fulltext import DocChange

    kinds = [frozenset({"memory"}), frozenset({"example_query"}), frozenset({"datasource", "table", "column"})]
    terms = ["invoices", "region", "7"]
    stats = Bm25Stats(docs=10_000, average_length=9.0)
    # (Trees before the limit was passed to the delta take none.)
    limited = {"limit": 90} if "limit" in inspect.signature(Delta.search).parameters else {}
    for held in (int(size) for size in args.held.split(",")):
        changes = [
            DocChange(
                doc_id=f"memory:{n:032x}",
                doc_kind="memory",
                text=f"note {n:x} about orders and invoices in region {n % 50}",
                deleted=False,
                seq=n + 1,
            )
            for n in range(held)
        ]
        delta = Delta(0, 0).merged(changes, upto_seq=held, analyze=str.split, in_reader=lambda _: False)

        def question(reader: int, delta: Delta = delta) -> None:
            for doc_kinds in kinds:
                delta.search(terms, doc_freq=lambda _: 5000, stats=stats, doc_kinds=doc_kinds, reader=reader, **limited)

        scored, kept = [], []
        for _ in range(args.rounds):
            started = time.thread_time()
            for n in range(args.questions):
                question(n)  # a reader not seen before: scored afresh, once a question
            scored.append((time.thread_time() - started) * 1000 / args.questions)
            started = time.thread_time()
            for _ in range(args.questions):
                question(-1)
            kept.append((time.thread_time() - started) * 1000 / args.questions)
        figure = {
            "held": held,
            "scored_ms": round(statistics.median(scored), 3),
            "kept_ms": round(statistics.median(kept), 3),
        }
        print(json.dumps(figure), flush=True)


if __name__ == "__main__":
    main()
