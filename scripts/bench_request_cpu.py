"""CPU of the API process per request, through the ASGI app in-process, at a tenant of 10k memories: a save,
a get by id and a search, each timed over `--calls` calls after a warm-up (the figures engram's metering,
quotas and audit must not move by more than a few percent).

Run it for two trees in turns to compare them (each on its own throwaway embedded stack):

    PYTHONPATH=/path/to/other/tree python scripts/bench_request_cpu.py
    python scripts/bench_request_cpu.py

The CPU is the whole process's (`time.process_time`: the app, its threads and the test client, not
PostgreSQL's, which runs apart); wall p50 is printed beside it.
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
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
                ]
            for figure in figures:
                print(json.dumps(figure))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
