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
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers.api import OPERATOR_KEY, scrape
from tests.helpers.processes import REPO, WorkerProcess, answers_health, stop_process, wait_for


class Replica:
    """One `engram api` process with a home of its own."""

    def __init__(  # type: ignore[no-untyped-def]
        self, stack, base: Path, name: str, *, workers: int = 1, env: dict[str, str] | None = None
    ):
        from api.serve.embedded import free_port

        self.home = base / name
        self.home.mkdir()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(base / f"{name}.log", "wb")  # noqa: SIM115
        env = {**os.environ, **stack.env, "ENGRAM_HOME": str(self.home), **(env or {})}
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

    def replace(self, replica: Replica) -> None:
        """A new replica (a fresh home) in place of one a test stopped or killed, for the tests after it."""
        replica.stop()
        self.replicas[self.replicas.index(replica)] = Replica(
            self.stack, self.base, f"{replica.home.name}-{uuid.uuid4().hex[:6]}"
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
    deployment.replace(a)  # (the tests after this one have two replicas again)
    assert not b_failures, b_failures[:5]
    assert len(acknowledged) > 20
    with httpx.Client(timeout=10) as http:
        missing = [
            memory_id
            for memory_id in acknowledged
            if http.get(f"{b.url}/v1/memories/{memory_id}", headers=headers).status_code != 200
        ]
    assert missing == []


def test_two_api_processes_on_one_home_share_its_index_directory(stack, make_tenant):
    """`engram api --workers 2`, one tenant with keys owned by both processes: both use one index directory;
    concurrent saves and searches all succeed and each save is found by the next search."""
    from api.serve.routed import owner

    with _routed(stack, workers=2) as replica:
        admin = _headers(make_tenant)
        by_owner: dict[int, list[str]] = {0: [], 1: []}
        while min(len(keys) for keys in by_owner.values()) < 2:  # two keys served by each process
            (key,) = _keys(replica.url, admin, 1)  # not used yet: routed by its hash, not its tenant
            by_owner[owner(key.encode(), 2)].append(key)
        keys = [*by_owner[0][:2], *by_owner[1][:2]]
        failures: list[str] = []

        def client(n: int) -> None:
            headers = {"Authorization": f"Bearer {keys[n]}"}
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

        threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert failures == []


def _serving_pid(router: int, port: int) -> int | None:
    """The process of `router`'s tree that holds the server side of the client connection from ``port``."""
    import psutil

    for process in psutil.Process(router).children():
        for connection in process.net_connections(kind="tcp"):
            if connection.raddr and connection.raddr.port == port:
                return process.pid
    return None


def _fresh_connection_pid(url: str, router: int, headers: dict[str, str], path: str = "/v1/memories?limit=1") -> int:
    """Send one request on a new connection and say which API process answered it."""
    import socket

    with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as conn:
        lines = [f"GET {path} HTTP/1.1", "Host: engram", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        conn.sendall("\r\n".join(lines).encode())
        status = conn.recv(65536).split(b"\r\n", 1)[0]
        # (429: the suite's earlier invalid keys spent this address's budget of failed lookups.)
        assert status.split()[1] in (b"200", b"401", b"429"), status
        pid = _serving_pid(router, conn.getsockname()[1])
    assert pid is not None
    return pid


@contextmanager
def _routed(  # type: ignore[no-untyped-def]
    stack, workers: int, per_tenant: int | None = None, env: dict[str, str] | None = None
) -> Iterator[Replica]:
    """`engram api --workers N` on a home of its own (each tenant served by ``per_tenant`` of the processes,
    unset: the default), stopped and removed after."""
    base = Path(tempfile.mkdtemp(prefix="engram-routed-", dir="/tmp"))
    base.chmod(0o755)
    env = dict(env or {})
    if per_tenant is not None:
        env["ENGRAM_API_PROCESSES_PER_TENANT"] = str(per_tenant)
    replica = Replica(stack, base, "home", workers=workers, env=env)
    try:
        yield replica
    finally:
        replica.stop()
        shutil.rmtree(base, ignore_errors=True)


def _tenant_process(replica: Replica, headers: dict[str, str]) -> int:
    """The process that serves a key's connections once the router has learned the key's tenant."""
    _fresh_connection_pid(replica.url, replica.process.pid, headers)  # (its hash's process tells the router)
    return _fresh_connection_pid(replica.url, replica.process.pid, headers)


def _keys(url: str, admin: dict[str, str], count: int) -> list[str]:
    keys = []
    for n in range(count):
        issued = httpx.post(f"{url}/v1/keys", json={"user": f"agent{n}@example.com", "role": "member"}, headers=admin)
        assert issued.status_code == 201, issued.text
        keys.append(issued.json()["api_key"])
    return keys


def _process_index(pid: int) -> int:
    import psutil

    return int(psutil.Process(pid).environ()["ENGRAM_API_PROCESS"])


def test_routed_processes_serve_each_tenant_from_one_process(stack, make_tenant):
    """`engram api --workers 3` with one process a tenant: a key's first connection goes to the process its hash
    names, which tells the router the key's tenant; from then on every connection of every key of that tenant
    goes to the tenant's process, so one process does a tenant's per-change work. Connections without a key go
    to each in turn."""
    import psutil

    from api.serve.routed import owner

    with _routed(stack, workers=3, per_tenant=1) as replica:
        router = replica.process.pid
        tenants = [make_tenant("routed") for _ in range(3)]
        keys = {t.tenant_id: [t.admin_key, *_keys(replica.url, t.headers(), 3)] for t in tenants}
        for tenant_keys in keys.values():
            for key in tenant_keys[1:]:  # not used yet (issued with the admin key)
                first = _fresh_connection_pid(replica.url, router, {"Authorization": f"Bearer {key}"})
                assert _process_index(first) == owner(key.encode(), 3)
        for tenant_id, tenant_keys in keys.items():
            for key in tenant_keys * 2:
                pid = _fresh_connection_pid(replica.url, router, {"Authorization": f"Bearer {key}"})
                assert _process_index(pid) == tenant_id % 3
        anonymous = {_fresh_connection_pid(replica.url, router, {}, "/healthz") for _ in range(6)}
        assert sorted(_process_index(pid) for pid in anonymous) == [0, 1, 2]
        # Each process is told how many share the host (`--workers`, not the environment, said 3): it runs its
        # share of the host's requests at once (core.config: Settings.api_inflight).
        assert {psutil.Process(pid).environ()["ENGRAM_API_WORKERS"] for pid in anonymous} == {"3"}
        # A key no process knows is answered (401) where its hash says, and teaches the router nothing.
        stranger = "egk_nobody"
        for _ in range(2):
            pid = _fresh_connection_pid(replica.url, router, {"Authorization": f"Bearer {stranger}"})
            assert _process_index(pid) == owner(stranger.encode(), 3)


def test_a_busy_tenant_is_served_by_two_routed_processes_in_turn_and_a_sharing_one_by_one(stack, make_tenant):
    """`engram api --workers 3` as it comes: a tenant alone on the API takes a second process, its new connections
    going in turn to the process its id names and the next one (so one busy tenant can use two cores), and what
    one of them saved the other finds at once; a tenant that then has no more than its share of the connections
    stays on its one process. No third process serves either."""
    with _routed(stack, workers=3) as replica:
        router = replica.process.pid
        busy, sharing = make_tenant("routed-busy"), make_tenant("routed-sharing")
        headers = busy.headers()
        _fresh_connection_pid(replica.url, router, headers)  # (its hash's process tells the router)
        served = [_process_index(_fresh_connection_pid(replica.url, router, headers)) for _ in range(6)]
        assert set(served) == {busy.tenant_id % 3, (busy.tenant_id + 1) % 3}, served
        assert all(a != b for a, b in zip(served, served[1:], strict=False)), served  # in turn
        # Read-your-writes across the pair: each save is found at once by a search on the next connection, which
        # (the connections going in turn, as above) the other process serves.
        for i in range(4):
            token = f"pair{i}q{uuid.uuid4().hex[:6]}"
            with httpx.Client(base_url=replica.url, headers=headers, timeout=30) as http:
                saved = http.post("/v1/memories", json={"content": f"note {token} kept"})
            assert saved.status_code == 201, saved.text
            with httpx.Client(base_url=replica.url, headers=headers, timeout=30) as http:
                found = http.post("/v1/search", json={"question": token})
            assert found.status_code == 200, found.text
            assert [h["id"] for h in found.json()["memories"]][:1] == [saved.json()["memory_id"]]
        headers = sharing.headers()
        _fresh_connection_pid(replica.url, router, headers)
        served = [_process_index(_fresh_connection_pid(replica.url, router, headers)) for _ in range(6)]
        assert set(served) == {sharing.tenant_id % 3}, served


def test_every_routed_process_answers_metrics_with_the_requests_of_all_of_them(stack, make_tenant):
    """GET /metrics is answered by whichever process its connection reached (the operator key's, by its hash):
    it counts the requests every process answered, through prometheus_client's multiprocess mode in a directory
    the router makes for them and removes when it stops."""
    import psutil

    with _routed(stack, workers=2) as replica:
        router = replica.process.pid
        headers = make_tenant("routed-metrics").headers()
        served = {_fresh_connection_pid(replica.url, router, headers) for _ in range(5)}
        assert len(served) == 2, served  # (a tenant alone on the API: both processes, in turn)
        directories = {psutil.Process(pid).environ()["PROMETHEUS_MULTIPROC_DIR"] for pid in served}
        assert len(directories) == 1
        counted = []
        for _ in range(2):
            with httpx.Client(base_url=replica.url, timeout=30) as http:
                answered = scrape(http)["engram_http_requests_total"]
            counted.append(answered.get((("method", "GET"), ("route", "/v1/memories"), ("status", "200")), 0.0))
        assert counted == [5.0] * 2, counted  # (each process answered some of the five: both were counted)
    assert not Path(directories.pop()).exists()


def test_usage_read_through_one_routed_process_counts_the_requests_the_other_served(stack, make_tenant):
    """Each process counts its requests in memory and writes them every ENGRAM_USAGE_FLUSH_SECONDS (an hour here):
    the process that answers a read of usage first has the others write theirs (api.serve.routed), so the count
    is every request of the tenant, whichever process served it."""
    with _routed(stack, workers=2, env={"ENGRAM_USAGE_FLUSH_SECONDS": "3600"}) as replica:
        tenant = make_tenant("routed-usage")
        served = [_fresh_connection_pid(replica.url, replica.process.pid, tenant.headers()) for _ in range(6)]
        assert len(set(served)) == 2, served
        answers = []
        for _ in range(2):
            with httpx.Client(base_url=replica.url, headers=tenant.headers(), timeout=30) as http:
                read = http.get("/v1/usage")
            assert read.status_code == 200, read.text
            answers.append(read.json()["usage"]["requests"])
        operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
        described = httpx.get(f"{replica.url}/v1/tenants/{tenant.name}", headers=operator, timeout=30)
        assert described.status_code == 200, described.text
    assert answers == [7, 8], answers  # (the six, then each read counted by its own process)
    assert described.json()["usage"]["requests"] == 8


def test_a_key_revoked_through_one_replica_is_refused_by_the_other_long_before_its_cache_expires(
    deployment, make_tenant
):
    """Replicas do not know each other: the other replica drops the key's cached caller when the database's
    notification (NOTIFY engram_tenants, api.tenant_events) reaches it, within milliseconds, not when its cached
    entry expires (api.auth's 5 s): it was cached just before the revocation, so a refusal within a second is the
    notification's."""
    a, b = deployment.replicas
    admin = make_tenant("replica-revoke").headers()
    for n in range(3):
        issued = httpx.post(
            f"{a.url}/v1/keys", json={"user": f"revoked{n}@example.com", "role": "member"}, headers=admin
        )
        assert issued.status_code == 201, issued.text
        headers = {"Authorization": f"Bearer {issued.json()['api_key']}"}
        with httpx.Client(base_url=b.url, headers=headers, timeout=30) as on_b:
            assert on_b.get("/v1/memories?limit=1").status_code == 200  # (cached by B from now on)
            revoked = httpx.delete(f"{a.url}/v1/keys/{issued.json()['id']}", headers=admin)
            assert revoked.status_code == 200, revoked.text
            deadline = time.monotonic() + 1.0
            statuses = [on_b.get("/v1/memories?limit=1").status_code]
            while statuses[-1] != 401 and time.monotonic() < deadline:
                time.sleep(0.02)
                statuses.append(on_b.get("/v1/memories?limit=1").status_code)
            assert statuses[-1] == 401, statuses


def test_a_change_made_through_one_routed_process_applies_in_the_others_before_it_is_answered(stack, make_tenant):
    """The process through which a key is revoked or a tenant suspended has the host's other processes drop the
    tenant's cached callers before it answers (api.serve.routed.forget_everywhere): the next request is refused
    whichever process serves it, even when the database's notification does not reach them. Here each process's
    listening connection is cut just before the change; a listener reconnects after a pause and then drops every
    cached caller, so an attempt that it overtook proves nothing and is made again."""
    import http.client

    import psycopg

    from core.tenancy.operations import CHANNEL

    application = f"engram-routed-{uuid.uuid4().hex[:8]}"  # (libpq names every connection of the replica so)
    dsn = stack.database_url.replace("postgresql+psycopg://", "postgresql://", 1)
    listening = "FROM pg_stat_activity WHERE application_name = %s AND query = %s"
    with (
        _routed(stack, workers=2, env={"PGAPPNAME": application}) as replica,
        psycopg.connect(dsn, autocommit=True) as database,
    ):

        def listeners() -> int:
            return database.execute(f"SELECT count(*) {listening}", (application, f"LISTEN {CHANNEL}")).fetchone()[0]

        def refused_at_once(change: Any, headers: dict[str, str]) -> list[int] | None:
            """The statuses on four connections (over both processes) right after ``change``, or None when a
            listener was back by then."""
            wait_for(lambda: listeners() == 2)
            connections = [http.client.HTTPConnection("127.0.0.1", replica.port, timeout=30) for _ in range(4)]
            try:
                assert _statuses(connections, headers) == [200] * 4
                serving = {_serving_pid(replica.process.pid, c.sock.getsockname()[1]) for c in connections}
                assert len(serving) == 2, serving
                cut = database.execute(
                    f"SELECT pg_terminate_backend(pid) {listening}", (application, f"LISTEN {CHANNEL}")
                ).fetchall()
                assert len(cut) == 2
                change()
                statuses = _statuses(connections, headers)
                return statuses if listeners() == 0 else None
            finally:
                for connection in connections:
                    connection.close()

        admin_tenant = make_tenant("routed-forget")
        admin = admin_tenant.headers()
        operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
        for attempt in range(3):
            issued = httpx.post(
                f"{replica.url}/v1/keys", json={"user": f"gone{attempt}@example.com", "role": "member"}, headers=admin
            )
            assert issued.status_code == 201, issued.text

            def revoke(key_id: str = issued.json()["id"]) -> None:
                assert httpx.delete(f"{replica.url}/v1/keys/{key_id}", headers=admin).status_code == 200

            statuses = refused_at_once(revoke, {"Authorization": f"Bearer {issued.json()['api_key']}"})
            if statuses is not None:
                assert statuses == [401] * 4
                break
        else:
            pytest.fail("a listener reconnected before the statuses were read, in every attempt")

        # The same tenant (busy enough lately to be served by both processes), suspended, resumed if need be.
        tenant = f"{replica.url}/v1/tenants/{admin_tenant.name}"
        for _attempt in range(3):
            assert httpx.patch(tenant, json={"state": "active"}, headers=operator).status_code == 200

            def suspend() -> None:
                answer = httpx.patch(tenant, json={"state": "suspended"}, headers=operator)
                assert answer.status_code == 200, answer.text

            statuses = refused_at_once(suspend, admin)
            if statuses is not None:
                assert statuses == [403] * 4
                break
        else:
            pytest.fail("a listener reconnected before the statuses were read, in every attempt")


def _statuses(connections: list[Any], headers: dict[str, str]) -> list[int]:
    """One GET on each kept-alive connection (the same process answers a connection every time): the statuses."""
    answers = []
    for connection in connections:
        connection.request("GET", "/v1/memories?limit=1", headers=headers)
        response = connection.getresponse()
        response.read()
        answers.append(response.status)
    return answers


def test_a_routed_process_killed_is_replaced_and_its_keys_answered_meanwhile(stack, make_tenant):
    import psutil

    with _routed(stack, workers=2, per_tenant=1) as replica:  # (the tenant's one process is the one killed)
        headers = _headers(make_tenant)
        before = _tenant_process(replica, headers)
        other = ({p.pid for p in psutil.Process(replica.process.pid).children()} - {before}).pop()
        os.kill(before, signal.SIGKILL)
        # Until it is back, the key's connections are served by the other process: no request fails.
        answered = [httpx.get(f"{replica.url}/v1/memories?limit=1", headers=headers, timeout=10).status_code]
        wait_for(lambda: len(psutil.Process(replica.process.pid).children()) == 2 and answers_health(replica.url))
        answered += [httpx.get(f"{replica.url}/v1/memories?limit=1", headers=headers, timeout=10).status_code]
        assert answered == [200, 200]
        # The key's owner again, in a new process.
        replaced = _fresh_connection_pid(replica.url, replica.process.pid, headers)
        assert replaced not in (before, other)


def test_connections_queued_to_a_routed_process_that_dies_are_served_by_another(stack, make_tenant):
    """The router keeps its copy of a connection until the process it passed it to took it: a process killed
    with connections still queued to it does not take them along; the next one serves them."""
    from concurrent.futures import ThreadPoolExecutor

    import psutil

    with _routed(stack, workers=2, per_tenant=1) as replica:  # (every connection of the tenant to the stopped one)
        headers = _headers(make_tenant)
        owner = _tenant_process(replica, headers)
        os.kill(owner, signal.SIGSTOP)  # it takes nothing from its socket pair from now on
        with ThreadPoolExecutor(4) as pool:
            url = f"{replica.url}/v1/memories?limit=1"
            answers = [pool.submit(httpx.get, url, headers=headers, timeout=30) for _ in range(4)]
            time.sleep(0.5)
            assert not any(answer.done() for answer in answers)  # passed to the stopped owner, queued there
            os.kill(owner, signal.SIGKILL)
            assert [answer.result().status_code for answer in answers] == [200] * 4
        wait_for(lambda: len(psutil.Process(replica.process.pid).children()) == 2 and answers_health(replica.url))


def test_a_routed_api_stops_on_sigterm_answering_what_it_was_sent(stack, make_tenant):
    """SIGTERM: the router stops listening and its processes drain (api.serve.graceful): a client sending
    requests throughout gets answers, then refusals, never a connection reset mid-request."""
    import psutil

    outcomes: list[str] = []
    stop = threading.Event()
    with _routed(stack, workers=2) as replica:
        headers = _headers(make_tenant)
        children = psutil.Process(replica.process.pid).children()

        def client() -> None:
            with httpx.Client(base_url=replica.url, headers=headers, timeout=30) as http:
                while not stop.is_set():
                    try:
                        outcomes.append(str(http.get("/v1/memories?limit=1").status_code))
                    except httpx.ConnectError:
                        outcomes.append("refused")
                        time.sleep(0.05)
                    except httpx.HTTPError as error:  # a reset or a cut answer: what must not happen
                        outcomes.append(type(error).__name__)

        threads = [threading.Thread(target=client) for _ in range(4)]
        try:
            for thread in threads:
                thread.start()
            time.sleep(1.0)
            replica.process.send_signal(signal.SIGTERM)
            assert replica.process.wait(timeout=60) == 0
            time.sleep(0.3)
        finally:
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
        assert not any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children)
    assert set(outcomes) <= {"200", "refused"}, sorted(set(outcomes))
    assert outcomes.count("200") > 10 and outcomes[-1] == "refused"
