"""Overload answers 503 + Retry-After (never a 500 or a hang), probes bypass request work, 405 lists every
allowed method, and body limits by route."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from tests.helpers.api import assert_error


def test_405_allow_lists_every_method_of_the_path(client, tenant):
    response = client.put("/v1/memories/some-id", json={}, headers=tenant.headers())
    assert_error(response, 405, "method_not_allowed")
    allowed = {m.strip() for m in response.headers["allow"].split(",")}
    assert {"GET", "PATCH", "DELETE"} <= allowed
    response = client.delete("/v1/memories", headers=tenant.headers())
    assert {"GET", "POST"} <= {m.strip() for m in response.headers["allow"].split(",")}


def test_batch_body_is_bounded_below_the_theoretical_maximum(client, tenant):
    from api.app import MAX_BATCH_BODY_BYTES, MAX_SINGLE_BODY_BYTES

    assert MAX_BATCH_BODY_BYTES <= 16 * 1024 * 1024
    headers = {**tenant.headers(), "Content-Type": "application/json"}
    # Declared over the limit: refused before the body is read.
    huge = b'{"items": [' + b" " * MAX_BATCH_BODY_BYTES + b"]}"
    error = assert_error(client.post("/v1/memories:batch", content=huge, headers=headers), 413, "payload_too_large")
    assert "batch" in error["message"]
    single = json.dumps({"content": "x" * (MAX_SINGLE_BODY_BYTES + 1)})
    assert_error(client.post("/v1/memories", content=single, headers=headers), 413, "payload_too_large")
    # The contract's own limits still fit: a content of 50,000 bytes even as JSON escapes, and batches of
    # full-size contents.
    escaped = json.dumps({"content": "\x01" * 50_000})
    assert len(escaped) > 250_000
    assert client.post("/v1/memories", content=escaped, headers=headers).status_code == 201
    items = [{"content": f"{n} " + "y" * 49_990} for n in range(40)]
    response = client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers())
    assert response.status_code == 200, response.text
    assert all("memory_id" in r for r in response.json()["results"])


def test_pool_exhaustion_is_503_with_retry_after(stack):
    from api.errors import install_error_handlers

    engine = create_engine(
        stack.database_url.replace("postgresql://", "postgresql+psycopg://", 1),
        pool_size=1,
        max_overflow=0,
        pool_timeout=0.2,
    )
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/needs-db")
    def needs_db() -> dict[str, Any]:
        with engine.connect() as connection:
            return {"one": connection.scalar(text("SELECT 1"))}

    try:
        with TestClient(app, raise_server_exceptions=False) as probe:
            assert probe.get("/needs-db").json() == {"one": 1}
            with engine.connect():  # the pool's only connection, held
                response = probe.get("/needs-db")
            assert_error(response, 503, "unavailable")
            assert int(response.headers["retry-after"]) > 0
            assert probe.get("/needs-db").status_code == 200
    finally:
        engine.dispose()


def test_errors_of_statements_sent_beneath_sqlalchemy_are_answered_as_wrapped_ones(stack):
    """A search sends its SQL on the driver's connection (core.sql), so PostgreSQL's errors arrive as
    psycopg's own, unwrapped: a statement past its time budget is a 503 with Retry-After, a value the
    database cannot take a 422, as through SQLAlchemy, and never a 500."""
    from api.errors import install_error_handlers
    from core.dbwaits import run_simple

    engine = create_engine(stack.database_url.replace("postgresql://", "postgresql+psycopg://", 1))
    app = FastAPI()
    install_error_handlers(app)

    @app.get("/raw/{statement}")
    def raw(statement: str) -> dict[str, Any]:
        sql = {"slow": "SET statement_timeout = '50ms'; SELECT pg_sleep(2)", "bad": "SELECT 'x'::int"}[statement]
        with engine.connect() as connection:
            run_simple(connection.connection.driver_connection, sql)
        return {}

    try:
        with TestClient(app, raise_server_exceptions=False) as probe:
            slow = probe.get("/raw/slow")
            assert_error(slow, 503, "unavailable")
            assert "time budget" in slow.json()["error"]["message"] and int(slow.headers["retry-after"]) > 0
            bad = probe.get("/raw/bad")
            assert bad.status_code == 422 and "cannot be stored" in bad.json()["error"]["message"]
    finally:
        engine.dispose()


class _Gate:
    """An ASGI app whose requests wait until released; counts what it ran."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.ran = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.ran += 1
        if scope["path"] not in ("/healthz",):
            await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


