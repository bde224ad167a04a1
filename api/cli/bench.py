"""`engram bench ...` and `engram eval ...`: figures printed as a table, or JSON lines with --json.

Each figure is `{"bench", "metric", "value", "unit", "params"}` (CONTRACT section 1). Benchmarks run on a
throwaway embedded home unless ENGRAM_DATABASE_URL / ENGRAM_REDIS_URL name real services.
"""

# Imports inside the commands are deferred: `engram` loads only the command that runs (see api.cli), and a
# benchmark's stack (api.bench) only when one is run.
from __future__ import annotations

import json
import os
from typing import Any

import click

json_option = click.option("--json", "as_json", is_flag=True, help="one JSON object per figure and line")


def emit_figures(figures: list[dict[str, Any]], *, as_json: bool) -> None:
    if as_json:
        for f in figures:
            click.echo(json.dumps(f))
        return
    click.echo(f"{'bench':<8} {'metric':<20} {'value':>12} {'unit':<8} params")
    for f in figures:
        params = " ".join(f"{k}={v}" for k, v in f["params"].items())
        click.echo(f"{f['bench']:<8} {f['metric']:<20} {f['value']:>12.3f} {f['unit']:<8} {params}")


@click.group()
def bench() -> None:
    """Benchmarks that print figures."""
    # Benchmarks build their sources on this machine (SQLite in /tmp, the local PostgreSQL), as serve does.
    os.environ.setdefault("ENGRAM_DATASOURCE_POLICY", "local")


@click.group(name="eval")
def eval_() -> None:
    """Retrieval evaluation."""


@bench.command("write")
@click.option("--sizes", default="10000,100000", show_default=True, help="tenant sizes to measure at")
@click.option("--saves", default=500, show_default=True, help="single saves timed per size")
@click.option("--batches", default=20, show_default=True, help="batches of 1,000 timed for throughput")
@click.option("--port", default=0, type=int, help="API port (default: a free one)")
@click.option("--webhook", is_flag=True, help="batch_per_s with one webhook registered and without (alternating)")
@json_option
def bench_write(sizes: str, saves: int, batches: int, port: int, webhook: bool, as_json: bool) -> None:
    """Single-save latency over REST at each tenant size, and :batch throughput."""
    from api.bench.write import run
    from api.serve.embedded import free_port

    tenant_sizes = [int(s) for s in sizes.split(",")]
    figures = run(sizes=tenant_sizes, saves=saves, batches=batches, port=port or free_port(), webhook=webhook)
    emit_figures(figures, as_json=as_json)


@bench.command("search")
@click.option("--memories", default=10_000, show_default=True, help="memories in the generated tenant")
@click.option("--entities", default=1_000, show_default=True, help="catalog entities the memories link to")
@click.option("--queries", default=200, show_default=True, help="timed searches per mode")
@json_option
def bench_search(memories: int, entities: int, queries: int, as_json: bool) -> None:
    """Search p50/p95 per mode on a generated tenant (in-process calls of the service the API uses)."""
    from api.bench.search import run

    figures = run(memories=memories, entities=entities, queries=queries, log=lambda m: click.echo(m, err=True))
    emit_figures(figures, as_json=as_json)


