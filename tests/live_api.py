"""A real engram API (uvicorn in a subprocess) on the test stack, for clients that must reach it over TCP:
the remote MCP server, the SDK, the TypeScript client and the framework adapters."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from core.embedded import free_port
from tests.conftest import answers_health, stop_process

REPO = Path(__file__).resolve().parents[1]


@contextmanager
def running_api(env: dict[str, str]) -> Iterator[str]:
    """Start `uvicorn api.main:app` on a free loopback port; yield its URL once /healthz answers; stop it."""
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
