"""Benchmarks behind `engram bench` and `engram eval`: each returns figures shaped as CONTRACT section 1."""

from __future__ import annotations

import time
from typing import Any


def figure(bench: str, metric: str, value: float, unit: str, **params: Any) -> dict[str, Any]:
    """One figure: `{"bench", "metric", "value", "unit", "params"}`."""
    return {"bench": bench, "metric": metric, "value": round(float(value), 4), "unit": unit, "params": params}


def machine_speed_ms(rounds: int = 5) -> float:
    """Milliseconds for a fixed pure-Python loop (best of ``rounds``): how fast this machine runs Python right
    now. Shared cloud cores here have moved by 30-40% within an hour, so latency figures are printed with it."""
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i
        best = min(best, time.perf_counter() - started)
    return best * 1000
