"""`engram bench search`: search latency per mode on a generated tenant.

Calls go through ``core.search.service.search`` in-process, in a ``tenant_session`` exactly as the
``POST /v1/search`` route does (the route adds only JSON parsing and serialisation), so the figures are
the service's, without HTTP. The caller is a member key acting as an agent, so visibility applies.
"""

from __future__ import annotations

import atexit
import base64
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from api.bench import figure, machine_speed_ms
from api.bench.corpus import Corpus, analyze, build_catalog, load_embeddings, load_memories
from api.bench.stack import bench_stack
from core.config import reset_settings_cache
from core.db import system_session, tenant_session
from core.embeddings import catalog_docs
from core.refs import memory_ref
from core.search.schemas import SearchRequest
from core.search.service import search
from core.tenancy.context import Caller
from core.tenancy.service import create_tenant, get_tenant_by_name

MODES: dict[str, Callable[[Corpus, random.Random], dict[str, Any]]] = {
    "hybrid": lambda c, r: {"entities": c.entities(r), "question": c.question(r)},
    "entities": lambda c, r: {"entities": c.entities(r)},
    "question": lambda c, r: {"question": c.question(r)},
    "recent": lambda c, r: {"mode": "recent"},
    "important": lambda c, r: {"mode": "important"},
    "typed": lambda c, r: {"mode": "typed", "kind": r.choice(("decision", "todo", "fact"))},
}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def build(*, memories: int, entities: int, log: Callable[[str], None]) -> Corpus:
    """Create a tenant and fill it; the full-text index is built by a first search (timed in the log)."""

    with system_session() as session:
        create_tenant(session, name="bench-search")
        tenant = get_tenant_by_name(session, name="bench-search")
        assert tenant is not None
        tenant_id = tenant.id
    started = time.perf_counter()
    source_dir = tempfile.mkdtemp(prefix="engram-bench-ds-")
    atexit.register(shutil.rmtree, source_dir, True)  # the catalog refers to it until the bench ends
    sqlite_path = Path(source_dir) / "bench.db"
    sqlite_path.touch()
    entity_ids = build_catalog(tenant_id=tenant_id, entities=entities, sqlite_path=str(sqlite_path))
    log(f"catalog: {len(entity_ids)} entities in {time.perf_counter() - started:.1f}s")
    started = time.perf_counter()
    docs = load_memories(tenant_id=tenant_id, count=memories, entity_ids=entity_ids)
    log(f"memories: {len(docs)} in {time.perf_counter() - started:.1f}s")
    started = time.perf_counter()
    with tenant_session(tenant_id) as session:
        catalog = [(d.canonical_id, d.doc_kind, d.text) for d in catalog_docs.all_docs(session)]
    load_embeddings(tenant_id=tenant_id, docs=[(memory_ref(i), "memory", t) for i, t in docs] + catalog)
    log(f"embeddings: {len(docs) + len(catalog)} in {time.perf_counter() - started:.1f}s")
    analyze()
    return Corpus(tenant_id=tenant_id, entity_ids=entity_ids)


def measure(corpus: Corpus, *, mode: str, queries: int, seed: int = 11) -> list[float]:
    """Milliseconds per search call for ``queries`` generated requests of ``mode``."""
    return measure_both(corpus, mode=mode, queries=queries, seed=seed)[0]


def measure_both(corpus: Corpus, *, mode: str, queries: int, seed: int = 11) -> tuple[list[float], list[float]]:
    """Wall and CPU milliseconds per search call (CPU of this process only: PostgreSQL's is not in it)."""
    timings, cpu, _ = measure_answers(corpus, mode=mode, queries=queries, seed=seed)
    return timings, cpu


def measure_answers(
    corpus: Corpus, *, mode: str, queries: int, seed: int = 11, pause: float = 0.0
) -> tuple[list[float], list[float], list[Any]]:
    """As `measure_both`, with the responses, so a figure can show what the timed calls answered; ``pause``:
    seconds this process sleeps before each call (untimed), as an API process that is not kept busy idles
    between requests."""

    caller = Caller(
        tenant_id=corpus.tenant_id,
        tenant_name="bench-search",
        user="bench@localhost",
        role="member",
        key_id="bench",
        agent_id="agent-1",
    )
    rng = random.Random(seed)
    timings, cpu, answers = [], [], []
    for _ in range(queries):
        request = SearchRequest(**MODES[mode](corpus, rng))
        if pause:
            time.sleep(pause)
        started, cpu_started = time.perf_counter(), time.process_time()
        with tenant_session(corpus.tenant_id) as session:
            answer = search(session, caller=caller, request=request)
        cpu.append((time.process_time() - cpu_started) * 1000)
        timings.append((time.perf_counter() - started) * 1000)
        answers.append(answer)
    return timings, cpu, answers


def run(*, memories: int, entities: int, queries: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """Figures p50_ms / p95_ms per mode, params memories, entities, mode; also cpu_p50_ms / cpu_p95_ms, the
    search process's own CPU per call (steady under machine load, unlike wall latency)."""

    # The machine's speed is printed first: wall figures on shared cores move with it.
    figures = [figure("search", "python_loop_ms", machine_speed_ms(), "ms", loop="1e6 additions, best of 5")]
    with bench_stack():
        if not os.environ.get("ENGRAM_SECRET_KEY"):
            # The throwaway home needs a key to store the generated datasource's (empty) credentials.
            os.environ["ENGRAM_SECRET_KEY"] = base64.urlsafe_b64encode(os.urandom(32)).decode()
            reset_settings_cache()
        corpus = build(memories=memories, entities=entities, log=log)
        started = time.perf_counter()
        measure(corpus, mode="question", queries=1)
        log(f"full-text index built by the first search in {time.perf_counter() - started:.1f}s")
        for mode in MODES:
            measure(corpus, mode=mode, queries=max(5, queries // 10))  # warm caches
            timings, cpu, answers = measure_answers(corpus, mode=mode, queries=queries)
            params = {"memories": memories, "entities": len(corpus.entity_ids), "mode": mode}
            figures.append(figure("search", "p50_ms", statistics.median(timings), "ms", **params))
            figures.append(figure("search", "p95_ms", percentile(timings, 0.95), "ms", **params))
            figures.append(figure("search", "cpu_p50_ms", statistics.median(cpu), "ms", **params))
            figures.append(figure("search", "cpu_p95_ms", percentile(cpu, 0.95), "ms", **params))
            # What the timed calls answered: a fast figure from a degraded or empty search means nothing.
            hits = [len(a.memories) for a in answers]
            figures.append(figure("search", "hits_mean", statistics.fmean(hits), "memories", **params))
            degraded = sum(1 for a in answers if a.degraded) / len(answers)
            figures.append(figure("search", "degraded_share", degraded, "ratio", **params))
    return figures