async def _call(app: Any, path: str) -> tuple[int, dict[str, str]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app({"type": "http", "method": "GET", "path": path, "headers": []}, receive, send)
    start = sent[0]
    return start["status"], {k.decode(): v.decode() for k, v in start.get("headers", [])}


def test_load_shedder_runs_a_bounded_number_queues_briefly_and_refuses_the_rest():
    from api.overload import LoadShedder

    async def scenario() -> None:
        gate = _Gate()
        shedder = LoadShedder(gate, max_inflight=2, max_queued=1, queue_wait=0.3)
        running = [asyncio.create_task(_call(shedder, "/v1/x")) for _ in range(2)]
        await asyncio.sleep(0.05)
        assert shedder.inflight == 2
        queued = asyncio.create_task(_call(shedder, "/v1/x"))
        await asyncio.sleep(0.05)
        assert shedder.queued == 1
        # The queue is full: refused at once, without running.
        status, headers = await asyncio.wait_for(_call(shedder, "/v1/x"), timeout=0.1)
        assert status == 503 and int(headers["retry-after"]) > 0
        # Probes bypass the limit.
        assert (await asyncio.wait_for(_call(shedder, "/healthz"), timeout=0.1))[0] == 200
        # The queued request waited its bound, then was refused.
        status, headers = await queued
        assert status == 503 and "retry-after" in headers
        assert gate.ran == 3  # the two running and the probe
        gate.release.set()
        assert [(await task)[0] for task in running] == [200, 200]
        assert shedder.inflight == 0
        # Freed slots admit again; a queued request gets the slot a finished one frees.
        gate.release = asyncio.Event()
        first = [asyncio.create_task(_call(shedder, "/v1/x")) for _ in range(3)]
        await asyncio.sleep(0.05)
        gate.release.set()
        assert [(await task)[0] for task in first] == [200, 200, 200]

    asyncio.run(scenario())


def test_load_shedder_counts_a_queued_request_once_while_it_is_handed_a_slot():
    """Requests that finish hand their slots to queued ones, which resume a moment later: a request arriving in
    between is queued, not refused, while running and waiting requests together stay within the bounds."""
    from api.overload import LoadShedder

    async def scenario() -> None:
        gate = _Gate()
        shedder = LoadShedder(gate, max_inflight=2, max_queued=2, queue_wait=5.0)
        running = [asyncio.create_task(_call(shedder, "/v1/x")) for _ in range(2)]
        await asyncio.sleep(0.05)
        first, gate.release = gate.release, asyncio.Event()  # (the queued ones will wait on the second)
        waiting = [asyncio.create_task(_call(shedder, "/v1/x")) for _ in range(2)]
        await asyncio.sleep(0.05)
        assert (shedder.inflight, shedder.queued) == (2, 2)
        # Both running requests finish at once; the test runs again before the queued ones resume.
        first.set()
        await asyncio.sleep(0)
        # Three requests in all (two just handed a slot, this one): within the bounds of four.
        arriving = asyncio.create_task(_call(shedder, "/v1/x"))
        await asyncio.sleep(0.05)
        assert shedder.shed == 0 and not arriving.done()
        assert (shedder.inflight, shedder.queued) == (2, 1)
        gate.release.set()
        assert [(await task)[0] for task in (*running, *waiting, arriving)] == [200] * 5
        assert (shedder.inflight, shedder.queued, shedder.shed) == (0, 0, 0)

    asyncio.run(scenario())


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
def test_probes_are_async_and_answer_outside_the_request_pool(client, path):
    from api.routes import health

    endpoint = health.healthz if path == "/healthz" else health.readyz
    assert asyncio.iscoroutinefunction(endpoint)
    assert client.get(path).status_code == 200
    if path == "/readyz":
        from core.db import get_engine

        assert health._engine() is not get_engine()


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost:8000",
        "http://10.0.0.1:8000",
        "https://127.0.0.1:8000",
        "http://127.0.0.2:8000",
        "http://127.0.0.1",
        "http://user@127.0.0.1:8000",
        "http://127.0.0.1:8000/v1",
        "http://example.com:80",
    ],
)
def test_bench_load_refuses_anything_but_loopback(url):
    from api.bench.load import NotLoopback, check_loopback, run

    with pytest.raises(NotLoopback):
        check_loopback(url)
    with pytest.raises(ValueError):
        run(url=url, key="egk_x", clients=1, seconds=1, log=lambda m: None)
    assert check_loopback("http://127.0.0.1:8123/") == "http://127.0.0.1:8123"


