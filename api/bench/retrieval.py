"""`engram eval retrieval FILE`: recall@k of question-only search over LoCoMo-shaped conversations.

Each conversation becomes its own tenant on a throwaway stack. Its turns are saved through the memory
service's batch path (the one behind ``POST /v1/memories:batch``): the turn id is the memory id, the
content is kept as given (it starts with the speaker), the session date becomes ``occurred_at`` and
the session name a tag. Embeddings are computed by the embed pipeline's own ``embed_docs`` with the
configured model (``content_only``: content and session date only, no run id or tag).
Every question is then asked through ``core.search.service.search`` (what the API
calls) with ``question`` only; recall@k is the share of a question's gold turns among the top k
memory hits, averaged over questions, overall and per category.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from api.bench import figure
from api.bench.corpus import analyze
from api.bench.stack import bench_stack
from core.config import get_settings
from core.db import system_session, tenant_session
from core.embeddings.providers import get_embedder
from core.embeddings.refresh import embed_docs
from core.errors import EngramError, Invalid
from core.memories.ids import validate_memory_id
from core.memories.schemas import MAX_CONTENT_BYTES, SaveMemoryIn
from core.memories.service import save_memories
from core.refs import memory_ref
from core.search.schemas import MAX_QUESTION_CHARS, SearchRequest
from core.search.service import search
from core.tenancy.context import Caller
from core.tenancy.service import create_tenant, get_tenant_by_name

KS = (5, 10, 20)
BATCH = 500


def parse_session_date(value: str | None) -> datetime | None:
    """'1:56 pm on 8 May, 2023' -> an aware datetime (UTC); None when absent or unreadable."""
    if not value:
        return None
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%d %B, %Y", "%Y-%m-%d"):
        try:
            return datetime.strptime(value.strip(), fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def memory_ids(turns: list[dict[str, Any]]) -> dict[str, str]:
    """Turn id -> the memory id it is saved under: itself when the memory API accepts it, else ``t<n>``.

    LoCoMo's own turn ids look like ``D1:3``, and ``:`` is not allowed in a memory id (CONTRACT section 4).
    """

    mapping: dict[str, str] = {}
    taken = {str(turn["id"]) for turn in turns}
    for n, turn in enumerate(turns):
        turn_id = str(turn["id"])
        try:
            mapping[turn_id] = validate_memory_id(turn_id)
        except Invalid:
            mapping[turn_id] = next(f"t{n}-{k}" for k in range(len(turns) + 1) if f"t{n}-{k}" not in taken)
            taken.add(mapping[turn_id])
    return mapping


def _save_item(
    conversation: dict[str, Any], turn: dict[str, Any], memory_id: str, *, content_only: bool = False
) -> Any:
    """The save of one turn; a turn whose extras the API would refuse (an over-long content, run id or
    speaker) is saved with its content clipped to the limit and without them, rather than not at all."""


    content = str(turn.get("content") or "").strip() or "(empty turn)"
    session = turn.get("session")
    if content_only:
        # The form an independent benchmark also uses: content and event time, nothing that groups turns.
        occurred_at = parse_session_date(turn.get("session_date"))
        try:
            return SaveMemoryIn(id=memory_id, content=content, occurred_at=occurred_at)
        except ValidationError:
            clipped = content.encode()[:MAX_CONTENT_BYTES].decode(errors="ignore")
            return SaveMemoryIn(id=memory_id, content=clipped, occurred_at=occurred_at)
    try:
        return SaveMemoryIn(
            id=memory_id,
            content=content,
            kind="event",
            category="workspace",
            occurred_at=parse_session_date(turn.get("session_date")),
            tags=[session] if session else [],
            run_id=f"{conversation['conversation']}-{session}" if session else None,
            source=turn.get("speaker"),
        )
    except ValidationError:
        clipped = content.encode()[:MAX_CONTENT_BYTES].decode(errors="ignore")
        return SaveMemoryIn(id=memory_id, content=clipped, kind="event", category="workspace")


def load_conversation(
    *,
    tenant_id: int,
    conversation: dict[str, Any],
    log: Callable[[str], None] = lambda _: None,
    content_only: bool = False,
) -> dict[str, str]:
    """Save the conversation's turns and embed them; returns memory id -> turn id of the turns saved."""

    caller = Caller(tenant_id=tenant_id, tenant_name="eval", user="eval@localhost", role="admin", key_id="eval")
    turns = conversation["memories"]
    ids = memory_ids(turns)
    for start in range(0, len(turns), BATCH):
        batch = turns[start : start + BATCH]
        items = [_save_item(conversation, turn, ids[str(turn["id"])], content_only=content_only) for turn in batch]
        with tenant_session(tenant_id) as session:
            results = save_memories(session, caller=caller, items=items)
        for turn, result in zip(batch, results, strict=True):
            if isinstance(result, EngramError):
                # Counted against recall (its gold can never be found), but the evaluation goes on.
                log(f"turn {turn['id']} not saved: {result.message}")
                ids.pop(str(turn["id"]))
    embedder = get_embedder(get_settings().embedding_model)
    with tenant_session(tenant_id) as session:
        embed_docs(
            session,
            tenant_id=tenant_id,
            doc_ids=[memory_ref(memory_id) for memory_id in ids.values()],
            embedder=embedder,
            batch_size=256,
        )
    return {memory_id: turn_id for turn_id, memory_id in ids.items()}


