"""An entity search naming memories (``memory:<id>``) reads them with its head and the entity channel's query,
its tokens taken as if every named memory existed (core.search.service's _named_with_the_head): it answers
exactly as when it read them in a round trip before, missing, forgotten and unseen memories included."""

from __future__ import annotations

from typing import Any

from core.search import service
from tests.helpers.api import save, search
from tests.helpers.events import sql_calls


def test_named_memories_read_with_the_head_answer_as_when_read_before_it(client, tenant, monkeypatch):
    mine = save(client, tenant, {"content": "the crate ledger is closed on fridays", "agent_id": "a"})
    theirs = save(client, tenant, {"content": "the crate ledger of agent b", "agent_id": "b"})
    gone = save(client, tenant, {"content": "an old crate ledger note"})
    assert client.delete(f"/v1/memories/{gone}", headers=tenant.headers()).status_code == 200
    for n in range(6):
        targets = [mine, theirs, gone][: 1 + n % 3]
        save(
            client,
            tenant,
            {"content": f"crate ledger follow-up {n}", "linked_entities": [f"memory:{t}" for t in targets]},
        )
    named = {"mine": f"memory:{mine}", "theirs": f"memory:{theirs}", "gone": f"memory:{gone}"}
    cases = [
        [named["mine"]],
        [named["mine"], named["theirs"]],
        ["memory:nosuchmemory", named["mine"]],
        [named["gone"]],
        [named["theirs"], "nosuch.table"],
        [named["mine"], named["mine"]],
    ]
    answers: dict[bool, list[dict[str, Any]]] = {}
    for ahead in (False, True):
        monkeypatch.setattr(service, "NAMED_AHEAD", ahead)
        answers[ahead] = [
            search(client, tenant, {"entities": entities, **extra})
            for entities in cases
            for extra in ({}, {"agent_id": "a"}, {"question": "crate ledger"}, {"agent_id": "a", "max_entities": 3})
        ]
    assert answers[True] == answers[False]
    assert any(a["warnings"] for a in answers[True]) and any(a["memories"] for a in answers[True])

    # One round trip less: the named memories go with the head and the entity channel's query.
    for ahead, trips in ((False, 3), (True, 2)):
        monkeypatch.setattr(service, "NAMED_AHEAD", ahead)
        with sql_calls(tenant.tenant_id) as seen:
            search(client, tenant, {"entities": [named["mine"]]})
        assert len(seen) == trips, seen
    # A named memory that is not there: its token goes and the channel ranks again (the round trip saved is spent).
    with sql_calls(tenant.tenant_id) as seen:
        out = search(client, tenant, {"entities": [named["mine"], "memory:nosuchmemory"]})
    assert len(seen) == 3 and out["resolved_input_entities"] == [named["mine"]]
