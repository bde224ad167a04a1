"""A search right after a save, in a loop: what a search costs while its tenant's writes stream in (the full-text
index, the eligibility facts and the dense layout each catch up with the save before the search answers).

At a tenant of `--memories` memories, in-process through the ASGI app on a throwaway stack (api.bench.stack; no
Celery worker: the saves are not embedded, so the dense channel sees only the loaded memories), each pair is
one save and one question search; `--rounds` rounds of `--pairs` pairs after a warm-up. Printed per round: the
process's CPU per pair (`time.process_time`: the app, its threads and the test client, not PostgreSQL's), the
wall p50 of a pair, and the core.sql calls (round trips) a search made. With `--embed` the loaded memories get
vectors (the bench's embedder, COPYed in as `engram bench search` loads them) and each save embeds before it
answers (`sync_embed`), so the dense channel runs and catches its layout up with every save too. Run it for two
trees in turns (`--steps` adds the thread CPU a pair spends in a few steps of the search: eligibility's checks,
the facts' catch-up, full-text's searches and, inside them, the held docs'):

    PYTHONPATH=/path/to/other/tree python scripts/bench_search_under_writes.py
    python scripts/bench_search_under_writes.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

QUESTIONS = ("invoices in region 7", "orders of region 12", "what about note 55", "region 3 invoices and orders")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--embed", action="store_true", help="vectors for the memories, and saves that embed")
    parser.add_argument("--steps", action="store_true", help="thread CPU per pair in a few steps of the search")
    args = parser.parse_args()
    steps = _timed_steps() if args.steps else {}
    from fastapi.testclient import TestClient
    from sqlalchemy import text

    from api.app import create_app
    from api.bench.stack import bench_stack
    from core import sql
    from core.db import system_session
    from core.refs import memory_ref
    from core.tenancy.service import create_tenant

    with bench_stack(), TestClient(create_app()) as client:
        with system_session() as session:
            headers = {"Authorization": f"Bearer {create_tenant(session, name='bench').api_key}"}
        contents = [f"note {i} about orders and invoices in region {i % 50}" for i in range(args.memories)]
        loaded: list[tuple[str, str, str]] = []
        for start in range(0, args.memories, 1000):
            items = [{"content": content} for content in contents[start : start + 1000]]
            answer = client.post("/v1/memories:batch", json={"items": items}, headers=headers).json()
            loaded += [
                (memory_ref(r["memory_id"]), "memory", c["content"])
                for r, c in zip(answer["results"], items, strict=True)
            ]
        if args.embed:
            from api.bench.corpus import load_embeddings

            with system_session() as session:
                tenant_id = session.execute(text("SELECT id FROM tenants WHERE name = 'bench'")).scalar_one()
            load_embeddings(tenant_id=tenant_id, docs=loaded)
        with system_session() as session:
            session.execute(text("ANALYZE"))  # (the state autovacuum brings a loaded table to)
        calls = [0]
        real = sql._exchange

        def counted(*given: Any) -> Any:
            calls[0] += 1
            return real(*given)

        sql._exchange = counted  # type: ignore[assignment]
        count = iter(range(10**9))

        def pair() -> int:
            n = next(count)
            body = {"content": f"note {uuid.uuid4().hex} about region {n % 50}", "sync_embed": args.embed}
            assert client.post("/v1/memories", json=body, headers=headers).status_code == 201
            before = calls[0]
            response = client.post("/v1/search", json={"question": QUESTIONS[n % 4]}, headers=headers)
            assert response.status_code == 200, response.text
            return calls[0] - before

        for _ in range(50):
            pair()
        for round_ in range(args.rounds):
            walls: list[float] = []
            trips: list[int] = []
            cpu_start = time.process_time()
            for step in steps:
                steps[step] = 0.0
            for _ in range(args.pairs):
                started = time.perf_counter()
                trips.append(pair())
                walls.append((time.perf_counter() - started) * 1000)
            cpu_ms = (time.process_time() - cpu_start) * 1000 / args.pairs
            figure = {
                "round": round_,
                "cpu_ms_per_pair": round(cpu_ms, 3),
                "wall_p50_ms": round(statistics.median(walls), 3),
                "search_sql_calls": statistics.median(trips),
                **{f"{step}_ms": round(spent * 1000 / args.pairs, 3) for step, spent in steps.items()},
            }
            print(json.dumps(figure), flush=True)


def _timed_steps() -> dict[str, float]:
    """Wrap a few of the search's steps to add up the thread CPU spent in them (per step name, in seconds)."""
    from core.search.delta import Delta
    from core.search.facts import TenantFacts
    from core.search.filters import Eligibility
    from core.search.fulltext import FulltextIndex

    spent: dict[str, float] = {}
    for name, owner, attribute in (
        ("eligibility", Eligibility, "check"),
        ("facts_catch_up", TenantFacts, "catch_up"),
        ("fulltext", FulltextIndex, "search"),
        ("held_docs", Delta, "search"),
    ):
        spent[name] = 0.0
        real = getattr(owner, attribute)

        def timed(*given: Any, _real: Any = real, _name: str = name, **named: Any) -> Any:
            started = time.thread_time()
            try:
                return _real(*given, **named)
            finally:
                spent[_name] += time.thread_time() - started

        setattr(owner, attribute, timed)
    return spent


if __name__ == "__main__":
    main()
