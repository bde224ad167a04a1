"""What row-level security costs, A/B in one process: the same searches and saves alternate between the old
path (the schema owner, a superuser that RLS does not bind, no per-transaction setting) and the new one
(the app role under the forced policies, `set_config` at each transaction's start).

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
from core.bench.search import MODES, Corpus, build
from core.bench.stack import bench_stack
from core.config import reset_settings_cache


@contextmanager
def old_path(owner: sessionmaker[Session]) -> Iterator[None]:
    """Sessions of the owner engine, without the hook that names the tenant to PostgreSQL."""
    saved = db._factory
    event.remove(Session, "after_begin", db._set_transaction_tenant)
    db._factory = owner
    try:
        yield
    finally:
        db._factory = saved
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
        print(f"{'case':<18} {'old p50':>9} {'new p50':>9} {'change':>8} {'old p95':>9} {'new p95':>9}")
        for name, make in cases:
            old_ms: list[float] = []
            new_ms: list[float] = []
            for i in range(args.queries + 10):
                call = make(i)
                if i % 2:  # alternate which path goes first, so neither always meets the warmer cache
                    new = timed(call)
                with old_path(owner):
                    old = timed(call)
                if not i % 2:
                    new = timed(call)
                if i >= 10:  # warm-up
                    old_ms.append(old)
                    new_ms.append(new)
            old_p50, new_p50 = statistics.median(old_ms), statistics.median(new_ms)
            old_p95, new_p95 = (sorted(v)[int(len(v) * 0.95)] for v in (old_ms, new_ms))
            change = (new_p50 / old_p50 - 1) * 100
            print(
                f"{name:<18} {old_p50:>8.2f}ms {new_p50:>8.2f}ms {change:>+7.1f}% {old_p95:>8.2f}ms {new_p95:>8.2f}ms"
            )
        owner_engine.dispose()


if __name__ == "__main__":
    main()
