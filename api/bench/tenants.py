"""`engram bench tenants`: search over many tenants of long-tailed sizes, through a real API process.

A hosted engram serves thousands of tenants, most small and a few large, and searches spread over them
with a skew. This bench builds that shape on a throwaway stack (COPY, as `bench search` does), starts one
real `engram api` process, and sends searches over HTTP to tenants drawn from a Zipf distribution over a
random order of the tenants (so the popular tenants are not simply the large ones). It reports latency per
mode for warm tenants, the first search of each tenant in the process separately (``cold_p95_ms``: the
per-tenant state the process builds then), the API process's RSS and its open file descriptors.

A search with a question needs state a search without one never loads (the tenant's full-text index,
built from PostgreSQL when its directory is empty, and its vector matrix), so the first search with a
question of a tenant whose first search had none (``entities``, ``recent``) pays most of the cold cost
again. It is counted apart (``first_question_p*``), neither warm nor cold: warm figures are searches whose
tenant already made a search of the same kind (with a question or without) in the process.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import psutil

from api.bench import figure
from api.bench.corpus import analyze, load_memories, load_tenant_embeddings
from api.bench.search import percentile
from api.bench.stack import api_server, bench_stack
from api.serve.embedded import free_port
from core.config import get_settings
from core.db import system_session
from core.refs import memory_ref
from core.tenancy.service import create_tenant, get_tenant_by_name

_QUESTIONS = (
    "how do we compute {subject}",
    "why does {subject} look doubled",
    "which column holds {col} for {subject}",
    "{subject} excluding refunds",
)
_SUBJECTS = ("revenue", "refunds", "shipping", "churn", "invoice", "payment", "inventory", "latency")
_COLUMNS = ("amount", "status", "country", "currency", "price", "quantity")
MODES = ("hybrid", "question", "entities", "recent")
QUESTION_MODES = frozenset({"hybrid", "question"})


@dataclass
class TenantSpec:
    name: str
    tenant_id: int
    api_key: str
    size: int


def tenant_sizes(*, tenants: int, large_size: int, rng: random.Random) -> list[int]:
    """Long-tailed sizes: one tenant in a hundred holds ``large_size`` memories, the rest 100-1,000
    (log-uniform, so most sit near the bottom of that range)."""
    n_large = tenants // 100
    small = [int(100 * 10 ** rng.random()) for _ in range(tenants - n_large)]
    return [large_size] * n_large + small


def zipf_weights(n: int, *, s: float = 1.1) -> list[float]:
    return [1.0 / (rank**s) for rank in range(1, n + 1)]


def _entity_ids() -> list[str]:
    return [f"shop.{s}.{c}" for s in _SUBJECTS for c in _COLUMNS]


def build(*, tenants: int, large_size: int, seed: int, log: Callable[[str], None]) -> list[TenantSpec]:
    """Create the tenants and COPY their memories and vectors in; one HNSW build at the end."""

    rng = random.Random(seed)
    sizes = tenant_sizes(tenants=tenants, large_size=large_size, rng=rng)
    specs: list[TenantSpec] = []
    started = time.perf_counter()
    for i, size in enumerate(sizes):
        name = f"bench-t{i:05d}"
        with system_session() as session:
            issued = create_tenant(session, name=name)
            tenant = get_tenant_by_name(session, name=name)
            assert tenant is not None
            specs.append(TenantSpec(name=name, tenant_id=tenant.id, api_key=issued.api_key, size=size))
    log(f"tenants: {len(specs)} in {time.perf_counter() - started:.1f}s")
    started = time.perf_counter()
    entity_ids = _entity_ids()
    docs: list[tuple[int, list[tuple[str, str]]]] = []
    for spec in specs:
        docs.append((spec.tenant_id, load_memories(tenant_id=spec.tenant_id, count=spec.size, entity_ids=entity_ids)))
    log(f"memories: {sum(s.size for s in specs)} in {time.perf_counter() - started:.1f}s")
    started = time.perf_counter()
    # The HNSW index is built only when a tenant is large enough to be searched through it, as reconcile
    # builds it in a running deployment (core.embeddings.hnsw); smaller tenants rank on exact cosine.

    load_tenant_embeddings(
        [(tenant_id, [(f"memory:{i}", "memory", t) for i, t in tenant_docs]) for tenant_id, tenant_docs in docs],
        with_hnsw=max(sizes) > get_settings().dense_exact_max_docs,
    )
    log(f"embeddings and HNSW in {time.perf_counter() - started:.1f}s")

    analyze()
    return specs


def _request(mode: str, spec: TenantSpec, rng: random.Random) -> dict[str, Any]:
    question = rng.choice(_QUESTIONS).format(subject=rng.choice(_SUBJECTS), col=rng.choice(_COLUMNS))
    entity = memory_ref(str(rng.randint(1, spec.size)))
    if mode == "hybrid":
        return {"question": question, "entities": [entity]}
    if mode == "question":
        return {"question": question}
    if mode == "entities":
        return {"entities": [entity]}
    return {"mode": "recent"}


@dataclass
class Sample:
    mode: str
    ms: float
    cold: bool
    status: int
    # The tenant's first search with a question, after a first search without one (see the module doc).
    first_question: bool = False

    @property
    def warm(self) -> bool:
        return not self.cold and not self.first_question


def drive(*, url: str, specs: list[TenantSpec], searches: int, seed: int, deadline: float) -> list[Sample]:
    """``searches`` sequential HTTP searches (bounded by ``deadline``), tenants drawn Zipf-skewed."""
    rng = random.Random(seed)
    order = list(specs)
    rng.shuffle(order)  # popularity is independent of size
    weights = zipf_weights(len(order))
    seen: set[int] = set()
    asked: set[int] = set()  # tenants that made a search with a question
    samples: list[Sample] = []
    with httpx.Client(base_url=url, timeout=30.0) as client:
        for i in range(searches):
            if time.monotonic() > deadline:
                break
            spec = rng.choices(order, weights=weights)[0]
            mode = MODES[i % len(MODES)]
            body = _request(mode, spec, rng)
            cold = spec.tenant_id not in seen
            first_question = not cold and mode in QUESTION_MODES and spec.tenant_id not in asked
            seen.add(spec.tenant_id)
            if mode in QUESTION_MODES:
                asked.add(spec.tenant_id)
            started = time.perf_counter()
            response = client.post("/v1/search", json=body, headers={"Authorization": f"Bearer {spec.api_key}"})
            samples.append(
                Sample(
                    mode=mode,
                    ms=(time.perf_counter() - started) * 1000,
                    cold=cold,
                    status=response.status_code,
                    first_question=first_question,
                )
            )
    return samples


def process_figures(pid: int) -> tuple[float, int]:
    """The API process's resident memory (MB) and open file descriptors."""

    process = psutil.Process(pid)
    return process.memory_info().rss / 2**20, process.num_fds()


