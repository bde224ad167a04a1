"""`engram bench write`: single-save latency over REST at growing tenant sizes, and :batch throughput.

Latency is timed from a keep-alive ``http.client`` connection, the leanest HTTP client in the standard
library, so the figure is the server's (request bytes out to response bytes in). The same saves timed
through httpx are reported beside it (``save_p50_ms_httpx``): on this machine httpx adds 1–4 ms of its own
per POST.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import random
import statistics
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

from api.bench import figure
from api.bench.stack import api_process, bench_stack
from core.db import system_session
from core.tenancy.service import create_tenant

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


class _LeanClient:
    """One keep-alive connection that POSTs JSON and checks the status."""

    def __init__(self, url: str, key: str) -> None:
        parts = urlsplit(url)
        self._connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=120)
        self._headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def post(self, path: str, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        try:
            response = self._send(path, data)
        except (ConnectionError, http.client.HTTPException):
            # The server closed the idle keep-alive connection (e.g. during a long fill): open a new one.
            self._connection.close()
            response = self._send(path, data)
        payload = response.read()
        if response.status >= 300:
            raise RuntimeError(f"POST {path}: {response.status} {payload[:200]!r}")

    def _send(self, path: str, data: bytes) -> http.client.HTTPResponse:
        self._connection.request("POST", path, body=data, headers=self._headers)
        return self._connection.getresponse()

    def close(self) -> None:
        self._connection.close()


def _bodies(rng: random.Random, count: int) -> list[dict[str, Any]]:
    return [{"content": _note(rng), "tags": ["bench"]} for _ in range(count)]


def _timed(post: Any, bodies: list[dict[str, Any]]) -> list[float]:
    latencies = []
    for body in bodies:
        started = time.perf_counter()
        post(body)
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def run(*, sizes: list[int], saves: int, batches: int, port: int, webhook: bool = False) -> list[dict[str, Any]]:
    """Figures: save_p50_ms / save_p95_ms per tenant size, and batch_per_s (with `webhook`: with one webhook
    registered and without, batches alternating between the two)."""
    with bench_stack() as stack:
        if webhook and not os.environ.get("ENGRAM_SECRET_KEY"):  # webhook secrets are stored encrypted
            os.environ["ENGRAM_SECRET_KEY"] = base64.urlsafe_b64encode(os.urandom(32)).decode()
        return _measure(stack, sizes=sizes, saves=saves, batches=batches, port=port, webhook=webhook)


def _measure(
    stack: Any, *, sizes: list[int], saves: int, batches: int, port: int, webhook: bool
) -> list[dict[str, Any]]:
    rng = random.Random(7)
    figures: list[dict[str, Any]] = []
    with api_process(stack, port=port) as url:
        with system_session() as session:
            key = create_tenant(session, name="bench-write").api_key
        lean = _LeanClient(url, key)
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:

            def post_httpx(body: dict[str, Any]) -> None:
                http.post("/v1/memories", json=body).raise_for_status()

            def post_lean(body: dict[str, Any]) -> None:
                lean.post("/v1/memories", body)

            have = 0
            for size in sorted(sizes):
                have = _fill(http, target=size, have=have, rng=rng)
                for _ in range(20):  # warm the connection pools and caches
                    post_lean({"content": _note(rng)})
                    post_httpx({"content": _note(rng)})
                lean_ms: list[float] = []
                httpx_ms: list[float] = []
                for _ in range(10):  # interleaved, so both clients see the same machine
                    lean_ms += _timed(post_lean, _bodies(rng, saves // 10))
                    httpx_ms += _timed(post_httpx, _bodies(rng, saves // 10))
                have += 40 + len(lean_ms) + len(httpx_ms)
                figures.append(_fig("save_p50_ms", statistics.median(lean_ms), "ms", memories=size))
                figures.append(_fig("save_p95_ms", _percentile(lean_ms, 0.95), "ms", memories=size))
                figures.append(_fig("save_p50_ms_httpx", statistics.median(httpx_ms), "ms", memories=size))
            items = [[{"content": _note(rng)} for _ in range(1000)] for _ in range(batches)]
            if not webhook:
                started = time.perf_counter()
                for batch in items:
                    lean.post("/v1/memories:batch", {"items": batch})
                elapsed = time.perf_counter() - started
                figures.append(_fig("batch_per_s", batches * 1000 / elapsed, "memories/s", batch_size=1000))
            else:
                figures += _batches_with_and_without_webhook(http, lean, items)
        lean.close()
    return figures


def _batches_with_and_without_webhook(
    http: httpx.Client, lean: _LeanClient, items: list[list[dict[str, Any]]]
) -> list[dict[str, Any]]:
    """batch_per_s with one enabled webhook subscribed to every memory event (its audit entries, delivery
    rows and job written with each batch) and with it disabled (audit entries only), alternating batch by
    batch so both see the same machine and tenant size. No worker runs: this is the write path's cost."""
    events = ["memory.created", "memory.updated", "memory.forgotten", "memory.purged"]
    created = http.post("/v1/webhooks", json={"url": "http://127.0.0.1:9/bench", "events": events})
    created.raise_for_status()
    hook = f"/v1/webhooks/{created.json()['id']}"
    seconds = {False: 0.0, True: 0.0}
    counts = {False: 0, True: 0}
    for i, batch in enumerate(items):
        enabled = i % 2 == 1
        http.patch(hook, json={"enabled": enabled}).raise_for_status()
        started = time.perf_counter()
        lean.post("/v1/memories:batch", {"items": batch})
        seconds[enabled] += time.perf_counter() - started
        counts[enabled] += len(batch)
    return [
        _fig("batch_per_s", counts[on] / seconds[on], "memories/s", batch_size=1000, webhooks=int(on))
        for on in (False, True)
        if counts[on]
    ]


def _fig(metric: str, value: float, unit: str, **params: Any) -> dict[str, Any]:
    return figure("write", metric, value, unit, **params)
