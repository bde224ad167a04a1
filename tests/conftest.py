"""The real stack for the suite: PostgreSQL (pgvector), Redis, and a Celery worker when a test asks.

Embedded PostgreSQL and Redis start once per session under /tmp (world-traversable, which the postgres
system user needs when the suite runs as root), unless ENGRAM_TEST_DATABASE_URL /
ENGRAM_TEST_REDIS_URL name servers to use instead. Tests isolate themselves by creating their own tenants.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[1]
OPERATOR_KEY = "egop_test-operator-key"


# Every directory a test makes under /tmp (for servers whose files the postgres user must reach) is made
# here, so the session can check at its end that each one was removed by the test that made it.
_TEMP_DIRS: list[Path] = []


def make_temp_dir(prefix: str) -> Path:
    """A world-traversable directory under /tmp; its test removes it (checked when the session ends)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    _TEMP_DIRS.append(path)
    return path


@pytest.fixture(scope="session", autouse=True)
def _temp_dirs_removed() -> Iterator[None]:
    """The suite leaves nothing under /tmp: a directory a test made and left is removed and reported."""
    yield
    left = [path for path in _TEMP_DIRS if path.exists()]
    for path in left:
        shutil.rmtree(path, ignore_errors=True)
    assert not left, f"tests left these behind (now removed): {left}"


@dataclass
class Stack:
    database_url: str
    redis_url: str
    home: Path
    env: dict[str, str]


@pytest.fixture(scope="session")
def stack() -> Iterator[Stack]:
    from core.db import dispose_engine
    from core.embedded import embedded_services

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


class WorkerProcess:
    """A real `engram worker` subprocess on the test stack."""

    def __init__(self, stack: Stack, *, extra_env: dict[str, str] | None = None, concurrency: int = 2):
        # Under the session's directory, so the log outlives the worker (tests read it after stop) but not the
        # session.
        log_dir = stack.home.parent / "logs"
        log_dir.mkdir(exist_ok=True)
        self.log_path = Path(tempfile.mkstemp(prefix="engram-worker-", suffix=".log", dir=log_dir)[1])
        env = {**os.environ, **stack.env, **(extra_env or {})}
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.process = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "worker", f"--concurrency={concurrency}"],
            cwd=REPO,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"worker exited early:\n{self.log_path.read_text()[-3000:]}")
            # `engram worker` runs a Celery process per lane (interactive, bulk): both say "ready.".
            if self.log_path.read_text(errors="replace").count("ready.") >= 2:
                return
            time.sleep(0.2)
        raise RuntimeError(f"worker not ready:\n{self.log_path.read_text()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        stop_process(self.process)
        self._log.close()


@pytest.fixture(scope="module")
def worker(stack: Stack) -> Iterator[WorkerProcess]:
    """A worker for one test module only: later modules (search, say) must not see their memories embedded
    in the background at a moment of its choosing."""
    process = WorkerProcess(stack)
    yield process
    process.stop()


def stop_process(process: subprocess.Popen[bytes], *, timeout: float = 20.0) -> None:
    """Terminate a child the test started, killing it when it does not exit within ``timeout``."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def answers_health(url: str) -> bool:
    """Whether the engram API at ``url`` answers /healthz with 200 within a second."""
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def wait_for(predicate: Callable[[], object], *, timeout: float = 30.0, interval: float = 0.1) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)
