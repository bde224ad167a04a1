"""Apply Alembic migrations; `serve`, `api` and `engram migrate` call this on start."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import text

from core.db import get_engine

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
# Serialises concurrent `migrate` runs (api + worker starting together) on one database.
_MIGRATION_LOCK_KEY = 7_402_911_337


def alembic_config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def upgrade(revision: str = "head") -> None:
    engine = get_engine()
    with engine.begin() as connection:
        connection.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _MIGRATION_LOCK_KEY})
        connection.execute(text("CREATE EXTENSION IF NOT EXISTS vector"))
        config = alembic_config()
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
