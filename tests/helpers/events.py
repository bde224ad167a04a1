"""SQLAlchemy event listeners held for the length of a block."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

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
