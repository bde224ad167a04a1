"""`engram bench write`: single-save latency over REST at growing tenant sizes, and :batch throughput."""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import httpx

from core.bench.stack import api_process, bench_stack

_WORDS = (
    "orders revenue refunds cents customer region churn weekly monthly fiscal quarter net gross margin "
    "warehouse shipment delay status paid pending cancelled timezone utc dashboard metric filter join"
).split()


def _note(rng: random.Random) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(rng.randint(8, 24)))


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _fill(http: httpx.Client, *, target: int, have: int, rng: random.Random) -> int:
    while have < target:
        size = min(1000, target - have)
        response = http.post("/v1/memories:batch", json={"items": [{"content": _note(rng)} for _ in range(size)]})
        response.raise_for_status()
        have += size
    return have


def run(*, sizes: list[int], saves: int, batches: int, port: int) -> list[dict[str, Any]]:
    """Figures: save_p50_ms / save_p95_ms per tenant size, and batch_per_s."""
    from core.db import system_session
    from core.tenancy.service import create_tenant

    rng = random.Random(7)
    figures: list[dict[str, Any]] = []
    with bench_stack() as stack, api_process(stack, port=port) as url:
        with system_session() as session:
            key = create_tenant(session, name="bench-write").api_key
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
            have = 0
            for size in sorted(sizes):
                have = _fill(http, target=size, have=have, rng=rng)
                for _ in range(20):  # warm the connection pools and caches
                    http.post("/v1/memories", json={"content": _note(rng)}).raise_for_status()
                latencies = []
                for _ in range(saves):
                    body = {"content": _note(rng), "tags": ["bench"]}
                    started = time.perf_counter()
                    response = http.post("/v1/memories", json=body)
                    latencies.append((time.perf_counter() - started) * 1000)
                    response.raise_for_status()
                have += saves + 20
                figures.append(_fig("save_p50_ms", statistics.median(latencies), "ms", memories=size))
                figures.append(_fig("save_p95_ms", _percentile(latencies, 0.95), "ms", memories=size))
            items = [[{"content": _note(rng)} for _ in range(1000)] for _ in range(batches)]
            started = time.perf_counter()
            for batch in items:
                http.post("/v1/memories:batch", json={"items": batch}).raise_for_status()
            elapsed = time.perf_counter() - started
            figures.append(_fig("batch_per_s", batches * 1000 / elapsed, "memories/s", batch_size=1000))
    return figures


def _fig(metric: str, value: float, unit: str, **params: Any) -> dict[str, Any]:
    from core.bench import figure

    return figure("write", metric, value, unit, **params)
