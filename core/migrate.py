"""Apply Alembic migrations; `serve`, `api` and `engram migrate` call this on start.

Migrations run as the schema owner (ENGRAM_DATABASE_URL). After them, every tenant table gets its forced
row-level security policy (tables added by later migrations included) and the app role the service
connects as is created or aligned and granted data access (core.tenancy.rls).
"""

from __future__ import annotations

import logging
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text
from sqlalchemy.engine import Connection, make_url

from core.config import get_settings
from core.db import app_database_url, get_owner_engine
from core.dbwaits import bound_role_waits
from core.tenancy.rls import apply_row_security, declare_leakproof_functions, ensure_app_role

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Serialises concurrent `migrate` runs (api + worker starting together) on one database.
_MIGRATION_LOCK_KEY = 7_402_911_337

log = logging.getLogger("engram.migrate")


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def upgrade(revision: str = "head") -> None:
    engine = get_owner_engine()
    with engine.begin() as connection:
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        connection.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
        # Migrations of data span tenants: the named system mode (forced policies bind the owner too).
        connection.execute(text("SELECT set_config('engram.system', 'on', true)"))
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
        changed = apply_row_security(connection)
        if changed:
            log.info("row-level security applied to %s", ", ".join(changed))
        declare_leakproof_functions(connection)
        app_url = app_database_url()
        ensure_app_role(connection, app_url=app_url)
        _bound_app_role_waits(connection, app_url=app_url)


def _bound_app_role_waits(connection: Connection, *, app_url: str) -> None:
    """The app role's default wait bounds (core.dbwaits), kept in step with the settings on every start."""
    role_name = make_url(app_url).username
    owner = connection.execute(text("SELECT current_user")).scalar()
    if not role_name or role_name == owner:
        return  # the service connects as the owner: its bounds are the process's own (limit_waits)
    settings = get_settings()
    bound_role_waits(
        connection,
        role_name=role_name,
        statement_timeout_seconds=settings.db_role_statement_timeout_seconds,
        lock_timeout_seconds=settings.db_role_lock_timeout_seconds,
        idle_in_transaction_seconds=settings.db_role_idle_in_transaction_seconds,
    )
