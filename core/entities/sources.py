"""Connections to the tenant's own databases (the sources the catalog describes).

Source engines are opened read-only where the dialect allows it (PostgreSQL and MySQL/MariaDB session
characteristics, SQLite ``mode=ro`` plus ``query_only``): the catalog only ever reads, and a bug here must
not be able to write into a customer's database. Which sources may be opened at all is decided by
:mod:`core.source_guard`, on registration and again on every connection.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import URL, Engine, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

from core.crypto import redact_url, scrub
from core.errors import Invalid
from core.source_guard import (
    UNREACHABLE,
    SourceRefused,
    SourceUnreachable,
    check_sqlite_path,
    check_target,
    parse_target,
    pin_target,
)

__all__ = ["SourceError", "SourceRefused", "check_reachable", "open_engine", "parse_source_url", "source_engine"]
log = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 10
_READ_ONLY_SQL = {
    "postgresql": "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    "mysql": "SET SESSION TRANSACTION READ ONLY",
    "mariadb": "SET SESSION TRANSACTION READ ONLY",
    "sqlite": "PRAGMA query_only = ON",
}


# A bare backend name whose default driver is missing falls back to these (in order) when installed.
_FALLBACK_DRIVERS = {
    "postgresql": ("psycopg", "psycopg2", "pg8000"),
    "mysql": ("pymysql", "mysqldb", "mysqlconnector"),
    "mariadb": ("pymysql", "mysqldb", "mysqlconnector"),
}
_NETWORK_BACKENDS = ("postgresql", "mysql", "mariadb")
_SQLITE_HEADER = b"SQLite format 3\x00"


class SourceError(Exception):
    """The source database could not be reached or queried; the message carries no secret."""


def parse_source_url(raw: str) -> URL:
    """Validate a datasource URL: parseable, with an installed synchronous driver, naming one endpoint this
    server may reach, and for SQLite a path to an existing database file. 422 naming ``url`` otherwise."""
    try:
        url = make_url(raw.strip())
    except (ArgumentError, ValueError) as exc:
        raise Invalid(f"url is not an SQLAlchemy database URL: {exc}", field="url") from None
    url = _with_installed_driver(url)
    backend = url.get_backend_name()
    if backend == "sqlite":
        _check_sqlite_file(url.database or "")
    elif backend in _NETWORK_BACKENDS:
        parse_target(url)
    else:
        raise Invalid(f"{backend!r} datasources are not supported (PostgreSQL, MySQL/MariaDB, SQLite)", field="url")
    return url


def _with_installed_driver(url: URL) -> URL:
    """The URL on a driver this server has (a bare ``mysql://`` becomes ``mysql+pymysql://`` when MySQLdb is
    missing but PyMySQL is installed); 422 naming the driver when there is none."""
    candidates = [url]
    if "+" not in url.drivername:
        candidates += [url.set(drivername=f"{url.drivername}+{d}") for d in _FALLBACK_DRIVERS.get(url.drivername, ())]
    missing: str | None = None
    for candidate in candidates:
        try:
            dialect = candidate.get_dialect()
        except NoSuchModuleError:
            if candidate is url:
                raise Invalid(f"no SQLAlchemy dialect for {url.drivername!r}", field="url") from None
            continue
        if getattr(dialect, "is_async", False):
            raise Invalid(
                f"{url.drivername!r} is an asyncio driver; use a synchronous one (such as postgresql+psycopg, "
                "mysql+pymysql or sqlite)",
                field="url",
            )
        try:
            dialect.import_dbapi()
        except Exception:  # noqa: BLE001 - ImportError, or a driver that fails while loading
            missing = missing or f"{dialect.driver!r}"
            continue
        return candidate
    raise Invalid(f"the driver {missing} for {url.drivername!r} is not installed on this server", field="url")


def _check_sqlite_file(database: str) -> Path:
    if not database or database == ":memory:" or database.startswith("file:"):
        raise Invalid("a SQLite datasource needs the path of a database file", field="url")
    try:
        path = check_sqlite_path(database)
        # Connecting would silently create a missing file: refuse instead. One message for a missing file,
        # an unreadable one and one that is not SQLite, so the check tells a caller little about the disk.
        header = _read_header(path) if path.is_file() else None
    except (OSError, ValueError, RuntimeError):  # too long, a NUL byte, a symlink loop
        header = None
        path = Path("/")
    # An empty file is an empty SQLite database (SQLite writes the header on the first table).
    if header is None or (header and header != _SQLITE_HEADER):
        raise Invalid(f"no SQLite database file at {database[:300]!r}", field="url")
    return path


def _read_header(path: Path) -> bytes | None:
    try:
        with path.open("rb") as handle:
            return handle.read(len(_SQLITE_HEADER))
    except OSError:
        return None


def _sqlite_read_only(url: URL) -> dict[str, Any]:
    """Engine arguments that open the file read-only (``mode=ro``): SQLite never creates a missing file."""
    path = _check_sqlite_file(url.database or "")
    try:
        _args, params = url.get_dialect()().create_connect_args(url)  # the URL's own timeout etc.
    except Exception as exc:  # noqa: BLE001 - ValueError, TypeError on ?timeout=abc and such
        raise SourceError(f"the URL's query arguments are refused: {_describe(exc, url=url)}") from None
    params = {k: v for k, v in params.items() if k != "uri"}
    uri = f"file:{quote(str(path))}?mode=ro"
    return {"creator": lambda: sqlite3.connect(uri, uri=True, **params)}


def open_engine(url: URL, *, pool_size: int = 4) -> Engine:
    """An engine on the source after the guard's checks: SQLite read-only, a network source pinned to the
    address the checks resolved. :class:`SourceRefused` for what this server will not open."""
    backend = url.get_backend_name()
    connect_args: dict[str, Any] = {}
    kwargs: dict[str, Any] = {"pool_pre_ping": False}
    try:
        if backend == "sqlite":
            try:
                kwargs.update(_sqlite_read_only(url))
            except SourceRefused:
                raise
            except Invalid as exc:  # the file is gone or no longer SQLite: the source is unreachable
                raise SourceError(exc.message) from None
        else:
            url, connect_args = pin_target(url, check_target(parse_target(url)))
            connect_args["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
            kwargs.update(pool_size=pool_size, max_overflow=0)
    except SourceUnreachable:
        raise SourceError(UNREACHABLE) from None
    try:
        engine = create_engine(url, connect_args=connect_args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - bad query arguments surface as ValueError, TypeError, ...
        raise SourceError(f"the URL's query arguments are refused: {_describe(exc, url=url)}") from None
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
    """An engine on the source that has answered once, disposed afterwards.

    A failure to connect becomes :class:`SourceError` with one generic message, whatever the cause
    (refused, timeout, TLS, credentials, a missing file): telling them apart would make datasource
    registration a port scanner. The real error goes to the server log. Errors of later queries keep
    their (scrubbed) text: the source has answered by then.
    """
    engine = open_engine(url, pool_size=pool_size)
    try:
        try:
            with engine.connect():
                pass
        except Exception as exc:  # noqa: BLE001 - drivers raise more than SQLAlchemyError on odd arguments
            log.warning("datasource %s unreachable: %s", redact_url(url), _describe(exc, url=url))
            raise SourceError(UNREACHABLE) from None
        try:
            yield engine
        except SQLAlchemyError as exc:
            raise SourceError(_describe(exc, url=url)) from None
    finally:
        engine.dispose()


def _describe(exc: BaseException, *, url: URL) -> str:
    """One line naming the failure, with every secret of the URL scrubbed out."""
    return scrub(f"{type(exc).__name__}: {exc}".split("\n(Background")[0], url=url)[:1000]


def check_reachable(url: URL) -> None:
    """422 when the source does not answer ``SELECT 1`` (one message whatever the reason), when the guard
    refuses it, or when the driver refuses the URL's query arguments (``?timeout=abc``)."""
    try:
        with source_engine(url, pool_size=1) as engine, engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except SourceError as exc:
        raise Invalid(str(exc), field="url") from None
