"""`engram bench ...` and `engram eval ...`: figures printed as a table, or JSON lines with --json.

Each figure is `{"bench", "metric", "value", "unit", "params"}` (CONTRACT section 1). Benchmarks run on a
throwaway embedded home unless ENGRAM_DATABASE_URL / ENGRAM_REDIS_URL name real services.
"""

from __future__ import annotations

import json
from typing import Any

import click

json_option = click.option("--json", "as_json", is_flag=True, help="one JSON object per figure and line")


def figure(bench: str, metric: str, value: float, unit: str, **params: Any) -> dict[str, Any]:
    return {"bench": bench, "metric": metric, "value": round(float(value), 4), "unit": unit, "params": params}


def emit_figures(figures: list[dict[str, Any]], *, as_json: bool) -> None:
    if as_json:
        for f in figures:
            click.echo(json.dumps(f))
        return
    click.echo(f"{'bench':<8} {'metric':<16} {'value':>12} {'unit':<8} params")
    for f in figures:
        params = " ".join(f"{k}={v}" for k, v in f["params"].items())
        click.echo(f"{f['bench']:<8} {f['metric']:<16} {f['value']:>12.3f} {f['unit']:<8} {params}")


@click.group()
def bench() -> None:
    """Benchmarks that print figures."""


@click.group(name="eval")
def eval_() -> None:
    """Retrieval evaluation."""


@bench.command("write")
@click.option("--sizes", default="10000,100000", show_default=True, help="tenant sizes to measure at")
@click.option("--saves", default=500, show_default=True, help="single saves timed per size")
@click.option("--batches", default=20, show_default=True, help="batches of 1,000 timed for throughput")
@click.option("--port", default=0, type=int, help="API port (default: a free one)")
@json_option
def bench_write(sizes: str, saves: int, batches: int, port: int, as_json: bool) -> None:
    """Single-save latency over REST at each tenant size, and :batch throughput."""
    from core.bench.write import run
    from core.embedded import free_port

    figures = run(sizes=[int(s) for s in sizes.split(",")], saves=saves, batches=batches, port=port or free_port())
    emit_figures(figures, as_json=as_json)