def test_bench_load_short_run_loses_nothing_and_answers_only_2xx_or_503(stack, tenant):
    from api.bench.load import run
    from api.bench.stack import BenchStack, api_process
    from api.serve.embedded import free_port

    with api_process(BenchStack(home=stack.home, env=stack.env), port=free_port()) as url:
        figures = run(url=url, key=tenant.admin_key, clients=4, seconds=3, log=lambda m: None)
    values = {f["metric"]: f["value"] for f in figures}
    assert all(f["bench"] == "load" and f["params"] == {"clients": 4, "seconds": 3, "tenants": 1} for f in figures)
    assert values["requests"] > 0 and values["saves_acknowledged"] > 0
    assert values["lost_writes"] == 0
    assert values["unanswered_30s"] == 0 and values["connection_errors"] == 0
    statuses = {m[len("status_") :]: v for m, v in values.items() if m.startswith("status_")}
    assert sum(statuses.values()) == values["requests"]
    assert all(code.startswith("2") or code == "503" for code in statuses), statuses
    # The API process started for the run is found by its listening socket, and its CPU is counted.
    assert values["api_processes"] == 1 and values["api_cpu_s_per_1000"] > 0


def test_bench_load_paced_sends_at_most_the_rate_asked(stack, tenant):
    """With a rate the clients together send that many requests a second, not as many as the API answers: how
    CPU per request is compared at one offered load (docs/benchmarks.md, Processes)."""
    from api.bench.load import run
    from api.bench.stack import BenchStack, api_process
    from api.serve.embedded import free_port

    with pytest.raises(ValueError):
        run(url="http://127.0.0.1:1", key="egk_x", clients=1, seconds=1, rate=0, log=lambda m: None)
    with api_process(BenchStack(home=stack.home, env=stack.env), port=free_port()) as url:
        figures = run(url=url, key=tenant.admin_key, clients=3, seconds=4, rate=6, log=lambda m: None)
    values = {f["metric"]: f["value"] for f in figures}
    assert all(f["params"] == {"clients": 3, "seconds": 4, "tenants": 1, "rate": 6} for f in figures)
    # 6 a second for 4 s: each client's first request comes within its first interval (0.5 s), then one at least
    # every 0.5 s, so at most 8 a client (fewer when an answer takes longer). Unpaced, three send hundreds in 4 s.
    assert 12 <= values["requests"] <= 24, values["requests"]
    assert values["lost_writes"] == 0 and values["connection_errors"] == 0


def test_bench_load_reads_back_each_acknowledged_save_and_says_why_one_is_missing(stack, client, tenant):
    """The read-back counts a memory that is not there by the status its read got (a 404 here), and one that is
    there as not lost."""
    import uvloop

    from api.bench.load import _verify
    from api.bench.stack import BenchStack, api_process
    from api.serve.embedded import free_port

    saved = client.post("/v1/memories", json={"content": "read back after the run"}, headers=tenant.headers())
    assert saved.status_code == 201
    with api_process(BenchStack(home=stack.home, env=stack.env), port=free_port()) as url:
        reasons = uvloop.run(_verify(url, tenant.admin_key, [saved.json()["memory_id"], "999999999"]))
    assert reasons == {"404": 1}


