"""The catalog as search sees it: snapshot, change feed and entity docs, behind one seam.

The catalog lives in ``core.entities``. Search needs three things from it and imports them lazily, so
search works (over memories only) on a tenant or a build without catalog:

* the tenant's :class:`CatalogSnapshot` (resolution, rooting, hidden flags), through the loader the
  catalog installs in ``core.memories.links``;
* ``catalog_changes(session, *, since) -> [(doc_id, doc_kind, text | None, hidden, change_seq)]``,
  the change feed the full-text index catches up from;
* the rendered text of entity docs, through ``core.embeddings.catalog_docs.load`` (the one renderer).
"""

from __future__ import annotations

import importlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy.orm import Session

from core.entities.canonical import CatalogSnapshot
from core.search.fulltext import DocChange

# Modules that may define the catalog; importing them also installs the snapshot loader.
_CATALOG_MODULES = ("core.entities.store", "core.entities.catalog", "core.entities.service")
_feed: Callable[..., Iterable[tuple[str, str, str | None, bool, int]]] | None = None
_probed = False


def _probe() -> None:
    global _feed, _probed
    if _probed:
        return
    for name in _CATALOG_MODULES:
        try:
            module: Any = importlib.import_module(name)
        except ImportError:
            continue
        if _feed is None and callable(getattr(module, "catalog_changes", None)):
            _feed = module.catalog_changes
    _probed = True


def load_snapshot(session: Session, *, tenant_id: int) -> CatalogSnapshot:
    """The tenant's catalog (empty when no catalog is installed)."""
    _probe()
    from core.memories import links

    return links._snapshot_loader(session, tenant_id)


def catalog_changes(session: Session, *, since: int) -> list[DocChange]:
    """Catalog docs changed after ``since`` as full-text changes; hidden docs come out as deletions."""
    _probe()
    if _feed is None:
        return []
    return [
        DocChange(doc_id=doc_id, doc_kind=kind, text=text, deleted=text is None or hidden, seq=seq)
        for doc_id, kind, text, hidden, seq in _feed(session, since=since)
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
    with _docs_lock:
        hit = _memos.get(key)
        if hit is not None and hit[0] is snapshot:
            _memos.move_to_end(key)
            return hit[1]
        memo: dict[str, Any] = {}
        _memos[key] = (snapshot, memo)
        while len(_memos) > _DOCS_CACHE_TENANTS:
            _memos.popitem(last=False)
        return memo


def entity_docs(
    session: Session,
    *,
    snapshot: CatalogSnapshot,
    doc_ids: list[str],
    small_catalog: Callable[[], bool] | None = None,
) -> dict[str, tuple[str, str]]:
    """doc id -> (kind, rendered text) for the visible catalog docs among ``doc_ids``.

    Rendered docs are cached on the catalog snapshot of the search (see :func:`snapshot_memo`: one per
    tenant and catalog version, which every catalog write moves), so hits on a hot catalog cost no
    rendering query and no version read. When the first miss of a snapshot comes and ``small_catalog()``
    says the catalog is small, every doc is rendered at once (a few queries), so later searches never
    pay a rendering round trip per new hit.
    """
    if not doc_ids:
        return {}
    from core.embeddings import catalog_docs

    memo = snapshot_memo(snapshot)
    with _docs_lock:
        known: dict[str, tuple[str, str] | None] = memo.setdefault("docs", {})
        missing = [d for d in doc_ids if d not in known]
        prefetch = bool(missing) and not known and small_catalog is not None
    prefetch = prefetch and small_catalog is not None and small_catalog()
    if missing:
        docs = catalog_docs.all_docs(session) if prefetch else catalog_docs.load(session, doc_ids=missing)
        loaded = {doc.canonical_id: (doc.doc_kind, doc.text) for doc in docs}
        with _docs_lock:
            if prefetch:
                known.update(loaded)
            for doc_id in missing:
                known[doc_id] = loaded.get(doc_id)
    return {d: known[d] for d in doc_ids if known.get(d) is not None}  # type: ignore[misc]


_DOCS_CACHE_TENANTS = 64
_memos: OrderedDict[int, tuple[CatalogSnapshot, dict[str, Any]]] = OrderedDict()
_docs_lock = threading.Lock()
