"""Catalog docs (datasources, models, columns, measures, aggregations) for embedding.

Only visible docs are embedded: a hidden model or column is absent from the result, so it never reaches
the dense channel (the catalog deletes its existing embedding rows when it is hidden).
"""

from __future__ import annotations

from sqlalchemy import true
from sqlalchemy.orm import Session

from core.embeddings.docs import Doc
from core.entities.store import _docs, render_docs


def load(session: Session, *, doc_ids: list[str]) -> list[Doc]:
    return [Doc(d.doc_id, d.doc_kind, d.text) for d in render_docs(session, doc_ids=doc_ids) if not d.hidden]


def all_docs(session: Session) -> list[Doc]:
    """Every visible catalog doc of the session's tenant (reconcile and coverage)."""


    kinds = ("datasource", "model", "column", "measure", "aggregation")
    return [Doc(d.doc_id, d.doc_kind, d.text) for d in _docs(session, where={k: true() for k in kinds}) if not d.hidden]
