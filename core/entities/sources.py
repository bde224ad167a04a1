"""Connections to the tenant's own databases (the sources the catalog describes).

Source engines are opened read-only where the dialect allows it (PostgreSQL and MySQL/MariaDB session
characteristics, SQLite ``query_only``): the catalog only ever reads, and a bug here must not be able to
write into a customer's database.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from core.entities.crypto import scrub
from core.errors import Invalid

CONNECT_TIMEOUT_SECONDS = 10
_READ_ONLY_SQL = {
    "postgresql": "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    "mysql": "SET SESSION TRANSACTION READ ONLY",
    "mariadb": "SET SESSION TRANSACTION READ ONLY",
    "sqlite": "PRAGMA query_only = ON",
}


class SourceError(Exception):
    """The source database could not be reached or queried; the message carries no secret."""


def parse_source_url(raw: str) -> URL:
    """Validate a datasource URL: parseable, with an installed driver, and a SQLite file that exists."""
    try:
        url = make_url(raw.strip())
    except (ArgumentError, ValueError) as exc:
        raise Invalid(f"url is not an SQLAlchemy database URL: {exc}", field="url") from None
    try:
        url.get_dialect()
    except NoSuchModuleError:
        raise Invalid(f"no installed driver for {url.drivername!r}", field="url") from None
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        if not database or database == ":memory:" or database.startswith("file:"):
            raise Invalid("a SQLite datasource needs the path of a database file", field="url")
        # Connecting would silently create a missing file: refuse instead.
        if not Path(database).is_file():
            raise Invalid(f"no SQLite database file at {database!r}", field="url")
    return url


def open_engine(url: URL, *, pool_size: int = 4) -> Engine:
    backend = url.get_backend_name()
    connect_args: dict[str, Any] = {}
    if backend in ("postgresql", "mysql", "mariadb"):
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    kwargs: dict[str, Any] = {"connect_args": connect_args, "pool_pre_ping": False}
    if backend != "sqlite":
        kwargs.update(pool_size=pool_size, max_overflow=0)
    engine = create_engine(url, **kwargs)
    read_only = _READ_ONLY_SQL.get(backend)
    if read_only is not None:

        @event.listens_for(engine, "connect")
        def _read_only(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            try:
                cursor.execute(read_only)
            finally:
                cursor.close()
            if backend == "postgresql":
                dbapi_connection.commit()

    return engine


@contextmanager
def source_engine(url: URL, *, pool_size: int = 4) -> Iterator[Engine]:
    """An engine on the source, disposed afterwards; driver errors become :class:`SourceError`."""
    engine = open_engine(url, pool_size=pool_size)
    try:
        yield engine
    except SQLAlchemyError as exc:
        raise SourceError(scrub(f"{type(exc).__name__}: {exc}".split("\n(Background")[0], url=url)) from None
    finally:
        engine.dispose()


def check_reachable(url: URL) -> None:
    """422 when the database does not answer ``SELECT 1`` (wrong host, credentials, database)."""
    try:
        with source_engine(url, pool_size=1) as engine, engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except SourceError as exc:
        raise Invalid(f"cannot connect to the datasource: {exc}", field="url") from None
