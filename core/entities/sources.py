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

from core.config import get_settings
from core.entities.crypto import scrub
from core.errors import Invalid

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
# Files a datasource must never name, whatever they hold (kernel and device files read like text).
_FORBIDDEN_ROOTS = (Path("/proc"), Path("/sys"), Path("/dev"))
_SQLITE_HEADER = b"SQLite format 3\x00"


class SourceError(Exception):
    """The source database could not be reached or queried; the message carries no secret."""


def parse_source_url(raw: str) -> URL:
    """Validate a datasource URL: parseable, with an installed synchronous driver, and for SQLite a path to
    an existing database file (not a kernel or device file). 422 naming ``url`` otherwise."""
    try:
        url = make_url(raw.strip())
    except (ArgumentError, ValueError) as exc:
        raise Invalid(f"url is not an SQLAlchemy database URL: {exc}", field="url") from None
    url = _with_installed_driver(url)
    if url.get_backend_name() == "sqlite":
        _check_sqlite_file(url.database or "")
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


def _check_sqlite_file(database: str) -> None:
    if not database or database == ":memory:" or database.startswith("file:"):
        raise Invalid("a SQLite datasource needs the path of a database file", field="url")
    try:
        path = Path(database).resolve()
        if any(path == root or root in path.parents for root in _FORBIDDEN_ROOTS):
            raise Invalid(f"a SQLite datasource cannot be under {', '.join(map(str, _FORBIDDEN_ROOTS))}", field="url")
        allowed = [root.expanduser().resolve() for root in get_settings().sqlite_roots]
        if allowed and not any(root in path.parents for root in allowed):
            raise Invalid(
                f"SQLite datasources must be under {', '.join(map(str, allowed))} (ENGRAM_SQLITE_ROOTS)", field="url"
            )
        # Connecting would silently create a missing file: refuse instead. One message for a missing file,
        # an unreadable one and one that is not SQLite, so the check tells a caller little about the disk.
        header = _read_header(path) if path.is_file() else None
    except (OSError, ValueError, RuntimeError):  # too long, a NUL byte, a symlink loop
        header = None
    # An empty file is an empty SQLite database (SQLite writes the header on the first table).
    if header is None or (header and header != _SQLITE_HEADER):
        raise Invalid(f"no SQLite database file at {database[:300]!r}", field="url")


def _read_header(path: Path) -> bytes | None:
    try:
        with path.open("rb") as handle:
            return handle.read(len(_SQLITE_HEADER))
    except OSError:
        return None


def open_engine(url: URL, *, pool_size: int = 4) -> Engine:
    backend = url.get_backend_name()
    connect_args: dict[str, Any] = {}
    if backend in ("postgresql", "mysql", "mariadb"):
        connect_args["connect_timeout"] = CONNECT_TIMEOUT_SECONDS
    kwargs: dict[str, Any] = {"connect_args": connect_args, "pool_pre_ping": False}
    if backend != "sqlite":
        kwargs.update(pool_size=pool_size, max_overflow=0)
    try:
        engine = create_engine(url, **kwargs)
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
    """An engine on the source, disposed afterwards; driver errors become :class:`SourceError`."""
    engine = open_engine(url, pool_size=pool_size)
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
    """422 when the database does not answer ``SELECT 1`` (wrong host, credentials, database, or query
    arguments the driver refuses: ``?timeout=abc``, ``?charset=bogus``)."""
    try:
        with source_engine(url, pool_size=1) as engine, engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except SourceError as exc:
        raise Invalid(f"cannot connect to the datasource: {exc}", field="url") from None
    except Exception as exc:  # noqa: BLE001 - drivers raise plain ValueError/AttributeError on odd arguments
        detail = _describe(exc, url=url)
        raise Invalid(
            f"cannot connect to the datasource (check the URL's query arguments): {detail}", field="url"
        ) from None
