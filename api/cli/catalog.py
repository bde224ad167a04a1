"""`engram ingest DS [--wait]`: queue an ingest and, with --wait, follow it and its follow-up jobs."""

# Imports inside the commands are deferred: `engram` loads only the command that runs (see api.cli).
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import click
from engram_client import EngramClient, EngramConnectionError, EngramError

FOLLOW_UPS = ("refresh_samples", "ingest_cleanup", "embed")
POLL_SECONDS = 0.5


def _client(url: str | None, api_key: str | None) -> EngramClient:
    from api.cli.memory import _default_url

    key = api_key or os.environ.get("ENGRAM_API_KEY")
    if not key:
        raise click.UsageError("give --api-key or set ENGRAM_API_KEY")
    return EngramClient(url or _default_url(), api_key=key)


def _wait(client: EngramClient, job_id: str, *, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.request("GET", f"/v1/jobs/{job_id}")
        if job["state"] in ("succeeded", "failed"):
            return job
        if time.monotonic() > deadline:
            raise click.ClickException(f"job {job_id} still {job['state']} after {timeout:.0f} s")
        time.sleep(POLL_SECONDS)


@click.command("ingest")
@click.argument("datasource")
@click.option("--wait", is_flag=True, help="follow the ingest and its follow-up jobs to the end")
@click.option("--timeout", default=1800.0, show_default=True, help="seconds to wait with --wait")
@click.option("--url", default=None, help="API URL (default: the running serve, or $ENGRAM_URL)")
@click.option("--api-key", default=None, help="API key (default $ENGRAM_API_KEY)")
@click.option("--format", "fmt", type=click.Choice(["json", "table"]), default="table", show_default=True)
def ingest(datasource: str, wait: bool, timeout: float, url: str | None, api_key: str | None, fmt: str) -> None:
    """Reflect DATASOURCE's tables into the catalog (then samples, cleanup and embeddings)."""
    client = _client(url, api_key)
    try:
        job_id = client.request("POST", f"/v1/datasources/{datasource}/ingest")["job_id"]
        if not wait:
            click.echo(json.dumps({"job_id": job_id}) if fmt == "json" else f"ingest queued: job {job_id}")
            return
        jobs: dict[str, dict[str, Any]] = {}
        # One step for the ingest itself, one per follow-up job it queues.
        with click.progressbar(length=1 + len(FOLLOW_UPS), label=f"ingest {datasource}", file=sys.stderr) as bar:
            jobs["ingest"] = _wait(client, job_id, timeout=timeout)
            bar.update(1)
            if jobs["ingest"]["state"] == "succeeded":
                for kind, follow_id in (jobs["ingest"].get("result") or {}).get("follow_up_jobs", {}).items():
                    jobs[kind] = _wait(client, follow_id, timeout=timeout)
                    bar.update(1)
    except EngramConnectionError as exc:
        raise click.ClickException(exc.message) from None
    except EngramError as exc:
        click.echo(json.dumps({"error": exc.error}), err=True)
        sys.exit(1)
    finally:
        client.close()
    _report(jobs, fmt=fmt)
    if any(j["state"] == "failed" for j in jobs.values()):
        sys.exit(1)


def _report(jobs: dict[str, dict[str, Any]], *, fmt: str) -> None:
    if fmt == "json":
        click.echo(
            json.dumps(
                {
                    k: {"id": j["id"], "state": j["state"], "error": j["error"], "result": j["result"]}
                    for k, j in jobs.items()
                },
                indent=2,
            )
        )
        return
    for kind, job in jobs.items():
        result = job.get("result") or {}
        detail = job["error"] or ", ".join(
            f"{k}={v}" for k, v in result.items() if isinstance(v, int | str) and k != "change_seq"
        )
        click.echo(f"{kind:<16} {job['state']:<10} {detail}")