def run(
    *,
    tenants: int,
    searches: int,
    large_size: int,
    max_seconds: float,
    seed: int = 5,
    log: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Figures p50/p95/p99 per mode (warm), cold_p95_ms, cold_share, first_question_p95_ms, rss_mb and
    open_files, params tenants."""
    figures: list[dict[str, Any]] = []
    with bench_stack() as stack:
        specs = build(tenants=tenants, large_size=large_size, seed=seed, log=log)
        memories = sum(s.size for s in specs)
        with api_server(stack, port=free_port()) as (url, pid):
            rss_idle, fds_idle = process_figures(pid)
            started = time.perf_counter()
            samples = drive(url=url, specs=specs, searches=searches, seed=seed, deadline=time.monotonic() + max_seconds)
            log(f"{len(samples)} searches in {time.perf_counter() - started:.1f}s")
            rss, fds = process_figures(pid)
    base = {"tenants": tenants, "memories": memories}
    failed = [s for s in samples if s.status != 200]
    figures.append(figure("tenants", "searches", len(samples), "count", **base))
    figures.append(figure("tenants", "non_2xx", len(failed), "count", **base))
    for mode in MODES:
        warm = [s.ms for s in samples if s.mode == mode and s.warm]
        if not warm:
            continue
        params = {**base, "mode": mode}
        figures.append(figure("tenants", "p50_ms", statistics.median(warm), "ms", **params))
        figures.append(figure("tenants", "p95_ms", percentile(warm, 0.95), "ms", **params))
        figures.append(figure("tenants", "p99_ms", percentile(warm, 0.99), "ms", **params))
    cold = [s.ms for s in samples if s.cold]
    if cold:
        figures.append(figure("tenants", "cold_p95_ms", percentile(cold, 0.95), "ms", **base))
        figures.append(figure("tenants", "cold_p50_ms", statistics.median(cold), "ms", **base))
    figures.append(figure("tenants", "cold_share", len(cold) / max(1, len(samples)), "ratio", **base))
    first = [s.ms for s in samples if s.first_question]
    if first:
        figures.append(figure("tenants", "first_question_p95_ms", percentile(first, 0.95), "ms", **base))
        figures.append(figure("tenants", "first_question_p50_ms", statistics.median(first), "ms", **base))
    figures.append(figure("tenants", "first_questions", len(first), "count", **base))
    figures.append(figure("tenants", "tenants_touched", len(cold), "count", **base))
    figures.append(figure("tenants", "rss_mb", rss, "MB", **base))
    figures.append(figure("tenants", "rss_idle_mb", rss_idle, "MB", **base))
    figures.append(figure("tenants", "open_files", fds, "count", **base))
    figures.append(figure("tenants", "open_files_idle", fds_idle, "count", **base))
    return figures
