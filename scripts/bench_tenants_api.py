"""The operator's tenant calls with many tenants: `GET /v1/tenants` (a page, a bigger page, a name-prefix
search) and the dashboard's tenants JSON (usage, backlog and coverage per tenant), through the app in-process
on a throwaway embedded stack. Each tenant has a day of usage.

    python scripts/bench_tenants_api.py --tenants 10000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _timed(label: str, call: Callable[[], Any], rounds: int = 20) -> None:
    call()
    walls = []
    for _ in range(rounds):
        started = time.perf_counter()
        response = call()
        walls.append((time.perf_counter() - started) * 1000)
        assert response.status_code == 200, response.text
    print(f"{label}: p50 {statistics.median(walls):.1f} ms, max {max(walls):.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=10_000)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="engram-tenants-api-", dir="/tmp"))
    base.chmod(0o755)
    operator_key = "egop_" + uuid.uuid4().hex
    try:
        from api.serve.embedded import embedded_services

        with embedded_services(base, durable=False) as (database_url, redis_url):
            os.environ.update(
                ENGRAM_DATABASE_URL=database_url,
                ENGRAM_REDIS_URL=redis_url,
                ENGRAM_HOME=str(base / "home"),
                ENGRAM_OPERATOR_KEY=operator_key,
            )
            (base / "home").mkdir()
            from core.config import reset_settings_cache

            reset_settings_cache()
            from core.migrate import upgrade

            upgrade()
            from fastapi.testclient import TestClient
            from sqlalchemy import text

            from api.app import create_app
            from core.db import system_session

            with system_session() as session:
                session.execute(
                    text(
                        "INSERT INTO tenants (name) SELECT 'customer-' || lpad(g::text, 6, '0') "
                        "FROM generate_series(1, :n) g"
                    ),
                    {"n": args.tenants},
                )
                session.execute(
                    text(
                        "INSERT INTO tenant_usage (tenant_id, day, requests, searches, saves) "
                        "SELECT id, current_date, 100, 10, 5 FROM tenants"
                    )
                )
            headers = {"Authorization": f"Bearer {operator_key}"}
            calls = [
                ("GET /v1/tenants?limit=50", "/v1/tenants", {"limit": 50}),
                ("GET /v1/tenants?limit=200", "/v1/tenants", {"limit": 200}),
                ("GET /v1/tenants?q=<prefix>", "/v1/tenants", {"q": "customer-0009"}),
                ("dashboard page of 50", "/dashboard/api/tenants", {"limit": 50}),
                ("dashboard prefix search", "/dashboard/api/tenants", {"q": "customer-0009"}),
            ]
            with TestClient(create_app()) as client:
                for label, path, params in calls:
                    _timed(label, lambda path=path, params=params: client.get(path, params=params, headers=headers))
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
