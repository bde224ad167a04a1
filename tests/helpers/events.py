"""What a block does: SQLAlchemy event listeners held for its length, and the core.sql calls of a tenant's
sessions within it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event


@contextmanager
def listening(target: Any, **listeners: Callable[..., Any]) -> Iterator[None]:
    """``listeners`` (event name -> function) on ``target`` while inside, removed after."""
    for name, listener in listeners.items():
        event.listen(target, name, listener)
    try:
        yield
    finally:
        for name, listener in listeners.items():
            event.remove(target, name, listener)


@contextmanager
def sql_calls(tenant_id: int) -> Iterator[list[list[Any]]]:
    """The statement keys of each core.sql call (one round trip each) of the tenant's sessions, in order, while
    inside (threads of other tests may run meanwhile: their sessions are not counted)."""
    from core import sql

    seen: list[list[Any]] = []
    real = sql.run_many

    def run_many(session, queries, **given):  # type: ignore[no-untyped-def]
        if session.info.get("tenant_id") == tenant_id:
            seen.append([q.key for q in queries])
        return real(session, queries, **given)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sql, "run_many", run_many)
        yield seen
