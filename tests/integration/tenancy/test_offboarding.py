"""Offboarding with verified erasure (CONTRACT section 9, DELETE /v1/tenants/{name}), on the real stack: two
API replicas with homes of their own, Celery workers and beat.

Rules checked here:
- the tenant's keys answer 401 at once on every replica, and a purge job (a real worker) removes every row
  of the tenant from every table that has a ``tenant_id`` column (read from the live catalog, so a table
  added later is held to it), its vectors, and its full-text index and cached state on both replicas;
- the name can be created again at once, and the new tenant is empty;
- saves racing the offboarding from the revoked key are answered 200, or 401 (429 past the address's budget
  of bad keys), never 500, and leave nothing;
- the purge is idempotent, and finishes after the worker running it is killed midway.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from tests.helpers.api import OPERATOR_KEY, tenant_id_of
from tests.helpers.processes import REPO, WorkerProcess, make_temp_dir, running_api, stop_process, wait_for

OPERATOR = {"Authorization": f"Bearer {OPERATOR_KEY}"}
FAST_RECOVERY = {
    "ENGRAM_BROKER_VISIBILITY_TIMEOUT_SECONDS": "5",
    "ENGRAM_JOB_RUNNING_LEASE_SECONDS": "6",
    "ENGRAM_OUTBOX_REDISPATCH_SECONDS": "2",
    "ENGRAM_RECONCILE_INTERVAL_SECONDS": "1",
    # Small chunks: the purge of a few thousand rows takes many transactions, so a kill lands midway.
    "ENGRAM_PURGE_CHUNK_ROWS": "200",
}


class Deployment:
    """Two API replicas (their own homes), one worker, beat; all on the suite's database and Redis."""

    def __init__(self, stack, base: Path) -> None:  # type: ignore[no-untyped-def]
        self.stack = stack
        self.base = base
        self.homes = [base / "replica-a", base / "replica-b"]
        self._apis = [running_api({**stack.env, **FAST_RECOVERY, "ENGRAM_HOME": str(home)}) for home in self.homes]
        self.urls = [api.__enter__() for api in self._apis]
        worker_stack = type(stack)(**{**stack.__dict__, "env": {**stack.env, **FAST_RECOVERY}})
        self.worker_stack = worker_stack
        self.worker = WorkerProcess(worker_stack, concurrency=1)
        beat_log = open(base / "beat.log", "wb")  # noqa: SIM115
        env = {**os.environ, **stack.env, **FAST_RECOVERY, "ENGRAM_HOME": str(base / "beat-home")}
        self.beat = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "beat"], cwd=REPO, env=env, stdout=beat_log, stderr=subprocess.STDOUT
        )

    def stop(self) -> None:
        self.worker.stop()
        stop_process(self.beat)
        for api in self._apis:
            api.__exit__(None, None, None)


@pytest.fixture(scope="module")
def deployment(stack) -> Iterator[Deployment]:  # type: ignore[no-untyped-def]
    base = make_temp_dir("engram-offboard-")
    for home in ("replica-a", "replica-b", "beat-home"):
        (base / home).mkdir()
    running = Deployment(stack, base)
    try:
        yield running
    finally:
        running.stop()
        shutil.rmtree(base, ignore_errors=True)


def _provision(url: str, name: str) -> dict[str, str]:
    made = httpx.post(f"{url}/v1/tenants", json={"name": name}, headers=OPERATOR, timeout=30)
    assert made.status_code == 201, made.text
    return {"Authorization": f"Bearer {made.json()['api_key']}"}


def _left_behind(tenant_id: int) -> dict[str, int]:
    """Rows of the tenant in every table the live catalog lists with a tenant_id column, and its tenants row."""
    from core.db import system_session
    from core.tenancy.purge import left_behind

    with system_session() as session:
        return left_behind(session, tenant_id=tenant_id)


