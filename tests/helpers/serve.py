"""`engram serve` as a user runs it: installed from a wheel (not editable) into a throwaway virtualenv, started
by its console script from a project directory that holds its own `api/`, `core/` and `workers/` packages."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from api.serve.embedded import free_port

REPO = Path(__file__).resolve().parents[2]


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(argv)}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"


def install_wheel(base: Path) -> Path:
    """Build this checkout's wheel and install it into a fresh virtualenv under ``base``; returns `engram`.

    The virtualenv finds the dependencies in the running one's site-packages (a path in a .pth file: that
    directory's own .pth files, among them the editable install's finder, are not run), so nothing is
    downloaded, and `api`, `core`, `workers` and `engram_client` come from the wheel alone."""
    source = base / "src"
    # What the wheel is built from: the server's packages and the Python client it ships (clients/python).
    for name in ("api", "core", "workers", "clients/python/engram_client"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    python = sys.executable
    wheel_args = ["wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(base / "dist")]
    _run([python, "-m", "pip", *wheel_args, str(source)])
    wheel = next((base / "dist").glob("engram_memory_server-*.whl"))
    venv = base / "venv"
    _run([python, "-m", "venv", "--without-pip", str(venv)])
    venv_python = venv / "bin" / "python"
    site = subprocess.run(
        [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "shared-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    install_args = ["--python", str(venv_python), "install", "--no-deps", "--no-index", "-q", str(wheel)]
    _run([python, "-m", "pip", *install_args])
    shutil.rmtree(source)
    return venv / "bin" / "engram"


def hostile_project(base: Path) -> Path:
    """A FastAPI-style project directory whose packages shadow engram's top-level ones."""
    project = base / "project"
    for package in ("api", "core", "workers"):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text("# the user's own package, not engram's\n")
    return project


def clean_env(home: Path) -> dict[str, str]:
    """The environment of a user's shell: no engram settings, no PYTHONPATH pointing into this checkout."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_") and k != "PYTHONPATH"}
    env["ENGRAM_HOME"] = str(home)
    return env


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    url: str
    home: Path
    output_path: Path
    admin_key: str | None

    def output(self) -> str:
        return self.output_path.read_text(errors="replace")

    def runtime(self) -> dict[str, str]:
        return json.loads((self.home / "runtime.json").read_text())

    def owner_dsn(self) -> str:
        return self.runtime()["database_url"].replace("postgresql+psycopg://", "postgresql://")

    def stop(self, *, timeout: float = 90) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def start_serve(engram: Path, *, cwd: Path, home: Path, output: Path, port: int | None = None) -> Served:
    port = port or free_port()
    offset = output.stat().st_size if output.exists() else 0  # this start's lines only

    def printed() -> str:
        return output.read_text(errors="replace")[offset:]

    with open(output, "ab") as out:
        process = subprocess.Popen(
            [str(engram), "serve", "--port", str(port), "--home", str(home)],
            cwd=cwd,
            env=clean_env(home),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 120
    while "Press Ctrl-C" not in printed():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"serve did not start:\n{printed()[-4000:]}")
        time.sleep(0.2)
    found = re.findall(r"admin key \(shown once\): (\S+)", printed())
    return Served(process, f"http://127.0.0.1:{port}", home, output, found[-1] if found else None)


def roles_connected(served: Served) -> dict[str, int]:
    """Client connections to serve's PostgreSQL by login role, this probe's own left out."""
    with psycopg.connect(served.owner_dsn(), connect_timeout=5) as connection:
        rows = connection.execute(
            "SELECT usename, count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' "
            "AND pid <> pg_backend_pid() GROUP BY usename"
        ).fetchall()
    return {str(name): int(count) for name, count in rows}
