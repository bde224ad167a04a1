"""Several API replicas against one PostgreSQL and Redis, as a hosted deployment runs them.

Two `engram api` processes with separate homes (so separate full-text index directories and per-process
caches), two workers and beat share the suite's database and broker. Rules checked here:
- a save acknowledged by one replica is found, ranked first for its own words, by a search on the other
  at once (every per-process cache catches up from the database's change sequence);
- `kill -9` of one replica under load loses no acknowledged write, and the other keeps answering;
- deleting a replica's index directory while it runs costs latency, never answers;
- `engram api --workers 2` on one home: its processes share one index directory without failing requests.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.helpers.processes import REPO, WorkerProcess, answers_health, stop_process, wait_for


class Replica:
    """One `engram api` process with a home of its own."""

    def __init__(self, stack, base: Path, name: str, *, workers: int = 1):  # type: ignore[no-untyped-def]
        from api.serve.embedded import free_port

        self.home = base / name
        self.home.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(base / f"{name}.log", "wb")  # noqa: SIM115
        env = {**os.environ, **stack.env, "ENGRAM_HOME": str(self.home)}
        args = ["api", "--port", str(self.port), "--no-migrate", "--workers", str(workers)]
        self.process = subprocess.Popen(
            [sys.executable, "-m", "api.cli", *args], cwd=REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        wait_for(lambda: answers_health(self.url), timeout=60)

    def stop(self) -> None:
        stop_process(self.process)
        self._log.close()


class Deployment:
    def __init__(self, stack, base: Path):  # type: ignore[no-untyped-def]
        self.stack = stack
        self.base = base
        self.replicas: list[Replica] = []
        self.workers: list[WorkerProcess] = []
        self.beat: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.replicas = [Replica(self.stack, self.base, "a"), Replica(self.stack, self.base, "b")]
        self.workers = [WorkerProcess(self.stack, concurrency=1), WorkerProcess(self.stack, concurrency=1)]
        beat_log = open(self.base / "beat.log", "wb")  # noqa: SIM115
        env = {**os.environ, **self.stack.env, "ENGRAM_HOME": str(self.base / "beat-home")}
        self.beat = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "beat"], cwd=REPO, env=env, stdout=beat_log, stderr=subprocess.STDOUT
        )

    def stop(self) -> None:
        for replica in self.replicas:
            replica.stop()
        for worker in self.workers:
            worker.stop()
        if self.beat is not None:
            stop_process(self.beat)


@pytest.fixture(scope="module")
def deployment(stack) -> Iterator[Deployment]:  # type: ignore[no-untyped-def]
    base = Path(tempfile.mkdtemp(prefix="engram-replicas-", dir="/tmp"))
    base.chmod(0o755)
    deployed = Deployment(stack, base)
    try:
        deployed.start()
        yield deployed
    finally:
        deployed.stop()
        shutil.rmtree(base, ignore_errors=True)


def _headers(make_tenant) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return make_tenant("replica").headers()


def _search_ids(url: str, headers: dict[str, str], question: str) -> list[str]:
    response = httpx.post(f"{url}/v1/search", json={"question": question}, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    return [hit["id"] for hit in response.json()["memories"]]


def test_a_save_through_one_replica_is_ranked_first_by_the_other_at_once(deployment, make_tenant):
    a, b = deployment.replicas
    headers = _headers(make_tenant)
    for i in range(20):
        body = {"content": f"invoice run {i}: totals are reconciled against the ledger every night"}
        assert httpx.post(f"{a.url}/v1/memories", json=body, headers=headers, timeout=30).status_code == 201
    _search_ids(b.url, headers, "ledger totals")  # B builds its per-tenant state before the new save
    token = f"zq{uuid.uuid4().hex[:8]}"
    body = {"content": f"the {token} export reconciles invoice totals with the ledger"}
    saved = httpx.post(f"{a.url}/v1/memories", json=body, headers=headers, timeout=30)
    assert saved.status_code == 201, saved.text
    assert _search_ids(b.url, headers, f"{token} export")[0] == saved.json()["memory_id"]


def _embedded(url: str, headers: dict[str, str]) -> bool:
    """Whether every memory of the tenant has its vector (the dense channel then ranks them all)."""
    response = httpx.get(f"{url}/v1/ops/coverage", headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    rows = [r for r in response.json()["coverage"] if r["doc_kind"] == "memory"]
    return bool(rows) and all(r["ratio"] == 1.0 for r in rows)


def test_an_index_directory_deleted_under_a_running_replica_costs_latency_not_answers(deployment, make_tenant):
    _, b = deployment.replicas
    headers = _headers(make_tenant)
    for i in range(10):
        body = {"content": f"warehouse {i} ships parcels with carrier number {1000 + i}"}
        assert httpx.post(f"{b.url}/v1/memories", json=body, headers=headers, timeout=30).status_code == 201
    # The vectors land in the background: compare the two searches with the same vectors.
    wait_for(lambda: _embedded(b.url, headers), timeout=60)
    before = _search_ids(b.url, headers, "carrier 1007 parcels")
    shutil.rmtree(b.home / "index")
    after = _search_ids(b.url, headers, "carrier 1007 parcels")
    assert after == before and before


def test_killing_a_replica_under_load_loses_no_acknowledged_write(deployment, make_tenant):
    """Four clients save and search through both replicas for a bounded time; replica A is killed with
    SIGKILL midway. Every save either replica acknowledged is readable afterwards, and B never stops
    answering (only requests in flight to A may fail)."""
    a, b = deployment.replicas
    headers = _headers(make_tenant)
    acknowledged: list[str] = []
    b_failures: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + 8
    killed = threading.Event()

    def client(n: int) -> None:
        with httpx.Client(timeout=10) as http:
            i = 0
            while time.monotonic() < stop_at:
                i += 1
                replica = a if (i + n) % 2 else b
                if replica is a and killed.is_set():
                    replica = b
                try:
                    if i % 3 == 0:
                        r = http.post(f"{replica.url}/v1/search", json={"question": "load note"}, headers=headers)
                        ok = r.status_code == 200
                    else:
                        body = {"content": f"load note {n}-{i}"}
                        r = http.post(f"{replica.url}/v1/memories", json=body, headers=headers)
                        ok = r.status_code == 201
                        if ok:
                            with lock:
                                acknowledged.append(r.json()["memory_id"])
                except httpx.HTTPError as exc:
                    ok, r = False, None
                    if replica is b:
                        b_failures.append(repr(exc))
                if not ok and replica is b and r is not None:
                    b_failures.append(f"{r.status_code} {r.text[:200]}")

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(3)
    os.kill(a.process.pid, signal.SIGKILL)
    killed.set()
    for thread in threads:
        thread.join(timeout=30)
    assert not b_failures, b_failures[:5]
    assert len(acknowledged) > 20
    with httpx.Client(timeout=10) as http:
        missing = [
            memory_id
            for memory_id in acknowledged
            if http.get(f"{b.url}/v1/memories/{memory_id}", headers=headers).status_code != 200
        ]
    assert missing == []


def test_two_api_processes_on_one_home_share_its_index_directory(stack, make_tenant, tmp_path):
    """`engram api --workers 2`: both processes use one index directory; concurrent saves and searches
    all succeed and each save is found by the next search, whichever process answers it."""
    base = Path(tempfile.mkdtemp(prefix="engram-api2-", dir="/tmp"))
    base.chmod(0o755)
    replica = Replica(stack, base, "home", workers=2)
    headers = _headers(make_tenant)
    failures: list[str] = []

    def client(n: int) -> None:
        with httpx.Client(base_url=replica.url, timeout=30) as http:
            for i in range(15):
                token = f"zz{n}x{i}y{uuid.uuid4().hex[:6]}"
                saved = http.post("/v1/memories", json={"content": f"note {token} kept"}, headers=headers)
                if saved.status_code != 201:
                    failures.append(f"save {saved.status_code} {saved.text[:200]}")
                    continue
                found = http.post("/v1/search", json={"question": token}, headers=headers)
                if found.status_code != 200:
                    failures.append(f"search {found.status_code} {found.text[:200]}")
                elif [h["id"] for h in found.json()["memories"]][:1] != [saved.json()["memory_id"]]:
                    failures.append(f"{token} not first: {found.json()}")

    try:
        threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert failures == []
    finally:
        replica.stop()
        shutil.rmtree(base, ignore_errors=True)
