"""Benchmarks behind `engram bench` and `engram eval`: each returns figures shaped as CONTRACT section 1."""

from __future__ import annotations

from typing import Any


def figure(bench: str, metric: str, value: float, unit: str, **params: Any) -> dict[str, Any]:
    """One figure: `{"bench", "metric", "value", "unit", "params"}`."""
    return {"bench": bench, "metric": metric, "value": round(float(value), 4), "unit": unit, "params": params}
