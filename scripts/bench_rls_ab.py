"""What row-level security costs, A/B in one process: the same searches and saves alternate between the old
path (the schema owner, a superuser that RLS does not bind, no per-transaction setting) and the new one
(the app role under the forced policies, `set_config` at each transaction's start), with a middle
variant (the owner with the `set_config`, which rides on `BEGIN`, but no policy) that splits the cost in
two. docs/benchmarks.md has the figures and what each statement costs.

Alternating call by call puts both paths under the same machine load, which on shared cores moves wall
figures by 2x between separate runs. Usage (a throwaway embedded stack, as `engram bench search`):

    python scripts/bench_rls_ab.py --memories 10000 --entities 1000 --queries 200
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import create_engine, event
from sqlalchemy.orm import Session, sessionmaker

import core.db as db
from api.bench.search import MODES, Corpus, build
from api.bench.stack import bench_stack
from core.config import reset_settings_cache


@contextmanager
def path(variant: str, owner: sessionmaker[Session]) -> Iterator[None]:
    """`old`: owner sessions, no per-transaction setting (before RLS); `hook`: owner sessions with the
    setting (its round trip, no policy: a superuser bypasses RLS); `new`: the service as it runs."""
    saved = db._factory
    if variant != "new":
        db._factory = owner
    if variant == "old":
        event.remove(Session, "after_begin", db._set_transaction_tenant)
    try:
        yield
    finally:
        db._factory = saved
        if variant == "old":
            event.listen(Session, "after_begin", db._set_transaction_tenant)


def timed(call: Callable[[], Any]) -> float:
    started = time.perf_counter()
    call()
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--entities", type=int, default=1_000)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()

    from core.memories.schemas import SaveMemoryIn
    from core.memories.service import save_memory
    from core.search.schemas import SearchRequest
    from core.search.service import search
    from core.tenancy.context import Caller

    with bench_stack():
        os.environ.setdefault("ENGRAM_SECRET_KEY", base64.urlsafe_b64encode(os.urandom(32)).decode())
        reset_settings_cache()
        corpus: Corpus = build(memories=args.memories, entities=args.entities, log=print)
        owner_engine = create_engine(db.owner_database_url(), pool_size=4)
        event.listen(owner_engine, "connect", db._plan_each_statement)
        owner = sessionmaker(bind=owner_engine, expire_on_commit=False)
        caller = Caller(
            tenant_id=corpus.tenant_id,
            tenant_name="bench-search",
            user="bench@localhost",
            role="member",
            key_id="bench",
            agent_id="agent-1",
        )

        def run_search(request: SearchRequest) -> None:
            with db.tenant_session(corpus.tenant_id) as session:
                search(session, caller=caller, request=request)

        def run_save(text: str) -> None:
            with db.tenant_session(corpus.tenant_id) as session:
                save_memory(session, caller=caller, item=SaveMemoryIn(content=text))

        rng = random.Random(11)
        run_search(SearchRequest(**MODES["question"](corpus, rng)))  # builds the full-text index
        cases: list[tuple[str, Callable[[int], Callable[[], None]]]] = [
            (f"search {mode}", lambda i, mode=mode: lambda r=SearchRequest(**MODES[mode](corpus, rng)): run_search(r))
            for mode in MODES
        ]
        cases.append(("save", lambda i: lambda: run_save(f"a/b note {i} on revenue {random.random()}")))
        variants = ("old", "hook", "new")
        print(
            f"{'case':<18} {'old p50':>9} {'+set_config':>12} {'+policies':>10} {'change':>8}"
            f" {'old p95':>9} {'new p95':>9}"
        )
        for name, make in cases:
            ms: dict[str, list[float]] = {v: [] for v in variants}
            for i in range(args.queries + 10):
                call = make(i)
                # Rotate which variant goes first, so none always meets the warmest cache.
                for variant in variants[i % 3 :] + variants[: i % 3]:
                    with path(variant, owner):
                        elapsed = timed(call)
                    if i >= 10:  # warm-up
                        ms[variant].append(elapsed)
            p50 = {v: statistics.median(ms[v]) for v in variants}
            p95 = {v: sorted(ms[v])[int(len(ms[v]) * 0.95)] for v in variants}
            change = (p50["new"] / p50["old"] - 1) * 100
            print(
                f"{name:<18} {p50['old']:>8.2f}ms {p50['hook']:>10.2f}ms {p50['new']:>8.2f}ms {change:>+7.1f}%"
                f" {p95['old']:>8.2f}ms {p95['new']:>8.2f}ms"
            )
        owner_engine.dispose()


if __name__ == "__main__":
    main()
