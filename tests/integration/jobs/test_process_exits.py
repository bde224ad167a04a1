"""`engram worker` and `engram beat` exit non-zero when they die of an error, and the supervised worker
comes back by itself."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers.processes import REPO, make_temp_dir, stop_process

FAULTS = REPO / "tests" / "helpers" / "faults"

pytestmark = pytest.mark.slow


def _env(stack, base: Path, **extra: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    path = os.pathsep.join(p for p in (str(FAULTS), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **stack.env, "PYTHONPATH": path, "ENGRAM_HOME": str(base), **extra}


def test_a_worker_that_dies_of_an_unrecoverable_error_exits_non_zero(stack):
    base = make_temp_dir("engram-exit-")
    try:
        env = _env(stack, base, ENGRAM_TEST_CONSUMER_CRASH_MARKER=str(base / "crashed"))
        done = subprocess.run(
            [sys.executable, "-m", "api.cli", "worker", "--no-supervise"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "Unrecoverable error" in done.stdout + done.stderr, done.stderr[-2000:]
        assert done.returncode != 0
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_engram_worker_restarts_celery_after_an_unrecoverable_error(stack):
    base = make_temp_dir("engram-exit-")
    log = base / "worker.log"
    try:
        env = _env(stack, base, ENGRAM_TEST_CONSUMER_CRASH_MARKER=str(base / "crashed"))
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "api.cli", "worker"], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        try:
            deadline = time.monotonic() + 120

            def restarted_and_ready() -> bool:
                # `engram worker` supervises a Celery process per lane; the one that died is started again,
                # and both lanes end up ready.
                text = log.read_text(errors="replace")
                restarted = re.search(r"worker-(interactive|bulk) exited with 1; restarting", text)
                return restarted is not None and text.count("ready.") >= 2

            while not restarted_and_ready():
                assert process.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.3)
            assert "Unrecoverable error" in log.read_text(errors="replace")
        finally:
            stop_process(process)
        assert process.returncode == 0  # stopped when asked: a clean exit
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_beat_that_dies_of_an_error_exits_non_zero(stack):
    base = make_temp_dir("engram-exit-")
    try:
        done = subprocess.run(
            [sys.executable, "-m", "api.cli", "beat"],
            cwd=REPO,
            env=_env(stack, base, ENGRAM_TEST_BEAT_CRASH="1"),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert "the scheduler lost its broker" in done.stdout + done.stderr, done.stderr[-2000:]
        assert done.returncode != 0
    finally:
        shutil.rmtree(base, ignore_errors=True)
