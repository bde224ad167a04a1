"""Contract checks found missing by a black-box walk of CONTRACT.md (each test names the sentence it pins)."""

from __future__ import annotations

import os

from sqlalchemy.engine import make_url

from tests.helpers.catalog import create_and_ingest, sqlite_source


def test_an_unreachable_source_fails_the_ingest_job_on_its_first_attempt(client, tenant, tmp_path):
    """CONTRACT 5: "An unreachable source (missing SQLite file, ...) fails the job and changes nothing".

    With the server's real retry budget (not max_attempts=1), the job must read `failed` after one attempt,
    not sit `queued` in backoff for hours; a retry once the file is back then succeeds."""
    from core.config import get_settings
    from core.db import system_session
    from workers.runner import run_job

    with sqlite_source(tmp_path) as (url, schema):
        create_and_ingest(client, tenant, url=url, schema=schema)
        path = make_url(url).database
        assert path is not None
        os.rename(path, f"{path}.moved")
        response = client.post("/v1/datasources/shop/ingest", headers=tenant.headers())
        assert response.status_code == 202, response.text
        job_id = response.json()["job_id"]
        outcome = run_job(job_id, session_factory=system_session, max_attempts=get_settings().job_max_attempts)
        job = client.get(f"/v1/jobs/{job_id}", headers=tenant.headers()).json()
        assert outcome.state == "failed" and job["state"] == "failed", job
        assert job["attempts"] == 1 and "no SQLite database file" in job["error"], job
        assert not os.path.exists(path)
        os.rename(f"{path}.moved", path)
        retried = client.post(f"/v1/jobs/{job_id}/retry", headers=tenant.headers())
        assert retried.status_code in (200, 202), retried.text
        assert run_job(job_id, session_factory=system_session, max_attempts=1).state == "succeeded"


def test_concurrent_saves_without_id_get_distinct_consecutive_ids(client, tenant):
    """CONTRACT 4: an omitted id is "one more than the largest ... so an id is never handed out twice" —
    also when saves race each other (single saves and batches at once)."""
    from concurrent.futures import ThreadPoolExecutor

    def save(i: int) -> list[str]:
        if i % 4 == 0:
            body = {"items": [{"content": f"raced batch {i} {j}"} for j in range(3)]}
            response = client.post("/v1/memories:batch", json=body, headers=tenant.headers())
            assert response.status_code == 200, response.text
            return [item["memory_id"] for item in response.json()["results"]]
        response = client.post("/v1/memories", json={"content": f"raced {i}"}, headers=tenant.headers())
        assert response.status_code == 201, response.text
        return [response.json()["memory_id"]]

    with ThreadPoolExecutor(8) as pool:
        ids = [memory_id for chunk in pool.map(save, range(16)) for memory_id in chunk]
    assert sorted(int(i) for i in ids) == list(range(1, len(ids) + 1)), ids


def test_cursor_paging_walks_every_sort_completely_and_rejects_a_cursor_of_another_sort(client, tenant):
    """CONTRACT 4 list: `sort` (recent, importance, most_accessed) with `cursor` paging; null on the last page."""
    items = [{"content": f"paged {i}", "importance": (0.1, 0.5, 0.9)[i % 3]} for i in range(13)]
    assert client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers()).status_code == 200
    for memory_id in ("2", "2", "5"):
        assert client.get(f"/v1/memories/{memory_id}", headers=tenant.headers()).status_code == 200
    ordering = {"recent": "created_at", "importance": "importance", "most_accessed": "access_count"}
    for sort, key in ordering.items():
        full = client.get("/v1/memories", params={"sort": sort, "limit": 200}, headers=tenant.headers()).json()
        assert full["next_cursor"] is None and len(full["memories"]) == 13
        values = [memory[key] for memory in full["memories"]]
        assert values == sorted(values, reverse=True), (sort, values)
        walked: list[str] = []
        cursor = None
        while True:
            params = {"sort": sort, "limit": 4} | ({"cursor": cursor} if cursor else {})
            page = client.get("/v1/memories", params=params, headers=tenant.headers()).json()
            walked += [memory["id"] for memory in page["memories"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert walked == [memory["id"] for memory in full["memories"]], sort
    first = client.get("/v1/memories", params={"sort": "importance", "limit": 4}, headers=tenant.headers()).json()
    mixed = {"sort": "recent", "cursor": first["next_cursor"]}
    other = client.get("/v1/memories", params=mixed, headers=tenant.headers())
    assert other.status_code == 400 and other.json()["error"]["field"] == "cursor", other.text
