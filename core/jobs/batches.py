"""Which jobs travel and run together.

Saves queue one embed job each. Under a stream of saves, a Celery message, a claim, a heartbeat and two
bookkeeping transactions per job cost several times the embedding itself (measured: ~12 ms of worker CPU
and ~6 ms of PostgreSQL per one-doc job, ~1.2 and ~0.5 per doc in jobs of 16). So the outbox relay puts
the jobs it claims together into one message when they share a batch key, up to the doc limit of one
embed job, and the runner runs them as one handler call. Each job keeps its row, attempts and history.

Both sides read a job's head (``HEAD_COLUMNS``): its id, kind, tenant, embedding model and doc count.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

# The head of a job row, in SQL (for RETURNING clauses): id, kind, tenant_id, model, docs (NULL when the
# payload has no doc_ids list).
HEAD_COLUMNS = (
    "id, kind, tenant_id, payload ->> 'model',"
    " CASE WHEN jsonb_typeof(payload -> 'doc_ids') = 'array' THEN jsonb_array_length(payload -> 'doc_ids') END"
)
# A message never carries more jobs than this, whatever their docs.
MAX_JOBS_PER_MESSAGE = 100


class JobHead(NamedTuple):
    id: str
    kind: str
    tenant_id: int | None
    model: str | None
    docs: int | None


def batch_key(head: JobHead) -> Hashable | None:
    """Jobs with the same key may run as one handler call; None runs alone. Embed jobs batch per tenant and
    model (one scope, one embedder); a job without a tenant or a doc list runs alone (and fails alone)."""
    if head.kind == "embed" and head.tenant_id is not None and head.docs is not None:
        return ("embed", head.tenant_id, head.model)
    return None


@dataclass(frozen=True)
class Message:
    """One message to the workers: jobs of one kind, and the stored request context of its first job (its
    request id and trace go with the message), in a lane (core.jobs.lanes: the queue it goes to)."""

    kind: str
    job_ids: tuple[str, ...]
    context: dict[str, Any] | None = None
    lane: str = "bulk"


def plan_messages(heads: Iterable[tuple[JobHead, dict[str, Any] | None]], *, max_docs: int) -> list[Message]:
    """The messages for these claimed jobs (head, context), in the order of their first job: jobs with a
    batch key share messages of at most ``max_docs`` docs (a bigger job travels alone and splits itself),
    every other job has its own."""
    open_batches: dict[Hashable, tuple[list[str], int]] = {}
    planned: list[tuple[str, list[str], dict[str, Any] | None]] = []
    for head, context in heads:
        key = batch_key(head)
        docs = head.docs or 0
        if key is None or docs >= max_docs:
            planned.append((head.kind, [head.id], context))
            continue
        current = open_batches.get(key)
        if current is not None and current[1] + docs <= max_docs and len(current[0]) < MAX_JOBS_PER_MESSAGE:
            current[0].append(head.id)
            open_batches[key] = (current[0], current[1] + docs)
            continue
        ids = [head.id]
        open_batches[key] = (ids, docs)
        planned.append((head.kind, ids, context))
    return [Message(kind=kind, job_ids=tuple(ids), context=context) for kind, ids, context in planned]