def test_bench_load_finds_every_process_holding_the_listening_socket():
    """With N workers on one socket, each holds it: the listener here and a child that inherited it."""
    import os
    import socket
    import subprocess
    import sys

    from api.bench.load import api_processes, cpu_seconds

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        fd = listener.fileno()
        child = subprocess.Popen(
            [sys.executable, "-c", "import sys; print('up', flush=True); sys.stdin.read()"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            pass_fds=(fd,),
        )
        try:
            # (Once it runs: mid-exec its /proc entry cannot be read, and it would be missed.)
            assert child.stdout is not None and child.stdout.readline() == b"up\n"
            assert sorted(api_processes(port)) == sorted([os.getpid(), child.pid])
            assert cpu_seconds([os.getpid()]) > 0
        finally:
            child.communicate(b"")
        assert api_processes(port) == [os.getpid()]
    assert api_processes(port) == []


def test_bench_load_spreads_clients_over_tenants_and_counts_every_routed_process(stack, make_tenant):
    """Two tenants' clients against `ENGRAM_API_WORKERS=2`: each tenant's saves are read back with its own
    key (none lost), and the router and both of its processes are counted as the API."""
    from api.bench.load import figures_of
    from api.bench.stack import BenchStack, api_process
    from api.serve.embedded import free_port

    keys = [make_tenant("load").admin_key, make_tenant("load").admin_key]
    routed = BenchStack(home=stack.home, env={**stack.env, "ENGRAM_API_WORKERS": "2"})
    with api_process(routed, port=free_port()) as url:
        figures = figures_of([url], keys, clients=4, seconds=3, log=lambda m: None, root=None)
    values = {f["metric"]: f["value"] for f in figures}
    assert all(f["params"] == {"clients": 4, "seconds": 3, "tenants": 2} for f in figures)
    assert values["saves_acknowledged"] > 0 and values["lost_writes"] == 0
    assert values["unanswered_30s"] == 0 and values["connection_errors"] == 0
    assert all(m[len("status_") :] in ("200", "201", "503") for m in values if m.startswith("status_"))
    assert values["api_processes"] == 3 and values["api_cpu_s_per_1000"] > 0


def test_bench_load_refuses_more_replicas_than_tenants_before_starting_anything():
    """Each tenant goes to one replica: a replica without a tenant would idle, so `--replicas` is at most `--tenants`
    (and at most MAX_REPLICAS); refused before a serve is started."""
    from api.bench.load import MAX_REPLICAS, run

    for tenants, replicas in ((1, 2), (4, 0), (MAX_REPLICAS + 1, MAX_REPLICAS + 1)):
        with pytest.raises(ValueError, match="replicas"):
            run(url=None, key=None, clients=20, seconds=1, tenants=tenants, replicas=replicas, log=lambda m: None)


def test_bench_load_sends_each_tenant_to_one_replica_and_counts_every_replica(stack, make_tenant, tmp_path):
    """`--replicas 2`: a second `engram api` with a home of its own on the same database; each tenant's clients go
    to one replica (both answered searches), every acknowledged save is read back, and both replicas' processes
    are counted as the API."""
    import httpx

    from api.bench.load import api_processes, figures_of, more_replicas
    from api.bench.stack import BenchStack, api_process
    from api.serve.embedded import free_port
    from tests.helpers.api import scrape

    keys = [make_tenant("load").admin_key, make_tenant("load").admin_key]
    settings = {k: v for k, v in stack.env.items() if k != "ENGRAM_HOME"}
    with (
        api_process(BenchStack(home=stack.home, env=stack.env), port=free_port()) as url,
        more_replicas(settings, tmp_path, 1, log=lambda m: None) as others,
    ):
        assert len(others) == 1 and others[0] != url
        figures = figures_of([url, *others], keys, clients=4, seconds=3, log=lambda m: None, root=None)
        searched = []
        for replica in (url, *others):
            with httpx.Client(base_url=replica, timeout=30) as http:
                answered = scrape(http)["engram_http_requests_total"]
            searched.append(sum(n for labels, n in answered.items() if ("route", "/v1/search") in labels))
    values = {f["metric"]: f["value"] for f in figures}
    assert all(f["params"] == {"clients": 4, "seconds": 3, "tenants": 2, "replicas": 2} for f in figures)
    assert all(n > 0 for n in searched), searched
    assert values["saves_acknowledged"] > 0 and values["lost_writes"] == 0
    assert values["unanswered_30s"] == 0 and values["connection_errors"] == 0
    assert values["api_processes"] == 2 and values["api_cpu_s_per_1000"] > 0
    assert api_processes(int(others[0].rsplit(":", 1)[1])) == []  # (the replica stopped with the block)


def test_a_terminated_benchmark_stops_the_stack_it_started_and_removes_its_home():
    """SIGTERM (a CI timeout, `kill`) ends a benchmark as Ctrl-C does: the embedded PostgreSQL and Redis of its
    throwaway stack stop and its temporary home is removed (`engram bench load`'s throwaway `engram serve` is
    stopped by the same guard). Python's default for SIGTERM ends the process at once and left them running."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    import psutil

    script = (
        "import time\n"
        "from api.bench.stack import bench_stack\n"
        "with bench_stack() as stack:\n"
        "    print(stack.home, flush=True)\n"
        "    time.sleep(600)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("ENGRAM_DATABASE_URL", "ENGRAM_REDIS_URL")}
    bench = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert bench.stdout is not None
        home = Path(bench.stdout.readline().strip())
        assert home.is_dir()
        started = psutil.Process(bench.pid).children(recursive=True)
        assert len(started) >= 2  # its PostgreSQL and Redis
        bench.send_signal(signal.SIGTERM)
        assert bench.wait(timeout=60) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(started, timeout=30)
        assert alive == []
        assert not home.parent.exists()
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
