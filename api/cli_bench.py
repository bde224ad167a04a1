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
