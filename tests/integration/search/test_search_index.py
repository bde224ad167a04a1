"""The persistent full-text index across processes: read-your-writes, no writer-lock fights, rebuilds."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from tests.helpers.api import ids, save, search
from tests.helpers.processes import REPO

_WORKER = textwrap.dedent(
    """
    import sys
    from core.db import tenant_session
    from core.memories.schemas import SaveMemoryIn
    from core.memories.service import save_memory
    from core.search.schemas import SearchRequest
    from core.search.service import search
    from core.tenancy.context import Caller

    tenant_id, name, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    caller = Caller(tenant_id=tenant_id, tenant_name="t", user="admin@localhost", role="admin", key_id="k")
    for i in range(rounds):
        word = f"{name}word{i}x"
        with tenant_session(tenant_id) as session:
            item = SaveMemoryIn(content=f"note about {word}")
            mid = save_memory(session, caller=caller, item=item).memory_id
        with tenant_session(tenant_id) as session:
            found = search(session, caller=caller, request=SearchRequest(question=word))
        assert [h.id for h in found.memories] == [mid], (word, found)
    print("ok")
    """
)


def test_processes_read_their_writes_concurrently(client, tenant, stack):
    """Several processes save and immediately search the same tenant's index: each finds its own write,
    none fails on tantivy's writer lock, and this process then sees every write."""
    env = {**os.environ, **stack.env}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(tenant.tenant_id), f"p{n}", "8"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for n in range(3)
    ]
    for proc in procs:
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0 and out.strip().endswith("ok"), out
    for n in range(3):
        for i in range(8):
            assert len(search(client, tenant, {"question": f"p{n}word{i}x"})["memories"]) == 1


def test_write_in_another_process_is_found_here(client, tenant, stack):
    """A memory saved by another process is found by this process's next search (its index handle is open)."""
    save(client, tenant, {"content": "warm up the index handle"})
    assert search(client, tenant, {"question": "zebra"})["memories"] == []
    env = {**os.environ, **stack.env}
    done = subprocess.run(
        [sys.executable, "-c", _WORKER, str(tenant.tenant_id), "zebra", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(search(client, tenant, {"question": "zebraword0x"})["memories"]) == 1


def test_purge_and_patch_reach_the_index(client, tenant):
    """Tombstones (purge) and updates (patch) are applied by the catch-up."""
    mid = save(client, tenant, {"content": "alpha bravo"})
    assert ids(search(client, tenant, {"question": "bravo"})["memories"]) == [mid]
    response = client.patch(f"/v1/memories/{mid}", json={"content": "charlie delta"}, headers=tenant.headers())
    assert response.status_code == 200
    assert search(client, tenant, {"question": "bravo"})["memories"] == []
    assert ids(search(client, tenant, {"question": "charlie"})["memories"]) == [mid]
    assert client.delete(f"/v1/memories/{mid}?purge=true", headers=tenant.headers()).status_code == 200
    assert search(client, tenant, {"question": "charlie"})["memories"] == []


def test_entity_tags_and_tags_are_searchable(client, tenant):
    """Full-text indexes a memory's tags next to its content."""
    mid = save(client, tenant, {"content": "plain words", "tags": ["seasonality"]})
    assert ids(search(client, tenant, {"question": "seasonality"})["memories"]) == [mid]


def test_run_neighbours_lend_their_words(client, tenant):
    """A memory of a run is indexed with its neighbours' text, so an answer turn is found by the question's words;
    saving a new turn updates its neighbours' docs."""
    run = {"run_id": "chat-1", "category": "workspace"}
    asked = save(client, tenant, {"content": "Did you visit the aquarium?", **run})
    answer = save(client, tenant, {"content": "Yes, last Friday with my kids!", **run})
    save(client, tenant, {"content": "The aquarium opens at nine", "run_id": "chat-2"})
    found = ids(search(client, tenant, {"question": "kids aquarium", "max_memories": 10})["memories"])
    assert set(found[:2]) == {asked, answer}
    later = save(client, tenant, {"content": "They loved the sharks", **run})
    assert later in ids(search(client, tenant, {"question": "kids", "max_memories": 10})["memories"])
    assert answer in ids(search(client, tenant, {"question": "sharks", "max_memories": 10})["memories"])


def test_hnsw_path_agrees_with_exact(client, tenant, monkeypatch):
    """Above dense_exact_max_docs the dense channel asks pgvector's HNSW index; on a small corpus it agrees
    with exact cosine, per bucket."""
    from core.config import get_settings

    texts = [
        "refunds for broken parcels",
        "shipping delays in winter",
        "discount codes for students",
        "tax rules for exports",
        "customer churn by region",
    ]
    for text in texts:
        save(client, tenant, {"content": text, "sync_embed": True})
    save(client, tenant, {"content": "revenue by month", "query": {"measures": ["revenue"]}, "sync_embed": True})
    body = {"question": "parcel refund", "max_memories": 5, "max_example_queries": 1}
    exact = search(client, tenant, body)
    monkeypatch.setattr(get_settings(), "dense_exact_max_docs", 0)
    approximate = search(client, tenant, body)
    assert approximate["channels"]["dense"] is True
    assert ids(approximate["memories"]) == ids(exact["memories"])
    assert ids(approximate["example_queries"]) == ids(exact["example_queries"])
