"""`engram serve` installed as a user installs it, from a directory of someone else's packages: it starts,
keeps no owner connection, brings its embedded PostgreSQL and Redis back when they die, and a SIGTERM under
load resets no connection and loses no acknowledged write."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import psycopg
import pytest

from tests.helpers.processes import make_temp_dir, wait_for
from tests.helpers.serve import Served, clean_env, hostile_project, install_wheel, roles_connected, start_serve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed() -> Iterator[tuple[Path, Path]]:
    """(the installed `engram`, a project directory holding api/, core/ and workers/ packages)."""
    base = make_temp_dir("engram-wheel-")
    try:
        yield install_wheel(base), hostile_project(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def served(installed: tuple[Path, Path]) -> Iterator[Served]:
    engram, project = installed
    base = make_temp_dir("engram-served-")
    try:
        running = start_serve(engram, cwd=project, home=base / "home", output=base / "serve.out")
        try:
            yield running
        finally:
            running.stop()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _headers(served: Served) -> dict[str, str]:
    assert served.admin_key
    return {"Authorization": f"Bearer {served.admin_key}"}


def test_serve_installed_from_a_wheel_runs_from_a_directory_of_other_packages(served):
    """API, worker and beat all start (the worker embeds a save) though the current directory has `api`,
    `core` and `workers` packages of its own."""
    with httpx.Client(base_url=served.url, headers=_headers(served), timeout=30) as http:
        assert http.get("/healthz").status_code == 200
        saved = http.post("/v1/memories", json={"content": "the warehouse closes at six"})
        assert saved.status_code == 201

        def embedded() -> bool:
            jobs = http.get("/v1/jobs").json()["jobs"]
            return any(job["kind"] == "embed" and job["state"] == "succeeded" for job in jobs)

        wait_for(embedded, timeout=60, interval=0.5)
    for name in ("api", "worker", "beat"):
        assert "No module named" not in (served.home / "logs" / f"{name}.log").read_text(errors="replace")


def test_mcp_starts_from_a_directory_of_other_packages(served, installed):
    engram, project = installed
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_") and k != "PYTHONPATH"}
    env.update(ENGRAM_HOME=str(served.home), ENGRAM_API_KEY=served.admin_key or "")
    request = '{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": "2025-06-18", '
    request += '"capabilities": {}, "clientInfo": {"name": "test", "version": "0"}}}\n'
    done = subprocess.run(
        [str(engram), "mcp"], cwd=project, env=env, input=request, capture_output=True, text=True, timeout=120
    )
    assert '"serverInfo"' in done.stdout, done.stderr[-3000:]


def _load(served: Served, *, seconds: float) -> None:
    def client() -> None:
        with httpx.Client(base_url=served.url, headers=_headers(served), timeout=30) as http:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                http.post("/v1/memories", json={"content": f"load {uuid.uuid4().hex}"})
                http.post("/v1/search", json={"query": "load"})

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def test_after_migrating_only_the_app_role_is_connected(served):
    """Under load, every connection to serve's PostgreSQL is the app role's: none as the owner (superuser)
    is left in serve itself, the API, the worker or beat."""
    _load(served, seconds=3)
    roles = roles_connected(served)
    assert set(roles) == {"engram_app"}, roles


def test_an_idle_keep_alive_connection_outlives_the_clients_own_expiry(served):
    """The server keeps an idle connection longer than clients keep theirs (httpx: 5 s), so it is never the
    server's close that a client's next request crosses (the steady-load ReadError)."""
    import http.client

    host, port = served.url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        connection.request("GET", "/healthz")
        first = connection.getresponse()
        assert first.status == 200 and first.read()
        opened = connection.sock
        time.sleep(6.0)
        connection.request("GET", "/healthz")  # raises RemoteDisconnected had the server closed it
        again = connection.getresponse()
        assert again.status == 200 and again.read()
        assert connection.sock is opened  # the same connection, not a new one
    finally:
        connection.close()


def _server_process(served: Served, name: str) -> psutil.Process | None:
    """serve's own child named ``name`` (PostgreSQL's backends are the postmaster's children, not serve's)."""
    for child in psutil.Process(served.process.pid).children():
        try:
            if name in child.name():
                return child
        except psutil.NoSuchProcess:
            continue
    return None


def _saves_again(served: Served) -> bool:
    try:
        response = httpx.post(
            f"{served.url}/v1/memories", json={"content": "after a restart"}, headers=_headers(served), timeout=10
        )
    except httpx.HTTPError:
        return False
    return response.status_code == 201


_WHAT = {"valkey-server": "embedded Redis", "postgres": "embedded PostgreSQL"}


@pytest.mark.parametrize("server", ["valkey-server", "postgres"])
def test_serve_restarts_an_embedded_server_that_dies(served, server):
    before = _server_process(served, server)
    assert before is not None, f"no {server} under serve"
    before.kill()
    before.wait(10)

    def replaced() -> bool:
        after = _server_process(served, server)
        return after is not None and after.pid != before.pid

    wait_for(replaced, timeout=90, interval=0.5)
    wait_for(lambda: _saves_again(served), timeout=60, interval=0.5)
    # (said once the server's start returns, which may be after it already answers the first saves)
    wait_for(lambda: f"{_WHAT[server]} restarted" in served.output(), timeout=30, interval=0.5)


def test_sigterm_stops_what_was_restarted_too(served):
    tree = psutil.Process(served.process.pid).children(recursive=True)
    assert served.stop() == 0
    deadline = time.monotonic() + 20
    alive = tree
    while alive and time.monotonic() < deadline:
        alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        time.sleep(0.2)
    assert alive == [], [p.cmdline() for p in alive]


# The shutdown drill: in the suite a few runs; ENGRAM_SHUTDOWN_DRILL_RUNS=20 for the full count.
DRILL_RUNS = int(os.environ.get("ENGRAM_SHUTDOWN_DRILL_RUNS", "2"))
RESET_ERRORS = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)


class DrillClients:
    """10 clients saving one memory at a time and one saving 1,000-item batches, on keep-alive connections,
    until the server stops answering; they record what was acknowledged and every failure."""

    def __init__(self, served: Served, *, single_key: str) -> None:
        self.served = served
        self.single_key = single_key
        self.acknowledged: list[str] = []
        self.failures: Counter[str] = Counter()
        self.answers: Counter[int] = Counter()
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._single, args=(n,)) for n in range(10)]
        self.threads.append(threading.Thread(target=self._batches))

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(120)

    def _record(self, response: httpx.Response, ids: list[str]) -> None:
        with self._lock:
            self.answers[response.status_code] += 1
            self.acknowledged += ids

    def _run(self, send, *, key: str) -> None:  # type: ignore[no-untyped-def]
        with httpx.Client(base_url=self.served.url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
            while True:
                try:
                    send(http)
                except httpx.ConnectError:
                    return  # refused: the server stopped listening, a clean refusal
                except RESET_ERRORS as exc:
                    with self._lock:
                        self.failures[f"{type(exc).__name__}: {exc}"] += 1
                    return

    def _single(self, n: int) -> None:
        def send(http: httpx.Client) -> None:
            memory_id = f"drill-{n}-{uuid.uuid4().hex[:12]}"
            response = http.post("/v1/memories", json={"id": memory_id, "content": f"drill save {memory_id}"})
            self._record(response, [memory_id] if response.status_code == 201 else [])
            if response.status_code == 201:  # a quick read on the same connection: short idle gaps, many of them
                self._record(http.get(f"/v1/memories/{memory_id}"), [])
            elif response.status_code == 503:
                time.sleep(0.05)

        self._run(send, key=self.single_key)

    def _batches(self) -> None:
        def send(http: httpx.Client) -> None:
            ids = [f"batch-{uuid.uuid4().hex[:12]}" for _ in range(1000)]
            items = [{"id": i, "content": f"drill batch item {i}"} for i in ids]
            response = http.post("/v1/memories:batch", json={"items": items})
            saved = [r["memory_id"] for r in response.json()["results"]] if response.status_code == 200 else []
            self._record(response, saved)

        self._run(send, key=self.served.admin_key or "")


def test_sigterm_under_load_resets_no_connection_and_loses_no_write(installed):
    engram, project = installed
    base = make_temp_dir("engram-drill-")
    figures = []
    try:
        served = start_serve(engram, cwd=project, home=base / "home", output=base / "serve.out")
        admin_key = served.admin_key
        # The single savers write to a tenant of their own, so the batches do not hold them up.
        created = subprocess.run(
            [str(engram), "tenant", "create", "singles", "--json", "--home", str(served.home)],
            env=clean_env(served.home),
            capture_output=True,
            text=True,
            timeout=120,
        )
        single_key = json.loads(created.stdout)["api_key"]
        for run in range(DRILL_RUNS):
            served.admin_key = admin_key
            clients = DrillClients(served, single_key=single_key)
            clients.start()
            time.sleep(3.0 + (run % 4) * 0.4)  # load well under way, at a different moment each run
            served.process.send_signal(signal.SIGTERM)
            clients.join()
            assert served.process.wait(90) == 0
            figures.append((sum(clients.failures.values()), len(clients.acknowledged), dict(clients.answers)))
            assert not clients.failures, f"run {run + 1}: {dict(clients.failures)}"
            assert clients.acknowledged, "the drill saved nothing before the signal"
            served = start_serve(engram, cwd=project, home=base / "home", output=base / "serve.out")
            with psycopg.connect(served.owner_dsn()) as connection:
                stored = {
                    row[0]
                    for row in connection.execute(
                        "SELECT id FROM memories WHERE id = ANY(%s)", (clients.acknowledged,)
                    ).fetchall()
                }
            assert stored == set(clients.acknowledged), f"run {run + 1}: acknowledged writes missing"
        served.stop()
    finally:
        print(f"shutdown drill: {len(figures)} runs, (resets, acknowledged, answers) per run: {figures}")
        shutil.rmtree(base, ignore_errors=True)
