"""The real stack for the suite: PostgreSQL (pgvector), Redis, and a Celery worker when a test asks.

Embedded PostgreSQL and Redis start once per session under /tmp (world-traversable, which the postgres
system user needs when the suite runs as root), unless ENGRAM_TEST_DATABASE_URL /
ENGRAM_TEST_REDIS_URL name servers to use instead. Tests isolate themselves by creating their own tenants.
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.helpers.api import OPERATOR_KEY
from tests.helpers.processes import REPO, TEMP_DIRS, Stack, WorkerProcess, make_temp_dir, running_api, wait_for


@pytest.fixture(scope="session", autouse=True)
def _temp_dirs_removed() -> Iterator[None]:
    """The suite leaves nothing under /tmp: a directory a test made and left is removed and reported."""
    yield
    left = [path for path in TEMP_DIRS if path.exists()]
    for path in left:
        shutil.rmtree(path, ignore_errors=True)
    assert not left, f"tests left these behind (now removed): {left}"


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    from api.serve.embedded import embedded_services
    from core.db import dispose_engine

    base = make_temp_dir("engram-test-")
    try:
        # durable=False: no fsync for a throwaway cluster (the suite does not measure speed).
        with embedded_services(
            base,
            durable=False,
            database_url=os.environ.get("ENGRAM_TEST_DATABASE_URL", ""),
            redis_url=os.environ.get("ENGRAM_TEST_REDIS_URL", ""),
        ) as (database_url, redis_url):
            env = {
                "ENGRAM_DATABASE_URL": database_url,
                "ENGRAM_REDIS_URL": redis_url,
                "ENGRAM_HOME": str(base / "home"),
                "ENGRAM_OPERATOR_KEY": OPERATOR_KEY,
                "ENGRAM_SECRET_KEY": "dGVzdC1zZWNyZXQta2V5LWZvci1lbmdyYW0tdGVzdHM9",
                "ENGRAM_OUTBOX_REDISPATCH_SECONDS": "2",
                "ENGRAM_RECONCILE_INTERVAL_SECONDS": "1",
                # Like `engram serve`: the suite's sources are loopback servers and SQLite files in /tmp.
                "ENGRAM_DATASOURCE_POLICY": "local",
            }
            os.environ.update(env)
            (base / "home").mkdir()
            from core.config import reset_settings_cache

            reset_settings_cache()
            from core.migrate import upgrade

            upgrade()
            try:
                yield Stack(database_url=database_url, redis_url=redis_url, home=base / "home", env=env)
            finally:
                dispose_engine()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def app(stack: Stack):  # type: ignore[no-untyped-def]
    from api.app import create_app

    return create_app()


@pytest.fixture(scope="session")
def client(app):  # type: ignore[no-untyped-def]
    from fastapi.testclient import TestClient

    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


@dataclass
class TenantKeys:
    name: str
    admin_key: str
    tenant_id: int

    def headers(self, key: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {key or self.admin_key}"}


@pytest.fixture
def make_tenant(stack: Stack) -> Callable[..., TenantKeys]:
    from core.db import system_session
    from core.tenancy.service import create_tenant, get_tenant_by_name

    def make(prefix: str = "t") -> TenantKeys:
        name = f"{prefix}-{uuid.uuid4().hex[:10]}"
        with system_session() as session:
            issued = create_tenant(session, name=name)
            tenant = get_tenant_by_name(session, name=name)
            assert tenant is not None
            return TenantKeys(name=name, admin_key=issued.api_key, tenant_id=tenant.id)

    return make


@pytest.fixture
def tenant(make_tenant: Callable[..., TenantKeys]) -> TenantKeys:
    return make_tenant()


@pytest.fixture
def member_key(client, tenant: TenantKeys) -> Callable[[str], str]:  # type: ignore[no-untyped-def]
    def make(user: str = "member@example.com") -> str:
        response = client.post("/v1/keys", json={"user": user, "role": "member"}, headers=tenant.headers())
        assert response.status_code == 201, response.text
        return response.json()["api_key"]

    return make


@pytest.fixture(scope="module")
def worker(stack: Stack) -> Iterator[WorkerProcess]:
    """A worker for one test module only: later modules (search, say) must not see their memories embedded
    in the background at a moment of its choosing."""
    process = WorkerProcess(stack)
    yield process
    process.stop()


@pytest.fixture(scope="module")
def api_url(stack) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """The real API (uvicorn) in a subprocess on the test stack."""
    with running_api(stack.env) as url:
        yield url


@pytest.fixture
def api_server(stack, worker) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """`engram api` in its own process, as production runs it."""
    from api.serve.embedded import free_port

    port = free_port()
    log = open(f"/tmp/engram-api-{port}.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "api", "--host", "127.0.0.1", "--port", str(port), "--no-migrate"],
        cwd=REPO,
        env={**os.environ, **stack.env},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        try:
            return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return process.poll() is not None  # exited: stop waiting, the assertion below reports it

    wait_for(up, timeout=60)
    assert process.poll() is None, Path(log.name).read_text()
    yield url
    process.terminate()
    process.wait(timeout=20)
    log.close()
    Path(log.name).unlink(missing_ok=True)


@pytest.fixture
def catalog(client, tenant, tmp_path):  # type: ignore[no-untyped-def]
    """Datasources `shop` and its character-prefix sibling `shop_v2`, a hidden model and a hidden column."""
    db = tmp_path / "shop.db"
    sqlite3.connect(db).close()
    for name in ("shop", "shop_v2"):
        response = client.post(
            "/v1/datasources", json={"name": name, "url": f"sqlite:///{db}"}, headers=tenant.headers()
        )
        assert response.status_code == 201, response.text
    models = {
        ("shop", "orders"): {
            "description": "Customer orders",
            "columns": [
                {"name": "amount", "type": "INTEGER", "description": "order amount in cents"},
                {"name": "status", "type": "TEXT", "description": "fulfilment status"},
                {"name": "secret", "type": "TEXT", "description": "zanzibar token", "hidden": True},
            ],
            "measures": [{"name": "aov", "formula": "amount:avg", "description": "average order value"}],
        },
        ("shop", "internal"): {"hidden": True, "columns": [{"name": "zanzibar", "type": "TEXT"}]},
        ("shop_v2", "orders"): {"columns": [{"name": "amount", "type": "INTEGER", "description": "amount"}]},
    }
    for (ds, model), body in models.items():
        response = client.put(f"/v1/models/{ds}/{model}", json=body, headers=tenant.headers())
        assert response.status_code == 200, response.text
    return tenant
