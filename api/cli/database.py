"""A one-off command's database: the configured one, the running `engram serve`'s, or the home's embedded
PostgreSQL started for the duration of the command (process plumbing, so it lives with the CLI, not in core)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

from api.serve.embedded import EmbeddedPostgres
from core.config import get_settings, reset_settings_cache
from core.db import dispose_engine
from core.runtime import read_runtime


@contextmanager
def database_session_for_cli() -> Iterator[None]:
    """Make the database reachable for a one-off command.

    Uses ENGRAM_DATABASE_URL, else the running `engram serve` on this home, else starts the home's
    embedded PostgreSQL for the duration of the command.
    """
    settings = get_settings()
    if settings.database_url:
        yield
        return
    record = read_runtime()
    if record and record.get("database_url"):
        os.environ["ENGRAM_DATABASE_URL"] = str(record["database_url"])
        reset_settings_cache()
        yield
        return
    settings.home.mkdir(parents=True, exist_ok=True)
    server = EmbeddedPostgres.for_home(settings.home)
    os.environ["ENGRAM_DATABASE_URL"] = server.start()
    reset_settings_cache()
    try:
        yield
    finally:
        dispose_engine()
        server.stop()
        os.environ.pop("ENGRAM_DATABASE_URL", None)
        reset_settings_cache()