def _job(url: str, job_id: str) -> dict:  # type: ignore[type-arg]
    response = httpx.get(f"{url}/v1/jobs/{job_id}", headers=OPERATOR, timeout=30)
    assert response.status_code == 200, response.text
    return response.json()


def _fill(url: str, headers: dict[str, str], tmp: Path, *, memories: int = 60) -> None:
    """Memories (with revisions, links, associations), a key, a datasource with its catalog, usage."""
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        db = tmp / "shop.db"
        with sqlite3.connect(db) as source:
            source.execute("CREATE TABLE IF NOT EXISTS orders (id int, amount int, region text)")
            source.execute("INSERT INTO orders VALUES (1, 100, 'north')")
        assert http.post("/v1/datasources", json={"name": "shop", "url": f"sqlite:///{db}"}).status_code == 201
        ingest = http.post("/v1/datasources/shop/ingest", json={})
        assert ingest.status_code == 202
        items = [
            {"content": f"note {i}: orders.amount is in cents", "run_id": f"run-{i % 3}", "tags": ["units"]}
            for i in range(memories)
        ]
        assert http.post("/v1/memories:batch", json={"items": items}).status_code == 200
        assert http.patch("/v1/memories/1", json={"content": "revised note"}).status_code == 200
        linked = {"content": "linked", "associations": [{"target_id": "1"}]}
        assert http.post("/v1/memories", json=linked).status_code == 201
        assert http.post("/v1/keys", json={"user": "agent@example.com"}).status_code == 201
        wait_for(lambda: http.get(f"/v1/jobs/{ingest.json()['job_id']}").json()["state"] == "succeeded", timeout=60)


def _index_dir(home: Path, tenant_id: int) -> Path:
    return home / "index" / f"tenant-{tenant_id}"


def test_offboarding_erases_the_tenant_everywhere_and_frees_its_name(deployment, tmp_path):
    a, b = deployment.urls
    name = f"leaving-{os.urandom(4).hex()}"
    headers = _provision(a, name)
    tenant_id = tenant_id_of(name)
    _fill(a, headers, tmp_path)
    # Both replicas hold the tenant's index and caches; the worker embedded its memories.
    for url in (a, b):
        found = httpx.post(f"{url}/v1/search", json={"question": "amount in cents"}, headers=headers, timeout=30)
        assert found.status_code == 200 and found.json()["memories"]
    for home in deployment.homes:
        assert _index_dir(home, tenant_id).is_dir()
    wait_for(lambda: _left_behind(tenant_id).get("embeddings", 0) > 0, timeout=60)
    before = _left_behind(tenant_id)
    assert {"memories", "memory_versions", "api_keys", "embeddings", "catalog_datasources", "jobs"} <= set(before)

    offboarded = httpx.delete(f"{a}/v1/tenants/{name}", headers=OPERATOR, timeout=30)
    assert offboarded.status_code == 202
    job_id = offboarded.json()["job_id"]
    # Its keys stop at once: on the replica that took the call, and on the other one by its notification.
    assert httpx.get(f"{a}/v1/memories", headers=headers, timeout=30).status_code == 401
    wait_for(lambda: httpx.get(f"{b}/v1/memories", headers=headers, timeout=30).status_code == 401, timeout=5)
    # The name is free at once; the tenant object is gone from the operator's view.
    assert httpx.get(f"{a}/v1/tenants/{name}", headers=OPERATOR, timeout=30).status_code == 404

    wait_for(lambda: _job(a, job_id)["state"] == "succeeded", timeout=90)
    assert _left_behind(tenant_id) == {}
    for home in deployment.homes:
        wait_for(lambda home=home: not _index_dir(home, tenant_id).exists(), timeout=10)
    job = _job(a, job_id)
    assert job["kind"] == "purge_tenant" and job["payload"]["tenant"] == name
    assert "tenant_id" not in job["payload"] and job["result"]["rows_removed"] >= sum(before.values()) - 1

    again = _provision(b, name)
    assert tenant_id_of(name) != tenant_id
    for url in (a, b):
        assert httpx.get(f"{url}/v1/memories", headers=again, timeout=30).json()["memories"] == []
        found = httpx.post(f"{url}/v1/search", json={"question": "amount in cents"}, headers=again, timeout=30).json()
        assert found["memories"] == [] and found["entities"] == []


