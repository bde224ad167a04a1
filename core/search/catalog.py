"""The catalog as search sees it: snapshot, change feed and entity docs, behind one seam.

The catalog lives in ``core.entities``. Search needs three things from it:

* the tenant's :class:`CatalogSnapshot` (resolution, rooting, hidden flags), ``core.entities.store.load_snapshot``;
* ``catalog_changes(session, *, since) -> [(doc_id, doc_kind, text | None, hidden, change_seq)]``,
  the change feed the full-text index catches up from;
* the rendered text of entity docs, through ``core.embeddings.catalog_docs.load`` (the one renderer).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import Any, Literal

from sqlalchemy import text
from sqlalchemy.orm import Session

from core.caches import BoundedCache
from core.config import get_settings
from core.db import read_one_snapshot, tenant_session
from core.embeddings import catalog_docs
from core.entities import store
from core.entities.canonical import CatalogSnapshot
from core.search.fulltext import DocChange

logger = logging.getLogger(__name__)


def load_snapshot(session: Session, *, tenant_id: int, version: int | None = None) -> CatalogSnapshot:
    """The tenant's catalog.

    ``version``: the tenant's catalog version (``catalog_state.version``, 0 without a row) read in the
    session's current REPEATABLE READ transaction, with another query of the search. The loader would
    read that same version again (the transaction sees one database state) before answering from its
    own cache, so when the snapshot last handed out for the tenant has that version it is returned
    as is, without the loader's round trip; it is the loader's own object, so what is memoised on it
    (:func:`snapshot_memo`) stays shared.
    """
    loader = store.load_snapshot
    if version is None:
        return loader(session, tenant_id)
    hit = _snapshots.get(tenant_id)
    if hit is not None and hit[0] == version and hit[2] is loader:
        return hit[1]
    # Version 0: no catalog write ever (every one moves the version), so the catalog is empty; a tenant that
    # keeps memories only is not charged the loader's seven queries at its first search. Each tenant gets its
    # own empty snapshot object, so memos never cross tenants.
    snapshot = CatalogSnapshot() if version == 0 else loader(session, tenant_id)
    _snapshots.put(tenant_id, (version, snapshot, loader))
    if hit is not None and hit[1] is not snapshot:
        _drop_memo(tenant_id, hit)  # the replaced snapshot's memo is counted with it: it goes too
    return snapshot


def last_snapshot(tenant_id: int) -> tuple[int, CatalogSnapshot] | None:
    """(catalog version, snapshot) last handed out for the tenant by :func:`load_snapshot` with a version.

    A guess at the current catalog, to be confirmed by reading the version (see core.search.service).
    """
    hit = _snapshots.get(tenant_id)
    if hit is None or hit[2] is not store.load_snapshot:
        return None
    return hit[0], hit[1]


def clear_cache() -> None:
    _snapshots.clear()
    _memos.clear()


def catalog_changes(session: Session, *, since: int) -> list[DocChange]:
    """Catalog docs changed after ``since`` as full-text changes; hidden docs come out as deletions."""
    return [
        DocChange(doc_id=doc_id, doc_kind=kind, text=text, deleted=text is None or hidden, seq=seq)
        for doc_id, kind, text, hidden, seq in store.catalog_changes(session, since=since)
    ]


def snapshot_memo(snapshot: CatalogSnapshot) -> dict[str, Any]:
    """A scratch dict that lives as long as ``snapshot`` is the tenant's current catalog.

    The catalog's loader hands out one snapshot object per tenant and catalog version (a write to the
    catalog moves the version and yields a new object), so what is derived from a snapshot, or read in
    the transaction that loaded it, can be memoised on the object itself: no version read is needed to
    know the memo is current. A snapshot dropped from the loader's cache and read again is a new object
    with a fresh memo.
    """
    key = id(snapshot)
    hit = _memos.get(key)
    if hit is not None and hit[0] is snapshot:
        return hit[1]
    # Two searches racing here may each make a memo; the later one stays, the other is used once.
    memo: dict[str, Any] = {}
    _memos.put(key, (snapshot, memo))
    return memo


Prefetch = Literal["now", "background", "never"]


def entity_docs(
    session: Session,
    *,
    snapshot: CatalogSnapshot,
    doc_ids: list[str],
    prefetch: Callable[[], Prefetch] | None = None,
    tenant_id: int | None = None,
    version: int | None = None,
) -> dict[str, tuple[str, str]]:
    """doc id -> (kind, rendered text) for the visible catalog docs among ``doc_ids``.

    Rendered docs are cached on the catalog snapshot of the search (see :func:`snapshot_memo`: one per
    tenant and catalog version, which every catalog write moves), so hits on a hot catalog cost no
    rendering query and no version read. At the first miss of a snapshot, ``prefetch()`` says how the
    whole catalog is rendered so that later searches never pay a rendering round trip per new hit:
    ``now`` (a small catalog: a few queries, in this search), ``background`` (a thread renders it in
    its own transaction, kept only if that transaction sees ``version``, the snapshot's catalog
    version, for ``tenant_id``; until it is done misses are rendered per search) or ``never``.
    """
    if not doc_ids:
        return {}

    memo = snapshot_memo(snapshot)
    with _docs_lock:
        known: dict[str, tuple[str, str] | None] = memo.setdefault("docs", {})
        complete = bool(memo.get("complete"))
        missing = [] if complete else [d for d in doc_ids if d not in known]
        first = bool(missing) and not memo.get("prefetch")
        if first:
            memo["prefetch"] = True
    how: Prefetch = prefetch() if first and prefetch is not None else "never"
    if how == "background" and tenant_id is not None and version is not None:
        _start_render(memo, tenant_id=tenant_id, version=version)
    if missing:
        now = how == "now"
        docs = catalog_docs.all_docs(session) if now else catalog_docs.load(session, doc_ids=missing)
        loaded = {doc.canonical_id: (doc.doc_kind, doc.text) for doc in docs}
        with _docs_lock:
            known.update(loaded)
            for doc_id in missing:
                known.setdefault(doc_id, None)
            if now:
                memo["complete"] = True
    return {d: known[d] for d in doc_ids if known.get(d) is not None}  # type: ignore[misc]


_renders: list[threading.Thread] = []


def _start_render(memo: dict[str, Any], *, tenant_id: int, version: int) -> None:
    thread = threading.Thread(
        target=_render_all, kwargs={"memo": memo, "tenant_id": tenant_id, "version": version}, daemon=True
    )
    with _docs_lock:
        _renders[:] = [t for t in _renders if t.is_alive()] + [thread]
    thread.start()


def _render_all(*, memo: dict[str, Any], tenant_id: int, version: int) -> None:
    """Render every visible catalog doc of the tenant into ``memo`` if the catalog is still at ``version``."""

    try:
        with tenant_session(tenant_id) as session:
            read_one_snapshot(session)
            current = session.execute(_VERSION_SQL, {"tenant": tenant_id}).scalar()
            if int(current or 0) != version:
                return
            loaded = {doc.canonical_id: (doc.doc_kind, doc.text) for doc in catalog_docs.all_docs(session)}
    except Exception:  # noqa: BLE001 - searches keep rendering their misses themselves
        logger.warning("background rendering of the catalog of tenant %s failed", tenant_id, exc_info=True)
        return
    with _docs_lock:
        known = memo.setdefault("docs", {})
        # A doc rendered by a search in the meantime is the same doc of the same catalog version.
        known.update(loaded)
        memo["complete"] = True


def wait_for_renders(timeout: float = 60.0) -> None:
    """Wait for the background catalog renders started so far (tests)."""
    with _docs_lock:
        threads = list(_renders)
    for thread in threads:
        thread.join(timeout)


_VERSION_SQL = text("SELECT version FROM catalog_state WHERE tenant_id = :tenant")
# Memos derived from a tenant's current catalog snapshot, keyed by the snapshot object.
_memos: BoundedCache[tuple[CatalogSnapshot, dict[str, Any]]] = BoundedCache(
    "catalog_memos", max_entries=lambda: get_settings().catalog_cache_tenants
)
_docs_lock = threading.Lock()

# Bytes a tenant's cached catalog takes per catalog entity: the snapshot with its lookup indexes ~300
# (tracemalloc, 1k and 10k entities) and what search memoises on it, mostly the rendered docs (kind and
# text, ~500 when the whole catalog is rendered). A tenant with an empty catalog counts as one entity.
ENTITY_BYTES = 800


def catalog_entities(snapshot: CatalogSnapshot) -> int:
    """Datasources, models and their leaves (columns, measures, aggregations) of a snapshot."""
    return sum(
        1 + sum(1 + len(model.leaf_names()) for model in datasource.models.values())
        for datasource in snapshot.datasources.values()
    )


def _snapshot_bytes(entry: tuple[int, CatalogSnapshot, Any]) -> int:
    return ENTITY_BYTES * max(1, catalog_entities(entry[1]))


def _drop_memo(_tenant_id: Hashable, entry: tuple[int, CatalogSnapshot, Any]) -> None:
    """A snapshot evicted takes its memo along (the memo's bytes are counted with the snapshot)."""
    # Memos are keyed by the id of their snapshot, which each entry keeps alive: the id is not reused.
    _memos.pop(id(entry[1]))


# Per tenant: (catalog version, the snapshot the loader gave for it, that loader); bounded by tenants and
# by the estimated bytes of the snapshots with their memos.
_snapshots: BoundedCache[tuple[int, CatalogSnapshot, Any]] = BoundedCache(
    "catalog_snapshots",
    max_entries=lambda: get_settings().catalog_cache_tenants,
    max_bytes=lambda: get_settings().catalog_cache_max_mb * 2**20,
    weigh=_snapshot_bytes,
    on_evict=_drop_memo,
)
