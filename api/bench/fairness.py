"""`engram bench fairness`: one tenant's import must not hold another tenant's fresh saves.

On a throwaway stack with the real API and one `engram worker` (as `engram serve` runs it): tenant A posts
``backlog`` memories through ``POST /v1/memories:batch`` (1,000 a request) while tenant B saves one memory
every ``interval`` seconds and waits for its vector. Figures: B's wait from its save's answer to its vector
(p50, p95, max) and A's drain, from A's first request to A's last vector. Meanwhile A's admin asks
`GET /v1/ops/coverage` every 3 s, as the docs suggest after an import (`coverage_p95_s`: how long it takes
to answer while the backlog drains); after the drain, the operator's coverage over every tenant, with
``operator_tenants`` more (empty) tenants created (`operator_coverage_s`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

import httpx
from sqlalchemy import text

from api.bench import figure
from api.bench.stack import api_process, bench_stack
from core.db import system_connection, system_session
from core.tenancy.service import create_tenant, get_tenant_by_name

_POLL_S = 0.01


def _has_vector(tenant_id: int, doc_id: str) -> bool:
    with system_connection() as connection:
        return (
            connection.execute(
                text("SELECT 1 FROM embeddings WHERE tenant_id = :t AND canonical_id = :id LIMIT 1"),
                {"t": tenant_id, "id": doc_id},
            ).first()
            is not None
        )


def _vectors(tenant_id: int) -> int:
    with system_connection() as connection:
        return int(
            connection.execute(
                text("SELECT count(*) FROM embeddings WHERE tenant_id = :t AND doc_kind = 'memory'"), {"t": tenant_id}
            ).scalar_one()
        )


def _last_vector_at(tenant_id: int) -> float:
    """When the tenant's last vector was written (epoch seconds): the upsert stamps clock_timestamp()."""

    with system_connection() as connection:
        return float(
            connection.execute(
                text("SELECT extract(epoch FROM max(updated_at)) FROM embeddings WHERE tenant_id = :t"),
                {"t": tenant_id},
            ).scalar_one()
        )


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(share * (len(ordered) - 1))))] if ordered else 0.0


def _tenant(name: str) -> tuple[int, str]:
    with system_session() as session:
        key = create_tenant(session, name=name).api_key
        tenant = get_tenant_by_name(session, name=name)
        assert tenant is not None
        return int(tenant.id), key


def _start_worker(stack: Any) -> subprocess.Popen[bytes]:
    log = open(stack.home / "worker.log", "wb")  # noqa: SIM115
    worker = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "worker", "--concurrency", "2"],
        env={**os.environ, **stack.env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 90
    # `engram worker` runs a process per lane: both are ready when "ready." shows twice.
    while (stack.home / "worker.log").read_bytes().count(b"ready.") < 2:
        if worker.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("worker did not start")
        time.sleep(0.1)
    return worker


def _poll_coverage(url: str, key: str, *, every: float, stop: threading.Event, took: list[float]) -> None:
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=600) as http:
        while not stop.wait(every):
            started = time.perf_counter()
            http.get("/v1/ops/coverage").raise_for_status()
            took.append(time.perf_counter() - started)


def _operator_coverage(url: str, *, tenants: int) -> float:
    """Seconds the operator's coverage over every tenant takes, after creating `tenants` more (best of 3)."""

    with system_session() as session:
        for n in range(tenants):
            create_tenant(session, name=f"bench-tenant-{n}")
            if n % 100 == 99:
                session.commit()
    best = float("inf")
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {_OPERATOR_KEY}"}, timeout=600) as http:
        for _ in range(3):
            started = time.perf_counter()
            http.get("/v1/ops/coverage").raise_for_status()
            best = min(best, time.perf_counter() - started)
    return best


_OPERATOR_KEY = "bench-operator-key-for-the-fairness-run"


def run(*, backlog: int, interval: float, port: int, operator_tenants: int = 1000) -> list[dict[str, Any]]:
    waits: list[float] = []
    coverage_took: list[float] = []
    with bench_stack() as stack:
        stack.env["ENGRAM_OPERATOR_KEY"] = _OPERATOR_KEY
        with api_process(stack, port=port) as url:
            figures = _measure(stack, url, backlog=backlog, interval=interval, waits=waits, took=coverage_took)
            operator_s = _operator_coverage(url, tenants=operator_tenants)
    params = {"backlog": backlog, "interval_s": interval, "fresh_saves": len(waits)}
    drained = figures["drained"]
    return [
        figure("fairness", "fresh_p50_s", _percentile(waits, 0.5), "s", **params),
        figure("fairness", "fresh_p95_s", _percentile(waits, 0.95), "s", **params),
        figure("fairness", "fresh_max_s", max(waits, default=0.0), "s", **params),
        figure("fairness", "backlog_drain_s", drained, "s", **params),
        figure("fairness", "backlog_per_s", backlog / drained, "memories/s", **params),
        figure("fairness", "coverage_p95_s", _percentile(coverage_took, 0.95), "s", calls=len(coverage_took), **params),
        figure("fairness", "operator_coverage_s", operator_s, "s", tenants=operator_tenants + 2, backlog=backlog),
    ]


def _measure(
    stack: Any, url: str, *, backlog: int, interval: float, waits: list[float], took: list[float]
) -> dict[str, float]:
    """Run the import and the fresh saves; fills `waits` and `took`; returns A's drain time."""
    a_id, a_key = _tenant("bench-import")
    b_id, b_key = _tenant("bench-agent")
    worker = _start_worker(stack)
    posted = threading.Event()

    def post_backlog() -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {a_key}"}, timeout=120) as http:
            for start in range(0, backlog, 1000):
                items = [
                    {"content": f"imported record {n}: order {n * 7 % 9973} shipped from warehouse {n % 17}"}
                    for n in range(start, min(start + 1000, backlog))
                ]
                http.post("/v1/memories:batch", json={"items": items}).raise_for_status()
        posted.set()

    stop_polling = threading.Event()
    poller = threading.Thread(
        target=_poll_coverage, args=(url, a_key), kwargs={"every": 3.0, "stop": stop_polling, "took": took}
    )
    try:
        started_wall = time.time()
        importer = threading.Thread(target=post_backlog, name="bench-import")
        importer.start()
        poller.start()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {b_key}"}, timeout=60) as http:
            n = 0
            while not (posted.is_set() and _vectors(a_id) >= backlog):
                tick = time.perf_counter()
                response = http.post("/v1/memories", json={"content": f"agent note {n}: the customer called back"})
                response.raise_for_status()
                saved_at = time.perf_counter()
                doc_id = f"memory:{response.json()['memory_id']}"
                while not _has_vector(b_id, doc_id):
                    if time.perf_counter() - saved_at > 600:
                        raise RuntimeError(f"{doc_id} got no vector in 600 s")
                    time.sleep(_POLL_S)
                waits.append(time.perf_counter() - saved_at)
                n += 1
                time.sleep(max(0.0, interval - (time.perf_counter() - tick)))
        importer.join()
        drained = _last_vector_at(a_id) - started_wall
    finally:
        stop_polling.set()
        if poller.ident is not None:
            poller.join()
        worker.terminate()
        worker.wait(timeout=60)
    return {"drained": drained}
