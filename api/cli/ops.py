"""`engram search` and `engram jobs`: the CLI face of search and of the job queue."""

# Imports inside the commands are deferred: `engram` loads only the command that runs (see api.cli).
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click
from engram_client import EngramClient, EngramConnectionError, EngramError

from api.cli.memory import emit, format_option


def _http(url: str | None, api_key: str | None) -> Any:
    from api.cli.memory import _default_url

    key = api_key or os.environ.get("ENGRAM_API_KEY")
    if not key:
        raise click.UsageError("give --api-key or set ENGRAM_API_KEY")
    return EngramClient(url or _default_url(), api_key=key)


def _call(client: Any, method: str, path: str, **kwargs: Any) -> Any:
    """A raw REST call of the CLI: its JSON answer, or the error printed as JSON and exit status 1."""
    try:
        return client.request(method, path, **kwargs)
    except EngramConnectionError as exc:
        raise click.ClickException(exc.message) from None
    except EngramError as exc:
        click.echo(json.dumps({"error": exc.error}), err=True)
        sys.exit(1)


connection_options = [
    click.option("--url", default=None, help="API URL (default: the running serve, or $ENGRAM_URL)"),
    click.option("--api-key", default=None, help="API key (default $ENGRAM_API_KEY)"),
]


def with_connection(fn: Any) -> Any:
    for option in reversed(connection_options):
        fn = option(fn)
    return fn


@click.command("search")
@click.argument("question", required=False)
@click.option("--entity", "entities", multiple=True, help="entity in hand (repeatable)")
@click.option("--datasource", default=None)
@click.option("--mode", default=None, type=click.Choice(["hybrid", "recent", "important", "typed"]))
@click.option("--kind", default=None)
@click.option("--category", default=None)
@click.option("--max-memories", type=int, default=None)
@click.option("--agent-id", default=None)
@click.option("--persona", default=None)
@format_option
@with_connection
def search(
    question: str | None,
    entities: tuple[str, ...],
    datasource: str | None,
    mode: str | None,
    kind: str | None,
    category: str | None,
    max_memories: int | None,
    agent_id: str | None,
    persona: str | None,
    fmt: str,
    url: str | None,
    api_key: str | None,
) -> None:
    """Search memories and catalog entities by question and/or entities."""
    body: dict[str, Any] = {
        "question": question,
        "entities": list(entities) or None,
        "datasource": datasource,
        "mode": mode,
        "kind": kind,
        "category": category,
        "max_memories": max_memories,
        "agent_id": agent_id,
        "persona": persona,
    }
    client = _http(url, api_key)
    try:
        result = _call(client, "POST", "/v1/search", json={k: v for k, v in body.items() if v is not None})
    finally:
        client.close()
    if fmt == "json":
        emit(result, fmt="json")
        return
    for bucket, columns in (
        ("memories", ("id", "score", "kind", "text")),
        ("example_queries", ("id", "score", "text")),
        ("entities", ("id", "kind", "score", "text")),
    ):
        if result.get(bucket):
            click.echo(f"{bucket}:")
            emit(result[bucket], fmt="table", rows=result[bucket], columns=columns)
    for warning in result.get("warnings", []):
        click.echo(f"warning: {warning}", err=True)


@click.group("jobs", invoke_without_command=True)
@click.option("--kind", default=None)
@click.option("--state", default=None, type=click.Choice(["queued", "running", "succeeded", "failed"]))
@click.option("--limit", type=int, default=None)
@format_option
@with_connection
@click.pass_context
def jobs(
    ctx: click.Context,
    kind: str | None,
    state: str | None,
    limit: int | None,
    fmt: str,
    url: str | None,
    api_key: str | None,
) -> None:
    """List jobs (the operator key sees every tenant); `engram jobs show|retry|wait ID`."""
    ctx.obj = {"url": url, "api_key": api_key, "fmt": fmt}
    if ctx.invoked_subcommand is not None:
        return
    client = _http(url, api_key)
    try:
        page = _call(client, "GET", "/v1/jobs", params={"kind": kind, "state": state, "limit": limit})
    finally:
        client.close()
    emit(page, fmt=fmt, rows=page.get("jobs", []), columns=("id", "kind", "state", "attempts", "updated_at", "error"))


def _job_command(ctx: click.Context, method: str, path: str) -> Any:
    client = _http(ctx.obj["url"], ctx.obj["api_key"])
    try:
        return _call(client, method, path)
    finally:
        client.close()


sub_format = click.option("--format", "fmt", type=click.Choice(["json", "table"]), default=None)


@jobs.command("show")
@click.argument("job_id")
@sub_format
@click.pass_context
def jobs_show(ctx: click.Context, job_id: str, fmt: str | None) -> None:
    """One job with its attempts and error."""
    emit(
        _job_command(ctx, "GET", f"/v1/jobs/{job_id}"),
        fmt=fmt or ctx.obj["fmt"],
        columns=("id", "kind", "state", "attempts", "error"),
    )


@jobs.command("retry")
@click.argument("job_id")
@sub_format
@click.pass_context
def jobs_retry(ctx: click.Context, job_id: str, fmt: str | None) -> None:
    """Queue a failed job again."""
    job = _job_command(ctx, "POST", f"/v1/jobs/{job_id}/retry")
    emit(job, fmt=fmt or ctx.obj["fmt"], columns=("id", "kind", "state"))


@jobs.command("wait")
@click.argument("job_id")
@click.option("--timeout", default=600.0, show_default=True)
@sub_format
@click.pass_context
def jobs_wait(ctx: click.Context, job_id: str, timeout: float, fmt: str | None) -> None:
    """Wait until a job succeeds or fails (exit 1 on failure)."""
    deadline = time.monotonic() + timeout
    while True:
        job = _job_command(ctx, "GET", f"/v1/jobs/{job_id}")
        if job["state"] in ("succeeded", "failed") or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    emit(job, fmt=fmt or ctx.obj["fmt"], columns=("id", "kind", "state", "attempts", "error"))
    if job["state"] != "succeeded":
        sys.exit(1)