def ask(*, tenant_id: int, question: str) -> tuple[list[str], float]:
    """(memory ids best first, milliseconds) for a question-only search of depth max(KS)."""

    caller = Caller(tenant_id=tenant_id, tenant_name="eval", user="eval@localhost", role="admin", key_id="eval")
    request = SearchRequest(
        question=question[:MAX_QUESTION_CHARS], max_memories=max(KS), max_example_queries=0, max_entities=0
    )
    started = time.perf_counter()
    with tenant_session(tenant_id) as session:
        response = search(session, caller=caller, request=request)
    return [h.id for h in response.memories], (time.perf_counter() - started) * 1000


def evaluate(
    *, conversations: list[dict[str, Any]], log: Callable[[str], None], content_only: bool = False
) -> list[dict[str, Any]]:
    """Figures for already-started services: recall per k and category, and search_p50_ms."""

    recalls: dict[str, dict[int, list[float]]] = defaultdict(lambda: {k: [] for k in KS})
    latencies: list[float] = []
    for number, given in enumerate(conversations, start=1):
        conversation = {**given, "conversation": str(given.get("conversation", number))}
        name = f"eval-{number}-{int(time.time() * 1000)}"  # the file's own ids may not make a tenant name
        with system_session() as session:
            create_tenant(session, name=name)
            tenant = get_tenant_by_name(session, name=name)
            assert tenant is not None
            tenant_id = tenant.id
        turn_of = load_conversation(tenant_id=tenant_id, conversation=conversation, log=log, content_only=content_only)
        # Timed in the state autovacuum brings a loaded table to within a minute (as `engram bench search`):
        # right after the load, PostgreSQL has no statistics of the new rows and plans the per-seed lookups of
        # the replies query as scans of the tenant's rows (measured: 1.0 ms against 0.13 ms analysed).
        analyze()
        ask(tenant_id=tenant_id, question="warm up")
        at_10: list[float] = []
        for item in conversation["questions"]:
            gold = {str(g) for g in item.get("gold") or ()}
            if not gold:
                continue
            memory_ids_ranked, ms = ask(tenant_id=tenant_id, question=str(item.get("question") or ""))
            ranked = [turn_of.get(memory_id, memory_id) for memory_id in memory_ids_ranked]
            latencies.append(ms)
            for k in KS:
                hit = len(gold.intersection(ranked[:k])) / len(gold)
                recalls["all"][k].append(hit)
                recalls[item.get("category", "unknown")][k].append(hit)
                if k == 10:
                    at_10.append(hit)
        # Per conversation, so a change can be judged by how many conversations it helps, not only the mean.
        recall = f"{statistics.fmean(at_10):.3f}" if at_10 else "-"
        log(f"conversation {conversation['conversation']}: {len(at_10)} questions, recall@10 {recall}")
    figures = []
    for category in ["all", *sorted(c for c in recalls if c != "all")]:
        for k in KS:
            values = recalls[category][k]
            figures.append(figure("eval", f"recall_at_{k}", statistics.fmean(values), "ratio", category=category))
    figures.append(figure("eval", "search_p50_ms", statistics.median(latencies), "ms"))
    figures.append(figure("eval", "search_p95_ms", sorted(latencies)[int(0.95 * (len(latencies) - 1))], "ms"))
    return figures


def run(*, path: str, limit: int, log: Callable[[str], None], content_only: bool = False) -> list[dict[str, Any]]:
    with open(path) as handle:
        conversations = json.load(handle)["conversations"]
    if limit:
        conversations = conversations[:limit]
    with bench_stack():
        return evaluate(conversations=conversations, log=log, content_only=content_only)
