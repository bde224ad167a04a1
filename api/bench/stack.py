"""A throwaway stack for benchmarks: embedded PostgreSQL and Redis in a temporary home, or the services
named by ENGRAM_DATABASE_URL / ENGRAM_REDIS_URL, with migrations applied."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from api.serve.embedded import embedded_services
from core.config import reset_settings_cache
from core.db import dispose_engine
from core.migrate import upgrade
from core.runtime import engram_command


@dataclass
class BenchStack:
    home: Path
    env: dict[str, str]


@contextmanager
def stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM ends the block as Ctrl-C does: its ``finally`` clauses run (a throwaway stack's processes stopped,
    its files removed), where Python's default would end the process at once and leave them running.

    Only on the main thread (the only one a signal handler can be set on); the handler before is back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def bench_stack() -> Iterator[BenchStack]:
    with stopped_by_sigterm():
        yield from _bench_stack()


def _bench_stack() -> Iterator[BenchStack]:
    base = Path(tempfile.mkdtemp(prefix="engram-bench-", dir="/tmp"))
    base.chmod(0o755)
    saved_env = dict(os.environ)
    try:
        with embedded_services(
            base,
            database_url=os.environ.get("ENGRAM_DATABASE_URL", ""),
            redis_url=os.environ.get("ENGRAM_REDIS_URL", ""),
        ) as (database_url, redis_url):
            env = {
                "ENGRAM_DATABASE_URL": database_url,
                "ENGRAM_REDIS_URL": redis_url,
                "ENGRAM_HOME": str(base / "home"),
                # A single-machine throwaway stack: its generated SQLite catalog sits under /tmp.
                "ENGRAM_DATASOURCE_POLICY": "local",
            }
            os.environ.update(env)
            (base / "home").mkdir()
            reset_settings_cache()
            dispose_engine()
            upgrade()
            try:
                yield BenchStack(home=base / "home", env=env)
            finally:
                dispose_engine()
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        reset_settings_cache()
        shutil.rmtree(base, ignore_errors=True)


def wait_healthy(url: str, process: subprocess.Popen[bytes], *, seconds: float = 60) -> bool:
    """Whether the API at ``url`` answered ``/healthz`` within ``seconds`` (False as soon as it exited)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.1)


@contextmanager
def api_process(stack: BenchStack, *, port: int) -> Iterator[str]:
    """The real API (uvicorn) in a subprocess on the bench stack; yields its base URL."""
    with api_server(stack, port=port) as (url, _pid):
        yield url


@contextmanager
def api_server(stack: BenchStack, *, port: int, inherit: bool = True) -> Iterator[tuple[str, int]]:
    """As `api_process`, yielding the base URL and the process id (to read its RSS and open files). ``inherit``
    False: the process gets ``stack.env`` alone, not this process's environment under it."""
    log = open(stack.home / "api.log", "wb")  # noqa: SIM115
    process = subprocess.Popen(
        [*engram_command(), "api", "--port", str(port), "--no-migrate"],
        env={**os.environ, **stack.env} if inherit else stack.env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_healthy(url, process):
            raise RuntimeError(f"API did not start: {(stack.home / 'api.log').read_text()[-2000:]}")
        yield url, process.pid
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
