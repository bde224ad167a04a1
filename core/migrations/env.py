"""Alembic environment: runs against the connection `core.migrate.upgrade` hands over."""

from __future__ import annotations

from alembic import context

import core.schema  # noqa: F401 - registers every table on Base.metadata
from core.db import Base

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through `engram migrate` (core.migrate.upgrade)")

context.configure(connection=connection, target_metadata=Base.metadata, compare_type=True)
with context.begin_transaction():
    context.run_migrations()
