"""Fault drills' own stack: a Redis of their own (to stop and start), an API, beat and workers, with fast or
shipped recovery timings; and the tenant, batches and counts the drills work with."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import text

from api.serve.embedded import EmbeddedRedis, free_port
from tests.helpers.processes import REPO, WorkerProcess, answers_health, make_temp_dir, stop_process, wait_for

DRILL_ENV = {
    "ENGRAM_BROKER_VISIBILITY_TIMEOUT_SECONDS": "5",
    "ENGRAM_JOB_RUNNING_LEASE_SECONDS": "8",
    "ENGRAM_OUTBOX_REDISPATCH_SECONDS": "2",
    "ENGRAM_RECONCILE_INTERVAL_SECONDS": "1",
    "ENGRAM_JOB_RETRY_BASE_SECONDS": "0.2",
    "ENGRAM_JOB_RETRY_MAX_SECONDS": "2",
}


def _defaults(*names: str) -> dict[str, str]:
    """The shipped defaults of these settings, as environment values (overriding the suite's fast ones)."""
    from core.config import Settings

    return {f"ENGRAM_{n.upper()}": str(Settings.model_fields[n].default) for n in names}


DEFAULT_RECOVERY_ENV = _defaults(
    "broker_visibility_timeout_seconds",
    "job_running_lease_seconds",
    "outbox_redispatch_seconds",
    "reconcile_interval_seconds",
)


class Drill:
    def __init__(self, stack, base: Path, drill_env: dict[str, str] = DRILL_ENV):  # type: ignore[no-untyped-def]
        self.base = base
        self.drill_env = drill_env
        self.redis = EmbeddedRedis(data_dir=base / "redis")
        self.redis_url = self.redis.start()
        self.env = {**os.environ, **stack.env, **drill_env, "ENGRAM_REDIS_URL": self.redis_url}
        self.stack = stack
        self.processes: list[subprocess.Popen[bytes]] = []
        self.workers: list[WorkerProcess] = []
        self.port = free_port()
        self._spawn("api", ["api", "--port", str(self.port), "--no-migrate"])
        self._spawn("beat", ["beat"])
        self.url = f"http://127.0.0.1:{self.port}"
        wait_for(lambda: answers_health(self.url), timeout=60)

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.base / f"{name}.log", "wb")  # noqa: SIM115
        self.processes.append(
            subprocess.Popen([sys.executable, "-m", "api.cli", *args], cwd=REPO, env=self.env, stdout=log, stderr=log)
        )

    def start_worker(self, **extra_env: str) -> WorkerProcess:
        stack = type(self.stack)(**{**self.stack.__dict__, "env": {**self.stack.env, **self.drill_env}})
        worker = WorkerProcess(stack, extra_env={"ENGRAM_REDIS_URL": self.redis_url, **extra_env})
        self.workers.append(worker)
        return worker

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()
        for process in self.processes:
            stop_process(process)
        self.redis.stop()


@contextmanager
def running_drill(stack, **options: Any) -> Iterator[Drill]:  # type: ignore[no-untyped-def]
    """A drill in its own directory under /tmp, stopped and removed afterwards."""
    base = make_temp_dir("engram-drill-")
    d = Drill(stack, base, **options)
    try:
        yield d
    finally:
        d.stop()
        shutil.rmtree(base, ignore_errors=True)


def new_tenant() -> tuple[int, dict[str, str]]:
    from core.db import system_session
    from core.tenancy.service import create_tenant, get_tenant_by_name

    name = f"drill-{uuid.uuid4().hex[:8]}"
    with system_session() as session:
        key = create_tenant(session, name=name).api_key
        tenant = get_tenant_by_name(session, name=name)
        assert tenant is not None
        return tenant.id, {"Authorization": f"Bearer {key}"}


def embedded_count(tenant_id: int) -> int:
    from core.db import system_connection

    with system_connection() as connection:
        return int(
            connection.execute(
                text("SELECT count(*) FROM embeddings WHERE tenant_id = :t AND doc_kind = 'memory'"), {"t": tenant_id}
            ).scalar()
            or 0
        )


def save_batches(url: str, headers: dict[str, str], *, total: int, size: int, first: int = 0) -> None:
    """``total`` saves in batches of ``size``, their contents numbered from ``first`` (each its own text)."""
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        for start in range(first, first + total, size):
            items = [
                {"content": f"drill memory {i}: the nightly load of orders finished late"}
                for i in range(start, start + size)
            ]
            response = http.post("/v1/memories:batch", json={"items": items})
            assert response.status_code == 200, response.text
