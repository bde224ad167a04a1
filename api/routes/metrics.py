"""GET /metrics: Prometheus text for the operator key or a dashboard session.

Figures that describe the whole cluster are read from PostgreSQL at scrape time, so any API process gives
the same answer however many workers and replicas run: queue depth and oldest queued age per kind, job
durations (finished_at - started_at of each finished job's last attempt), embedding attempts and texts
(from the embed jobs' attempts and results), and embedding coverage. Search latency per channel is
measured where searches run, in the API process, and comes from that process's registry (or from every
API process of the host when PROMETHEUS_MULTIPROC_DIR is set: prometheus_client's multiprocess mode).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest, multiprocess
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from api.dashboard.routes import cached_coverage, require_operator
from api.routes.ops import reindex_progress
from api.threads import Route
from core.db import system_session
from core.jobs import queries
from core.jobs.models import JOB_KINDS, JOB_STATES

router = APIRouter(route_class=Route)

# The database collector owns these names; the process registry's same-named metrics are left out.
_DB_OWNED = {"engram_job_duration_seconds"}


class DatabaseCollector(Collector):
    """Cluster-wide figures computed from the jobs and embeddings tables at scrape time."""

    def collect(self) -> Iterator[Metric]:
        with system_session() as session:
            queue = queries.queue_figures(session)
            durations = queries.duration_histogram(session)
            embed = queries.embed_attempts(session)
        yield from _queue_metrics(queue)
        yield _duration_metric(durations)
        attempts = CounterMetricFamily(
            "engram_embed_job_attempts", "Embed job attempts across all workers, by outcome", labels=["outcome"]
        )
        attempts.add_metric(["succeeded"], embed["succeeded"])
        attempts.add_metric(["failed"], embed["failed"])
        yield attempts
        yield CounterMetricFamily(
            "engram_embed_job_texts", "Texts embedded by embed jobs across all workers", value=embed["embedded_texts"]
        )
        yield from _coverage_metrics(cached_coverage())
        yield from _reindex_metrics()


def _reindex_metrics() -> Iterator[Metric]:
    """The configured model's reindex: memories done and remaining, the rate, and whether it is paused."""

    body = reindex_progress()
    docs = GaugeMetricFamily(
        "engram_reindex_memories", "Memories embedded (done) and not yet (remaining) with the configured model",
        labels=["model", "state"],
    )
    docs.add_metric([body["model"], "done"], body["done"])
    docs.add_metric([body["model"], "remaining"], body["remaining"])
    yield docs
    yield GaugeMetricFamily(
        "engram_reindex_rate", "Texts a second the reindex jobs embedded over the last minute",
        value=body["rate_per_s"],
    )
    yield GaugeMetricFamily(
        "engram_reindex_paused", "1 while an operator has paused the reindex", value=int(body["state"] == "paused")
    )


def _queue_metrics(rows: Iterable[tuple[str, str, int, float | None]]) -> Iterator[Metric]:
    depth = GaugeMetricFamily("engram_jobs", "Jobs by kind and state", labels=["kind", "state"])
    oldest = GaugeMetricFamily(
        "engram_jobs_oldest_queued_age_seconds", "Age of the oldest queued job per kind (0: none)", labels=["kind"]
    )
    counts = {(kind, state): 0 for kind in JOB_KINDS for state in JOB_STATES}
    ages = dict.fromkeys(JOB_KINDS, 0.0)
    for kind, state, count, age in rows:
        counts[(kind, state)] = count
        if age is not None:
            ages[kind] = age
    for (kind, state), count in sorted(counts.items()):
        depth.add_metric([kind, state], count)
    for kind, age in sorted(ages.items()):
        oldest.add_metric([kind], age)
    yield depth
    yield oldest


def _duration_metric(rows: Iterable[tuple[str, str, list[int], int, float]]) -> Metric:
    metric = HistogramMetricFamily(
        "engram_job_duration_seconds", "Run time of each finished job's last attempt", labels=["kind", "state"]
    )
    for kind, state, buckets, count, total in rows:
        pairs = [(floatToGoString(bound), float(n)) for bound, n in zip(queries.DURATION_BUCKETS, buckets, strict=True)]
        metric.add_metric([kind, state], [*pairs, ("+Inf", float(count))], sum_value=total)
    return metric


def _coverage_metrics(rows: list[dict[str, Any]]) -> Iterator[Metric]:
    """Coverage summed over tenants by doc kind and model, and how many tenants are not fully covered. No
    tenant label: thousands of tenants would make thousands of series (per tenant: GET /v1/ops/coverage)."""
    labels = ["doc_kind", "model"]
    ratio = GaugeMetricFamily("engram_embedding_coverage_ratio", "Docs with a current embedding / docs", labels=labels)
    indexed = GaugeMetricFamily("engram_embedding_indexed_docs", "Docs with a current embedding", labels=labels)
    expected = GaugeMetricFamily("engram_embedding_expected_docs", "Docs that should have an embedding", labels=labels)
    behind = GaugeMetricFamily(
        "engram_embedding_tenants_behind", "Tenants whose coverage is below 1.0", labels=labels
    )
    totals: dict[tuple[str, str], list[int]] = {}
    for row in rows:
        total = totals.setdefault((row["doc_kind"], row["model"]), [0, 0, 0])
        total[0] += row["indexed"]
        total[1] += row["expected"]
        total[2] += row["ratio"] < 1.0
    for key, (done, wanted, lagging) in sorted(totals.items()):
        ratio.add_metric(list(key), 1.0 if wanted == 0 else min(1.0, done / wanted))
        indexed.add_metric(list(key), done)
        expected.add_metric(list(key), wanted)
        behind.add_metric(list(key), lagging)
    yield from (ratio, indexed, expected, behind)


class ProcessCollector(Collector):
    """This API process's own metrics (search latency per channel, synchronous embedding calls)."""

    def collect(self) -> Iterator[Metric]:
        source: Any = REGISTRY
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            source = CollectorRegistry()
            multiprocess.MultiProcessCollector(source)
        for metric in source.collect():
            if metric.name not in _DB_OWNED:
                yield metric


def render_metrics() -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ProcessCollector())
    registry.register(DatabaseCollector())
    return generate_latest(registry)


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request) -> Response:
    require_operator(request)
    return Response(render_metrics(), media_type=CONTENT_TYPE_LATEST)
