"""A search's statements are compiled once per shape of its filters (which filters are set, the caller's
visibility shape), not once per tenant, agent or filter value: those are their parameters. Keyed by value, the
process's cache of compiled statements thrashed once a few hundred tenants searched (a compile of the graph's
statement costs ~1 ms), and every new agent of a tenant compiled its own."""

from __future__ import annotations

from core import sql
from tests.helpers.api import ids, save, search

# The statements whose form follows the search's filters (core.search.filters.MemoryFilter.shape).
SHAPED = {"graph", "entity_bm25", "ordered", "eligibility", "hits", "replies"}


def _shaped_keys() -> set[object]:
    return {key for key in list(sql._cache) if (key[0] if isinstance(key, tuple) else key) in SHAPED}


def _tenant_with_agents(client, make_tenant):  # type: ignore[no-untyped-def]
    tenant = make_tenant("shapes")
    made = {}
    for agent, kind in (("a1", "decision"), ("a2", "fact")):
        # Each agent's own daily note (agent-scoped: only that agent sees it) of its own kind.
        made[agent] = save(
            client, tenant, {"content": f"alpha plan of {agent}", "kind": kind, "category": "daily", "agent_id": agent}
        )
    made["shared"] = save(
        client, tenant, {"content": "alpha plan for everyone", "kind": "decision", "category": "workspace"}
    )
    return tenant, made


def test_searches_of_other_tenants_and_agents_reuse_the_compiled_statements_and_get_their_own_answers(
    client, make_tenant
):
    tenants = [_tenant_with_agents(client, make_tenant) for _ in range(3)]
    before = _shaped_keys()
    first: set[object] = set()
    for number, (tenant, made) in enumerate(tenants):
        for agent, kind, expected in (
            ("a1", "decision", {made["a1"], made["shared"]}),  # its own decision and the shared one
            ("a2", "fact", {made["a2"]}),  # its own fact only
        ):
            body = {"question": "alpha plan", "agent_id": agent, "kind": kind, "max_entities": 0}
            assert set(ids(search(client, tenant, body)["memories"])) == expected
            # The entity channel (a memory named) and the recency ordering under the same filters.
            named = {**body, "entities": [f"memory:{made['shared']}"]}
            assert set(ids(search(client, tenant, named)["memories"])) == expected
            recent = {"mode": "recent", "agent_id": agent, "kind": kind}
            assert set(ids(search(client, tenant, recent)["memories"])) == expected
        if number == 0:
            first = _shaped_keys() - before
    # Whatever the first tenant's searches compiled (nothing, when earlier tests left it in the cache), the other
    # tenants' and agents' searches compiled nothing more.
    assert _shaped_keys() - before - first == set()
