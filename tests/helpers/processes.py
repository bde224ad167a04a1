"""Processes and places the tests start: the repository root, temporary directories under /tmp (checked at
the session's end), a real Celery worker, a real API in a subprocess, and waiting for things to happen."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]

# Every directory a test makes under /tmp (for servers whose files the postgres user must reach) is made
# here, so the session can check at its end that each one was removed by the test that made it.
TEMP_DIRS: list[Path] = []


def make_temp_dir(prefix: str) -> Path:
    """A world-traversable directory under /tmp; its test removes it (checked when the session ends)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    path.chmod(0o755)
    TEMP_DIRS.append(path)
    return path


@dataclass
class Stack:
    database_url: str
    redis_url: str
    home: Path
    env: dict[str, str]


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


@contextmanager
def running_api(env: dict[str, str]) -> Iterator[str]:
    """Start `uvicorn api.main:app` on a free loopback port; yield its URL once /healthz answers; stop it."""
    from api.serve.embedded import free_port

    port = free_port()
    log = Path(tempfile.mkstemp(prefix="engram-api-", suffix=".log", dir="/tmp")[1])
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "api.main:app", "--port", str(port), "--log-level", "warning"],
            cwd=REPO,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while not answers_health(url):
                assert process.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            yield url
        finally:
            stop_process(process, timeout=30)
    log.unlink(missing_ok=True)
