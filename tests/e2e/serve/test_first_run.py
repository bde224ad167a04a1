"""A newcomer's first commands: `engram --version`, and `engram serve` on a port already taken."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from core import __version__

REPO = Path(__file__).resolve().parents[3]


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


def test_tables_print_lists_and_numbers_for_people(capsys):
    from api.cli.memory import cell, emit

    assert cell(["shop.orders.amount", "shop.orders"]) == "shop.orders.amount, shop.orders"
    assert cell(0.04918032786885246) == "0.049" and cell(1.0) == "1" and cell(0.5) == "0.5"
    assert cell(None) == "" and cell(True) == "yes"
    error = "OperationalError: " + "the source is unreachable because " * 5 + "of the END"
    emit(
        {},
        fmt="table",
        rows=[{"id": "j1", "error": error, "entities": ["a", "b"]}],
        columns=("id", "entities", "error"),
    )
    out = capsys.readouterr().out
    assert "the END" in out and "a, b" in out and "[" not in out


def test_serve_names_the_cause_a_child_logged(tmp_path):
    """When the API does not start or keeps dying, serve's one-line error carries the child's last error."""
    from api.serve.stack import _cause

    log = tmp_path / "api.log"
    assert _cause(log) == ""
    log.write_text(
        '{"level": "INFO", "message": "Started server process"}\n'
        "a line that is not JSON\n"
        '{"level": "ERROR", "message": "[Errno 98] address already in use\\nmore"}\n'
        '{"level": "INFO", "message": "Waiting"}\n'
    )
    assert _cause(log) == ": [Errno 98] address already in use"
