"""Process-local Prometheus metrics (the API exposes its own; workers' job figures come from the jobs table)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

EMBEDDING_CALLS = Counter("engram_embedding_calls_total", "Embedding provider calls", ["model"])
EMBEDDING_FAILURES = Counter("engram_embedding_failures_total", "Failed embedding provider calls", ["model"])
EMBEDDED_TEXTS = Counter("engram_embedded_texts_total", "Texts embedded", ["model"])
JOB_SECONDS = Histogram("engram_job_duration_seconds", "Job run time", ["kind", "state"])
SEARCH_CHANNEL_SECONDS = Histogram(
    "engram_search_channel_seconds",
    "Search latency per channel",
    ["channel"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)
# Per route template (never the raw path) and method; errors are the 5xx `status` series.
HTTP_REQUESTS = Counter("engram_http_requests_total", "HTTP requests answered", ["method", "route", "status"])
HTTP_REQUEST_SECONDS = Histogram(
    "engram_http_request_duration_seconds",
    "HTTP request duration, from the first byte in to the last byte out",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0),
)
