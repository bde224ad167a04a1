"""`engram bench embed`: the raw embedder's throughput, and the pipeline's end to end (saves through the
REST API until coverage reaches 1.0, with a real Celery worker doing the embedding)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from typing import Any

import httpx
from sqlalchemy import text

from api.bench import figure
from api.bench.stack import api_process, bench_stack
from api.bench.write import _note
from core.config import get_settings
from core.db import system_connection, system_session
from core.embeddings.providers import get_embedder
from core.runtime import engram_command
from core.tenancy.service import create_tenant

_WORDS_SEED = 11


def _embedder() -> Any:
    return get_embedder(get_settings().embedding_model)


def raw_throughput(*, texts: int, batch_size: int) -> float:
    """Texts per second of the configured embedder alone (in this process)."""
    embedder = _embedder()
    rng = random.Random(_WORDS_SEED)
    corpus = [_note(rng) for _ in range(texts)]
    embedder.embed_documents(corpus[:batch_size])  # load the model outside the timing
    started = time.perf_counter()
    for start in range(0, texts, batch_size):
        embedder.embed_documents(corpus[start : start + batch_size])
    return texts / (time.perf_counter() - started)


def _coverage_complete(http: httpx.Client, expected: int) -> bool:
    rows = http.get("/v1/ops/coverage").json()["coverage"]
    return any(r["doc_kind"] == "memory" and r["indexed"] == expected for r in rows)


def run(*, memories: int, batch_size: int, port: int) -> list[dict[str, Any]]:
    model = _embedder().name
    raw = raw_throughput(texts=memories, batch_size=batch_size)
    figures = [_fig("raw_per_s", raw, "texts/s", texts=memories, model=model)]
    rng = random.Random(_WORDS_SEED)
    with bench_stack() as stack, api_process(stack, port=port) as url:
        with system_session() as session:
            key = create_tenant(session, name="bench-embed").api_key
        log = open(stack.home / "worker.log", "wb")  # noqa: SIM115
        worker = subprocess.Popen(
            [*engram_command(), "worker", "--concurrency", "2"],
            env={**os.environ, **stack.env, "ENGRAM_EMBEDDING_BATCH_SIZE": str(batch_size)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        started_wall: float | None = None
        try:
            deadline = time.monotonic() + 60
            # `engram worker` runs a Celery process per lane: both are ready when "ready." shows twice.
            while (stack.home / "worker.log").read_bytes().count(b"ready.") < 2:
                if worker.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("worker did not start")
                time.sleep(0.1)
            items = [{"content": _note(rng)} for _ in range(memories)]
            with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
                started, started_wall = time.perf_counter(), time.time()
                for start in range(0, memories, 1000):
                    http.post("/v1/memories:batch", json={"items": items[start : start + 1000]}).raise_for_status()
                while not _coverage_complete(http, memories):
                    time.sleep(0.25)  # the coverage query is not free: do not let polling slow the pipeline
                elapsed = time.perf_counter() - started
        finally:
            _print_job_timings(started_wall)
            worker.terminate()
            worker.wait(timeout=30)
            log.close()
    figures.append(_fig("pipeline_per_s", memories / elapsed, "memories/s", memories=memories, model=model))
    figures.append(_fig("pipeline_ratio", memories / elapsed / raw, "ratio", memories=memories, model=model))
    return figures


def _print_job_timings(started_wall: float | None) -> None:
    """Where the pipeline's time went: embed job durations from the jobs table (stderr).

    `mean wait` is from the job row's creation (in its save's transaction) to a worker starting it: the
    rest of the save, the outbox relay's and the broker's latency, and time queued behind other jobs;
    `relayed after` is the part up to the relay claiming the row.
    """


    with system_connection() as connection:  # every tenant's jobs
        row = connection.execute(
            text(
                "SELECT count(*), avg(extract(epoch FROM finished_at - started_at)),"
                " extract(epoch FROM max(finished_at) - min(created_at)),"
                " avg(extract(epoch FROM started_at - created_at)),"
                " avg(extract(epoch FROM dispatched_at - created_at)),"
                " extract(epoch FROM min(created_at)), extract(epoch FROM min(started_at)),"
                " extract(epoch FROM max(finished_at))"
                " FROM jobs WHERE kind = 'embed'"
            )
        ).one()
    if started_wall is not None and row[5] is not None:
        first_queued, first_started, last_done = (float(v) - started_wall for v in row[5:8])
        print(
            f"from the first save: first job queued +{first_queued:.2f}s, first started"
            f" +{first_started:.2f}s, last done +{last_done:.2f}s,"
            f" coverage seen complete +{time.time() - started_wall:.2f}s",
            file=sys.stderr,
        )
    print(
        f"embed jobs: {row[0]}, mean run {row[1] or 0:.3f}s, first queued to last done {row[2] or 0:.2f}s,"
        f" mean wait {row[3] or 0:.3f}s (relayed after {row[4] or 0:.3f}s)",
        file=sys.stderr,
    )


def _fig(metric: str, value: float, unit: str, **params: Any) -> dict[str, Any]:
    return figure("embed", metric, value, unit, **params)
