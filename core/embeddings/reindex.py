"""Background reindexing: a change of the embedding model re-embeds every tenant as bulk work.

Reconcile (on beat) finds each tenant's gaps for the configured model and queues them as embed jobs; a
tenant that still holds vectors of another model gets them as ``reason: reindex``. Those travel in the bulk
lane, round-robin over tenants like any bulk work (core.jobs.relay), and the relay holds them back while
the operator has paused the reindex of that model, or while the reindex jobs dispatched in the last
``WINDOW_S`` seconds already carry ``ENGRAM_REINDEX_MAX_TEXTS_PER_SECOND`` x WINDOW_S texts (a provider's
rate limit is a deployment fact). Everything it needs is in the outbox, so a reindex survives any restart
and goes on where it was. Search keeps a tenant on its old vectors until the new model covers it
(core.embeddings.store.serving_model); reconcile then deletes the old ones.

Progress comes from the coverage counters (core.embeddings.coverage): per tenant, memories embedded with
the configured model and those remaining; the rate from the reindex jobs finished in the last minute.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import text
from sqlalchemy.orm import Session

from core.embeddings.coverage import memory_counts

# The relay's gate for reindex jobs lives with the queue (core.jobs.relay reads it); REASON is used here too.
from core.jobs.reindex_gate import REASON as REASON

RATE_WINDOW_S = 60


def tenants_with_other_models(session: Session, *, model: str) -> set[int]:
    """Tenants holding vectors of a model other than `model`: their gaps are a reindex (system session)."""
    rows = session.execute(
        text("SELECT DISTINCT tenant_id FROM search_embedding_stats WHERE model <> :model AND docs > 0"),
        {"model": model},
    ).scalars()
    return {int(t) for t in rows}


def set_paused(session: Session, *, model: str, paused: bool, by: str | None) -> None:
    session.execute(
        text(
            "INSERT INTO reindex_state AS r (model, paused, changed_by, updated_at) VALUES (:m, :p, :by, now())"
            " ON CONFLICT (model) DO UPDATE SET paused = excluded.paused, changed_by = excluded.changed_by,"
            " updated_at = excluded.updated_at"
        ),
        {"m": model, "p": paused, "by": by or "operator"},
    )
    # Resuming wakes the relays at once instead of at their next poll.
    session.execute(text("SELECT pg_notify('engram_jobs', 'reindex')"))


def progress(session: Session, *, model: str, tenant_limit: int = 200) -> dict[str, Any]:
    """The reindex of `model` as the operator sees it (system session): state, done / remaining overall and
    per tenant (the tenants with the most remaining first), the rate of the last minute and an ETA."""

    counts = memory_counts(session, model=model, tenant_ids=None)
    names: dict[int, str] = {int(i): str(n) for i, n in session.execute(text("SELECT id, name FROM tenants")).all()}
    old = tenants_with_other_models(session, model=model)
    state_row = session.execute(
        text("SELECT paused, changed_by, updated_at FROM reindex_state WHERE model = :m"), {"m": model}
    ).first()
    embedded = session.execute(
        text(
            "SELECT coalesce(sum((result ->> 'embedded')::bigint), 0) FROM jobs WHERE kind = 'embed'"
            f" AND payload ->> 'reason' = '{REASON}' AND state = 'succeeded'"
            f" AND finished_at > now() - interval '{RATE_WINDOW_S} seconds'"
        )
    ).scalar_one()
    left = [(tid, done, expected - done) for tid, (done, expected) in counts.items() if expected > done or tid in old]
    left.sort(key=lambda row: (-row[2], names.get(row[0], "")))
    tenants = [
        {"tenant": names.get(tid), "done": done, "remaining": remaining, "old_vectors": tid in old}
        for tid, done, remaining in left
    ]
    done = sum(d for d, _ in counts.values())
    remaining = sum(e - d for d, e in counts.values())
    rate = float(embedded) / RATE_WINDOW_S
    paused = bool(state_row and state_row[0])
    return {
        "model": model,
        "state": "paused" if paused else ("running" if remaining > 0 or old else "idle"),
        "changed_by": state_row[1] if state_row else None,
        "changed_at": state_row[2].isoformat() if state_row and state_row[2] else None,
        "done": done,
        "remaining": remaining,
        "tenants_remaining": len(tenants),
        "rate_per_s": round(rate, 2),
        "eta_seconds": round(remaining / rate, 1) if rate > 0 and remaining > 0 else None,
        "tenants": tenants[:tenant_limit],
    }
