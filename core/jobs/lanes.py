"""Which lane (Celery queue) a job travels in: interactive work never waits behind bulk work.

*Interactive* is the embedding of a fresh save: an embed job of at most ``interactive_max_docs`` docs that
a write queued (not reconcile, a reindex or the chunk of a split). Everything else is *bulk*: batches and
imports, reconcile and model-change backfills, ingest, sample refresh, lifecycle passes. Each lane is its
own Redis list; the worker runs a process per lane (``engram worker``), so a backlog of bulk work never
holds the process that embeds fresh saves.

The rule exists twice, in SQL (the relay's claim) and in Python (a direct publish), side by side here.
"""

from __future__ import annotations

from typing import Any, Literal

Lane = Literal["interactive", "bulk"]
LANES: tuple[Lane, ...] = ("interactive", "bulk")
# Bulk keeps the default queue's name: beat's own tasks and messages of older versions land there.
QUEUES: dict[Lane, str] = {"interactive": "engram.interactive", "bulk": "engram"}


def lane_sql(*, max_docs_param: str = "interactive_max_docs") -> str:
    """The lane of a ``jobs`` row as a SQL expression (bind ``:<max_docs_param>``)."""
    return (
        "(CASE WHEN kind = 'embed' AND NOT (payload ? 'reason') AND NOT (payload ? 'split_from')"
        " AND jsonb_typeof(payload -> 'doc_ids') = 'array'"
        f" AND jsonb_array_length(payload -> 'doc_ids') <= :{max_docs_param}"
        " THEN 'interactive' ELSE 'bulk' END)"
    )


def lane_of(kind: str, payload: dict[str, Any] | None, *, interactive_max_docs: int) -> Lane:
    """The lane of a job, as :func:`lane_sql` decides it."""
    payload = payload or {}
    docs = payload.get("doc_ids")
    if (
        kind == "embed"
        and "reason" not in payload
        and "split_from" not in payload
        and isinstance(docs, list)
        and len(docs) <= interactive_max_docs
    ):
        return "interactive"
    return "bulk"


def queue_for(lane: str) -> str:
    """The Celery queue (Redis list) of a lane; an unknown lane goes to bulk."""
    return QUEUES.get(lane, QUEUES["bulk"])  # type: ignore[call-overload]
