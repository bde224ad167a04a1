"""CPU of the API process per request, through the ASGI app in-process, at a tenant of 10k memories: a save,
a get by id, a search, a listing page of 20, a hydration of 4,000 bytes, a patch of a memory's content, its
history and a forget (soft delete, each of another memory), each timed over `--calls` calls
after a warm-up (the figures engram's metering, quotas and audit must not move by more than a few percent).

Run it for two trees in turns to compare them (each on its own throwaway embedded stack):

    PYTHONPATH=/path/to/other/tree python scripts/bench_request_cpu.py
    python scripts/bench_request_cpu.py

The CPU is the whole process's (`time.process_time`: the app, its threads and the test client, not
PostgreSQL's, which runs apart); wall p50 is printed beside it.

`--http` measures over real HTTP instead: `engram api` (uvicorn) in its own process on the throwaway stack,
one keep-alive client sending a get by id and a save `--calls` times each, the API process's CPU read from
/proc (as `engram bench load` does). Then each service call alone (core.memories' get and save, in a tenant
transaction begun before timing, committed after) is timed in this process, and `outside_ms` is the
difference: what a request costs besides its work (HTTP, routing, authentication, rate limit, the tenant
transaction's begin and commit, metrics, the access log, serialisation).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _timed(name: str, call: Callable[[], Any], calls: int) -> dict[str, Any]:
    for _ in range(20):
        call()
    walls: list[float] = []
    cpu_start = time.process_time()
    for _ in range(calls):
        started = time.perf_counter()
        call()
        walls.append((time.perf_counter() - started) * 1000)
    cpu_ms = (time.process_time() - cpu_start) * 1000 / calls
    return {"op": name, "cpu_ms": round(cpu_ms, 3), "p50_ms": round(statistics.median(walls), 3)}


def _http(memories: int, calls: int) -> list[dict[str, Any]]:
    import httpx

    from api.auth import caller_for_key
    from api.bench.load import cpu_seconds
    from api.bench.stack import api_server, bench_stack
    from api.serve.embedded import free_port
    from core.db import system_session, tenant_session
    from core.memories import service
    from core.memories.schemas import SaveMemoryIn
    from core.tenancy.service import create_tenant

    figures: list[dict[str, Any]] = []
    with bench_stack() as stack:
        with system_session() as session:
            key = create_tenant(session, name="bench").api_key
        with (
            api_server(stack, port=free_port()) as (url, pid),
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http,
        ):
            for start in range(0, memories, 1000):
                items = [
                    {"content": f"note {i} about orders and invoices in region {i % 50}"}
                    for i in range(start, min(start + 1000, memories))
                ]
                http.post("/v1/memories:batch", json={"items": items}).raise_for_status()
            probe = http.get("/v1/memories", params={"limit": 1}).json()["memories"][0]["id"]
            requests: dict[str, Callable[[], Any]] = {
                "get": lambda: http.get(f"/v1/memories/{probe}"),
                "save": lambda: http.post("/v1/memories", json={"content": f"note {uuid.uuid4().hex}"}),
            }
            for name, call in requests.items():
                for _ in range(100):
                    call().raise_for_status()
                walls: list[float] = []
                cpu_before = cpu_seconds([pid])
                for _ in range(calls):
                    started = time.perf_counter()
                    call()
                    walls.append((time.perf_counter() - started) * 1000)
                api_cpu_ms = (cpu_seconds([pid]) - cpu_before) * 1000 / calls
                figures.append({"op": name, "api_cpu_ms": api_cpu_ms, "p50_ms": statistics.median(walls)})
        caller = caller_for_key(key)

        def get(session: Any) -> None:
            service.recall_memory(session, caller=caller, memory_id=probe)

        def save(session: Any) -> None:
            item = SaveMemoryIn(content=f"note {uuid.uuid4().hex}")
            service.save_memory(session, caller=caller, item=item, action="memory.save")  # as the route does
            session.flush()

        for figure, work in zip(figures, (get, save), strict=True):
            spent = 0.0
            for i in range(calls + 100):
                with tenant_session(caller.tenant_id) as session:
                    session.connection()  # the transaction (and its tenant) begun before timing
                    started = time.thread_time()
                    work(session)
                    if i >= 100:
                        spent += time.thread_time() - started
            figure["service_cpu_ms"] = spent * 1000 / calls
            figure["outside_ms"] = figure["api_cpu_ms"] - figure["service_cpu_ms"]
    return [{k: round(v, 3) if isinstance(v, float) else v for k, v in f.items()} for f in figures]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--http", action="store_true", help="over real HTTP against `engram api` (see above)")
    args = parser.parse_args()
    if args.http:
        for figure in _http(args.memories, args.calls):
            print(json.dumps(figure))
        return
    base = Path(tempfile.mkdtemp(prefix="engram-request-cpu-", dir="/tmp"))
    base.chmod(0o755)
    try:
        from api.serve.embedded import embedded_services

        with embedded_services(base, durable=False) as (database_url, redis_url):
            os.environ.update(
                ENGRAM_DATABASE_URL=database_url,
                ENGRAM_REDIS_URL=redis_url,
                ENGRAM_HOME=str(base / "home"),
                ENGRAM_OPERATOR_KEY="egop_" + uuid.uuid4().hex,
            )
            (base / "home").mkdir()
            from core.config import reset_settings_cache

            reset_settings_cache()
            from core.migrate import upgrade

            upgrade()
            from fastapi.testclient import TestClient

            from api.app import create_app
            from core.db import system_session
            from core.tenancy.service import create_tenant

            with system_session() as session:
                headers = {"Authorization": f"Bearer {create_tenant(session, name='bench').api_key}"}
            with TestClient(create_app()) as client:
                for start in range(0, args.memories, 1000):
                    items = [
                        {"content": f"note {i} about orders and invoices in region {i % 50}"}
                        for i in range(start, min(start + 1000, args.memories))
                    ]
                    client.post("/v1/memories:batch", json={"items": items}, headers=headers)
                probe = str(args.memories // 2)
                revised = str(args.memories // 3)
                forgotten = iter(range(1, args.memories + 1))

                def save() -> Any:
                    return client.post("/v1/memories", json={"content": f"note {uuid.uuid4().hex}"}, headers=headers)

                figures = [
                    _timed("save", save, args.calls),
                    _timed("get", lambda: client.get(f"/v1/memories/{probe}", headers=headers), args.calls),
                    _timed(
                        "search",
                        lambda: client.post("/v1/search", json={"question": "invoices in region 7"}, headers=headers),
                        args.calls,
                    ),
                    _timed("list_20", lambda: client.get("/v1/memories?limit=20", headers=headers), args.calls),
                    _timed(
                        "hydrate_4000",
                        lambda: client.post("/v1/hydrate", json={"budget_bytes": 4000}, headers=headers),
                        args.calls,
                    ),
                    _timed(
                        "patch",
                        lambda: client.patch(
                            f"/v1/memories/{revised}", json={"content": f"revised {uuid.uuid4().hex}"}, headers=headers
                        ),
                        args.calls,
                    ),
                    _timed(
                        "history", lambda: client.get(f"/v1/memories/{revised}/history", headers=headers), args.calls
                    ),
                    _timed(
                        "forget",
                        lambda: client.delete(f"/v1/memories/{next(forgotten)}", headers=headers),
                        args.calls,
                    ),
                ]
            for figure in figures:
                print(json.dumps(figure))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
