"""Which reindex jobs the outbox relay may dispatch now (core.embeddings.reindex explains the reindex).

A reindex job is an embed job whose payload says ``reason: reindex``. The relay holds it back while the
operator has paused the reindex of its model, or while the reindex jobs dispatched in the last ``WINDOW_S``
seconds already carry the budget of texts. These are SQL fragments over ``jobs`` rows, so they sit with the
queue, below the embedding pipeline that queues the jobs.
"""

from __future__ import annotations

REASON = "reindex"
WINDOW_S = 10


def paused_reindex_condition() -> str:
    """SQL over a ``jobs`` row ``j``: true for a reindex job whose model's reindex the operator paused."""
    return (
        f"(j.payload ->> 'reason' = '{REASON}'"
        " AND EXISTS (SELECT 1 FROM reindex_state AS r WHERE r.model = j.payload ->> 'model' AND r.paused))"
    )


def is_reindex_sql(alias: str) -> str:
    return f"({alias}.payload ->> 'reason' = '{REASON}')"


# Texts the reindex jobs dispatched in the window carried (a scalar SQL expression).
WINDOW_USED_SQL = f"""(SELECT coalesce(sum(CASE WHEN jsonb_typeof(w.payload -> 'doc_ids') = 'array'
                                   THEN jsonb_array_length(w.payload -> 'doc_ids') END), 0)
          FROM jobs AS w
          WHERE w.payload ->> 'reason' = '{REASON}' AND w.dispatched_at > now() - interval '{WINDOW_S} seconds')"""


def reindex_budget(max_texts_per_second: float) -> int | None:
    """The texts the reindex jobs of one window may carry (None: unthrottled)."""
    return None if max_texts_per_second <= 0 else max(1, int(max_texts_per_second * WINDOW_S))
