"""CPU per search when searches spread over many tenants and agents, in-process on a throwaway embedded stack:
each of `--tenants` tenants holds `--memories` short notes (shared ones and each agent's own), and `--searches`
question searches go to a random tenant as a random one of `--agents` agents (and of each agent's `--users` end
users, each with a key of their own), after every tenant has been searched (its full-text index and caches warm).
With `--save-every K`, every K-th search is preceded by a save in its tenant (its caches then catch up). Prints
the CPU p50 and mean of a search (this process's: PostgreSQL's is apart) and how many statements core.sql
compiled per search.

    python scripts/bench_search_tenants.py --tenants 400 --agents 10
    python scripts/bench_search_tenants.py --tenants 20 --agents 4 --users 10 --memories 2000 --save-every 1

A hosted engram serves many small tenants and many agents from one process: what a search costs must not grow
with how many there are (core.sql's compiled statements are keyed by the shape of a search's filters, not by
tenant or agent).
"""

from __future__ import annotations

import argparse
import base64
import os
import random
import statistics
import sys
import time
import uuid

WORDS = (
    "orders invoices refunds region customers revenue churn weekly monthly daily shipping returns latency errors "
    "quota plan"
).split()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=400)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--memories", type=int, default=30, help="per tenant")
    parser.add_argument("--searches", type=int, default=2000)
    parser.add_argument("--users", type=int, default=1, help="end users per agent, each with a key of its own")
    parser.add_argument("--save-every", type=int, default=0, help="a save before every K-th search (0: none)")
    args = parser.parse_args()
    os.environ.setdefault("ENGRAM_SECRET_KEY", base64.urlsafe_b64encode(os.urandom(32)).decode())
    from api.bench.stack import bench_stack
    from core.config import reset_settings_cache

    reset_settings_cache()
    with bench_stack():
        import core.sql
        from core.db import system_session, tenant_session
        from core.memories.schemas import SaveMemoryIn
        from core.memories.service import save_memories
        from core.search.schemas import SearchRequest
        from core.search.service import search
        from core.tenancy.context import Caller
        from core.tenancy.service import create_tenant, get_tenant_by_name

        def caller(tenant_id: int, agent: int, user: int = 0) -> Caller:
            return Caller(
                tenant_id=tenant_id, tenant_name="bench", user=f"user-{user}@localhost", role="member",
                key_id=f"key-{user}", agent_id=f"agent-{agent}",
            )  # fmt: skip

        rng = random.Random(7)
        tenants = []
        for _ in range(args.tenants):
            name = f"bench-{uuid.uuid4().hex[:10]}"
            with system_session() as session:
                create_tenant(session, name=name)
                tenant = get_tenant_by_name(session, name=name)
                assert tenant is not None
                tenants.append(tenant.id)
        for tenant_id in tenants:
            for agent in range(args.agents):
                share = args.memories // args.agents or 1
                category = "workspace" if agent == 0 else "daily"  # agent 0's notes are shared, the rest own
                items = [SaveMemoryIn(content=" ".join(rng.sample(WORDS, 5)), category=category) for _ in range(share)]
                with tenant_session(tenant_id) as session:
                    save_memories(session, caller=caller(tenant_id, agent), items=items)
        print(f"{args.tenants} tenants of {args.memories} memories made", file=sys.stderr)

        def one(tenant_id: int, agent: int, user: int = 0) -> float:
            request = SearchRequest(question=" ".join(rng.sample(WORDS, 3)), max_entities=0)
            started = time.process_time()
            with tenant_session(tenant_id) as session:
                search(session, caller=caller(tenant_id, agent, user), request=request)
            return (time.process_time() - started) * 1000

        searched = 0

        def next_search() -> float:
            nonlocal searched
            tenant_id, agent, user = rng.choice(tenants), rng.randrange(args.agents), rng.randrange(args.users)
            searched += 1
            if args.save_every and searched % args.save_every == 0:
                item = SaveMemoryIn(content=" ".join(rng.sample(WORDS, 5)), category="daily")
                with tenant_session(tenant_id) as session:
                    save_memories(session, caller=caller(tenant_id, agent, user), items=[item])
            return one(tenant_id, agent, user)

        for tenant_id in tenants:  # every tenant's index opened and caught up, its caches loaded
            one(tenant_id, 0)
        compiled = len(core.sql._cache)
        misses = 0
        built = core.sql._compiled

        def counting(key, build):  # type: ignore[no-untyped-def]
            nonlocal misses
            misses += key not in core.sql._cache
            return built(key, build)

        core.sql._compiled = counting  # type: ignore[assignment]
        cpu = [next_search() for _ in range(args.searches)]
        core.sql._compiled = built
        print(
            f"tenants {args.tenants} agents {args.agents} users {args.users} save every {args.save_every}: "
            f"search cpu p50 {statistics.median(cpu):.2f} ms, "
            f"mean {statistics.mean(cpu):.2f} ms; statements compiled per search {misses / args.searches:.2f} "
            f"(cache held {compiled} after the warm-up)"
        )


if __name__ == "__main__":
    main()