@bench.command("load")
@click.option("--clients", default=50, show_default=True, help="concurrent clients (at most 1,000)")
@click.option("--seconds", default=60.0, show_default=True, help="length of the run (at most 600)")
@click.option(
    "--url", default=None, help="a running API, http://127.0.0.1:<port> only (default: start a throwaway serve)"
)
@click.option("--key", envvar="ENGRAM_API_KEY", default=None, help="tenant API key for --url (or ENGRAM_API_KEY)")
@click.option(
    "--tenants", default=1, show_default=True, help="spread the clients over this many tenants (throwaway serve only)"
)
@click.option(
    "--rate",
    default=None,
    type=float,
    help="pace the clients to this many requests a second in all (default: each sends as soon as answered)",
)
@click.option(
    "--replicas",
    default=1,
    show_default=True,
    help="API replicas on the throwaway serve's database, each tenant's clients sent to one (at most the tenants)",
)
@json_option
def bench_load(
    clients: int,
    seconds: float,
    url: str | None,
    key: str | None,
    tenants: int,
    rate: float | None,
    replicas: int,
    as_json: bool,
) -> None:
    """Mixed load (60% search, 30% save, 10% get): statuses, latencies, lost writes, /healthz latency."""
    from api.bench.load import run

    try:
        figures = run(
            url=url,
            key=key,
            clients=clients,
            seconds=seconds,
            tenants=tenants,
            rate=rate,
            replicas=replicas,
            log=lambda m: click.echo(m, err=True),
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    emit_figures(figures, as_json=as_json)


@eval_.command("retrieval")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--limit", default=0, help="only the first N conversations (0: all)")
@click.option(
    "--form",
    type=click.Choice(["run", "content"]),
    default="run",
    show_default=True,
    help="run: turns saved with their session as run_id and tag; content: content and occurred_at only",
)
@json_option
def eval_retrieval(file: str, limit: int, form: str, as_json: bool) -> None:
    """Recall@5/10/20 (overall and per category) and search latency over a LoCoMo-shaped file."""
    from api.bench.retrieval import run

    figures = run(path=file, limit=limit, log=lambda m: click.echo(m, err=True), content_only=form == "content")
    emit_figures(figures, as_json=as_json)


@bench.command("ingest")
@click.option("--rows", default=1_000_000, show_default=True, help="rows of the generated 20-column table")
@click.option(
    "--pg-url",
    default="postgresql+psycopg://postgres@127.0.0.1:5432/test",
    show_default=True,
    help="PostgreSQL source server (skipped with a message when it does not answer)",
)
@json_option
def bench_ingest(rows: int, pg_url: str, as_json: bool) -> None:
    """Time ingest + profiling of a generated table in SQLite and PostgreSQL (the job's code path)."""
    from api.bench import figure
    from api.bench.ingest import run_ingest_bench

    emit_figures(run_ingest_bench(rows=rows, pg_url=pg_url, figure=figure), as_json=as_json)


@bench.command("embed")
@click.option("--memories", default=10_000, show_default=True)
@click.option("--batch-size", default=64, show_default=True, help="texts per embedding call")
@click.option("--port", default=0, type=int, help="API port (default: a free one)")
@click.option(
    "--model",
    default=None,
    help="embedding model for both figures (default: ENGRAM_EMBEDDING_MODEL, else the bundled one)",
)
@json_option
def bench_embed(memories: int, batch_size: int, port: int, model: str | None, as_json: bool) -> None:
    """Raw embedder throughput, and the pipeline end to end (saves until coverage 1.0)."""
    from api.bench.embed import run
    from api.serve.embedded import free_port
    from core.config import reset_settings_cache

    if model:
        os.environ["ENGRAM_EMBEDDING_MODEL"] = model  # the API and worker processes inherit it
        reset_settings_cache()

    emit_figures(run(memories=memories, batch_size=batch_size, port=port or free_port()), as_json=as_json)


@bench.command("fairness")
@click.option("--backlog", default=40_000, show_default=True, help="memories tenant A imports in batches of 1,000")
@click.option("--interval", default=1.0, show_default=True, help="seconds between tenant B's single saves")
@click.option("--operator-tenants", default=1000, show_default=True, help="tenants added for the operator's coverage")
@click.option("--port", default=0, type=int, help="API port (default: a free one)")
@json_option
def bench_fairness(backlog: int, interval: float, operator_tenants: int, port: int, as_json: bool) -> None:
    """Tenant B's fresh saves (wait for their vectors) while tenant A's import drains; coverage meanwhile."""
    from api.bench.fairness import run
    from api.serve.embedded import free_port

    figures = run(backlog=backlog, interval=interval, port=port or free_port(), operator_tenants=operator_tenants)
    emit_figures(figures, as_json=as_json)


@bench.command("tenants")
@click.option("--tenants", default=1_000, show_default=True, help="tenants to create (one in 100 is large)")
@click.option("--searches", default=5_000, show_default=True, help="HTTP searches, Zipf-skewed over tenants")
@click.option("--large-size", default=50_000, show_default=True, help="memories in each large tenant")
@click.option("--max-seconds", default=600.0, show_default=True, help="stop searching after this long")
@json_option
def bench_tenants(tenants: int, searches: int, large_size: int, max_seconds: float, as_json: bool) -> None:
    """Search latency (warm and cold tenants), API RSS and open files with many long-tailed tenants."""
    from api.bench.tenants import run

    figures = run(
        tenants=tenants,
        searches=searches,
        large_size=large_size,
        max_seconds=max_seconds,
        log=lambda m: click.echo(m, err=True),
    )
    emit_figures(figures, as_json=as_json)