def test_saves_racing_the_offboarding_leave_nothing(deployment):
    a, b = deployment.urls
    name = f"racing-{os.urandom(4).hex()}"
    headers = _provision(a, name)
    tenant_id = tenant_id_of(name)
    statuses: list[int] = []
    stop = threading.Event()

    def save(url: str) -> None:
        with httpx.Client(base_url=url, headers=headers, timeout=30) as http:
            i = 0
            while not stop.is_set():
                items = [{"content": f"racing {i}.{j}"} for j in range(20)]
                statuses.append(http.post("/v1/memories:batch", json={"items": items}).status_code)
                i += 1

    savers = [threading.Thread(target=save, args=(url,)) for url in (a, b, a)]
    for saver in savers:
        saver.start()
    time.sleep(1.0)
    job_id = httpx.delete(f"{a}/v1/tenants/{name}", headers=OPERATOR, timeout=30).json()["job_id"]
    time.sleep(1.0)
    stop.set()
    for saver in savers:
        saver.join()
    # 429 once the revoked key's failures spend the address's budget of bad keys.
    assert set(statuses) <= {200, 401, 429} and 200 in statuses and 401 in statuses, sorted(set(statuses))
    wait_for(lambda: _job(a, job_id)["state"] == "succeeded", timeout=90)
    assert _left_behind(tenant_id) == {}


def test_the_purge_finishes_after_its_worker_is_killed_midway_and_runs_again_harmlessly(deployment, stack):
    a, _ = deployment.urls
    name = f"killed-{os.urandom(4).hex()}"
    headers = _provision(a, name)
    tenant_id = tenant_id_of(name)
    with httpx.Client(base_url=a, headers=headers, timeout=120) as http:
        for start in range(0, 4_000, 1000):
            items = [{"content": f"bulk memory {i} about the nightly load"} for i in range(start, start + 1000)]
            assert http.post("/v1/memories:batch", json={"items": items}).status_code == 200
    # Let the embedding backlog drain so the purge is the job the worker is running when it dies.
    wait_for(lambda: _pending_jobs(tenant_id) == 0, timeout=240, interval=0.5)
    total = _left_behind(tenant_id)["memories"]
    job_id = httpx.delete(f"{a}/v1/tenants/{name}", headers=OPERATOR, timeout=30).json()["job_id"]
    wait_for(lambda: 0 < _left_behind(tenant_id).get("memories", 0) < total, timeout=60, interval=0.02)
    for pid in [deployment.worker.process.pid, *_children(deployment.worker.process.pid)]:
        os.kill(pid, signal.SIGKILL)
    deployment.worker.stop()
    assert _left_behind(tenant_id), "the purge finished before the worker was killed"
    deployment.worker = WorkerProcess(deployment.worker_stack, concurrency=1)
    wait_for(lambda: _job(a, job_id)["state"] == "succeeded", timeout=120, interval=0.5)
    assert _left_behind(tenant_id) == {}
    # Run once more (as an at-least-once delivery would): nothing to do, nothing fails.
    from core.db import system_session
    from core.tenancy.purge import purge_tenant

    assert purge_tenant(system_session, tenant_id=tenant_id)["already_purged"] is True


def _pending_jobs(tenant_id: int) -> int:
    from core.db import system_session

    with system_session() as session:
        return int(
            session.execute(
                text("SELECT count(*) FROM jobs WHERE tenant_id = :t AND state IN ('queued', 'running')"),
                {"t": tenant_id},
            ).scalar_one()
        )


def _children(pid: int) -> list[int]:
    import psutil

    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
