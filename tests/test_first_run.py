"""A newcomer's first commands: `engram --version`, and `engram serve` on a port already taken."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from core import __version__

REPO = Path(__file__).resolve().parents[1]


def _engram(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "api.cli", *args],
        cwd=REPO,
        env=env or dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_version_prints_the_package_version():
    result = _engram("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"engram {__version__}"


def test_serve_on_a_taken_port_fails_at_once_naming_the_port(tmp_path):
    """Exits non-zero before starting anything or printing a key, with one line naming the port and --port."""
    home = Path(tempfile.mkdtemp(prefix="engram-port-", dir=tmp_path))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
        result = _engram("serve", "--port", str(port), "--home", str(home / "home"), env=env)
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert str(port) in lines[0] and "--port" in lines[0]
    assert "key" not in lines[0]
    assert not (home / "home").exists()  # nothing was started or created
