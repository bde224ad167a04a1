"""`engram serve`: the whole service on one machine, supervised, and stopped cleanly.

Starts embedded PostgreSQL (pgvector) and Redis under the home unless ENGRAM_DATABASE_URL /
ENGRAM_REDIS_URL name real ones, applies migrations, creates the default tenant on first run, then runs
the API, one Celery worker and beat as child processes. SIGINT/SIGTERM stop the children first, then the
embedded servers; every child also dies with this process (PDEATHSIG) if it is killed outright.
"""

from __future__ import annotations

import errno
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import httpx
from cryptography.fernet import Fernet

from api.serve.embedded import EmbeddedPostgres, EmbeddedRedis
from api.serve.supervise import die_with_parent
from core.config import Settings, get_settings, reset_settings_cache
from core.db import dispose_engine, system_session
from core.migrate import upgrade
from core.runtime import clear_runtime, engram_command, read_runtime, write_runtime
from core.source_guard import describe_policy, serve_policy
from core.tenancy.service import create_tenant, get_tenant_by_name


def api_workers(settings: Settings) -> int:
    """How many processes serve's API runs (`engram api --workers`): ENGRAM_API_WORKERS when set; else two on a
    machine of two cores or more, one on a single core. With two, one busy tenant's connections go to both in turn
    (api.serve.routed), so its requests can use two cores where one process's interpreter lock holds them to
    one: the load mix on two cores served 1.3x the requests/s of one process, search p95 under 400 ms
    (docs/benchmarks.md, Load)."""
    if "api_workers" in settings.model_fields_set:
        return settings.api_workers
    return 2 if (os.cpu_count() or 1) >= 2 else 1


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    restarts: list[float] = field(default_factory=list)


def _spawn(child: Child, env: dict[str, str], log_dir: Path) -> None:
    log = open(log_dir / f"{child.name}.log", "ab")  # noqa: SIM115 - the child owns it
    child.process = subprocess.Popen(
        child.argv, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent(signal.SIGTERM)
    )


def _operator_key(settings: Settings) -> tuple[str, bool]:
    """The operator key: the setting, else the one stored in the home (made on first run)."""
    if settings.operator_key:
        return settings.operator_key, False
    path = settings.home / "operator_key"
    if path.exists():
        return path.read_text().strip(), False
    key = "egop_" + secrets.token_urlsafe(32)
    path.write_text(key)
    path.chmod(0o600)
    return key, True


def _secret_key(settings: Settings) -> str:
    if settings.secret_key:
        return settings.secret_key
    path = settings.home / "secret_key"
    if not path.exists():
        path.write_text(Fernet.generate_key().decode())
        path.chmod(0o600)
    return path.read_text().strip()


def _bootstrap_default_tenant(home: Path) -> str | None:
    """On serve's first run on this home, create tenant `default` with an admin key (unless it exists)."""
    marker = home / ".default-tenant"
    if marker.exists():
        return None

    with system_session() as session:
        key = None if get_tenant_by_name(session, name="default") else create_tenant(session, name="default").api_key
    marker.write_text("created on first run\n")
    return key


def _wait_http(url: str, *, timeout: float, children: list[Child]) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(c.process is not None and c.process.poll() is not None for c in children if c.name == "api"):
            return False
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return False


def ensure_port_free(host: str, port: int) -> None:
    """Fail at once, before anything starts or is printed, when another process holds the API's port."""

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        # As uvicorn binds: SO_REUSEADDR, so a port left in TIME_WAIT by a stopped serve is not "in use".
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            reason = "is already in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
            raise click.ClickException(f"port {port} on {host} {reason}; choose another with --port") from None


def _cause(log_path: Path) -> str:
    """The ": <message>" of the last error a child logged (its lines are JSON, core.logging), or nothing."""

    try:
        lines = log_path.read_text(errors="replace").splitlines()[-200:]
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("level") in ("ERROR", "CRITICAL"):
            return f": {str(record.get('message', '')).splitlines()[0][:300]}"
    return ""


def serve(*, host: str, port: int, home: Path) -> None:
    ensure_port_free(host, port)
    home = home.expanduser().resolve()
    home.mkdir(parents=True, exist_ok=True)
    os.environ["ENGRAM_HOME"] = str(home)
    reset_settings_cache()
    settings = get_settings()

    if read_runtime(home) is not None:
        raise click.ClickException(f"engram serve is already running on {home} (see {home / 'runtime.json'})")

    stop_event = threading.Event()

    def _on_signal(signum: int, frame: object) -> None:
        stop_event.set()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)

    embedded: list = []
    children: list[Child] = []
    try:
        database_url, redis_url = settings.database_url, settings.redis_url
        if not database_url:
            pg = EmbeddedPostgres.for_home(home)
            embedded.append(pg)
            database_url = pg.start()
        if not redis_url:
            redis_server = EmbeddedRedis(data_dir=home / "redis")
            embedded.append(redis_server)
            redis_url = redis_server.start()
        operator_key, new_operator_key = _operator_key(settings)
        os.environ.update(
            ENGRAM_DATABASE_URL=database_url,
            ENGRAM_REDIS_URL=redis_url,
            ENGRAM_OPERATOR_KEY=operator_key,
            ENGRAM_SECRET_KEY=_secret_key(settings),
            ENGRAM_DATASOURCE_POLICY=serve_policy(),
        )
        reset_settings_cache()
        upgrade()
        admin_key = _bootstrap_default_tenant(home)
        # This process also answers nothing as the owner: no connection opened to migrate stays open.
        dispose_engine()
        api_url = f"http://{host}:{port}"
        write_runtime(
            {
                "pid": os.getpid(),
                "database_url": database_url,
                "redis_url": redis_url,
                "api_url": api_url,
                # Other commands on this home (core.source_guard.policy) judge sources as serve does.
                "datasource_policy": serve_policy(),
            },
            home,
        )
        env = dict(os.environ)
        exe = engram_command()
        workers = str(api_workers(settings))
        children = [
            Child("api", [*exe, "api", "--host", host, "--port", str(port), "--no-migrate", "--workers", workers]),
            Child("worker", [*exe, "worker"]),
            Child("beat", [*exe, "beat"]),
        ]
        log_dir = home / "logs"
        log_dir.mkdir(exist_ok=True)
        for child in children:
            _spawn(child, env, log_dir)
        if not _wait_http(f"{api_url}/healthz", timeout=60, children=children):
            raise click.ClickException(f"the API did not start{_cause(log_dir / 'api.log')}; see {log_dir / 'api.log'}")
        click.echo(f"engram is running\n  API:       {api_url}\n  dashboard: {api_url}/dashboard\n  home:      {home}")
        click.echo(f"  {describe_policy()}")
        if admin_key:
            click.echo(f"  default tenant admin key (shown once): {admin_key}")
        if new_operator_key:
            click.echo(f"  operator key (shown once; also in {home / 'operator_key'}): {operator_key}")
        click.echo("Press Ctrl-C to stop.", err=False)
        sys.stdout.flush()
        _supervise(children, embedded=embedded, env=env, log_dir=log_dir, stop_event=stop_event)
    finally:
        _stop_children(children)
        for server in reversed(embedded):
            server.stop()
        clear_runtime(home)
        click.echo("engram stopped.")


def _supervise(
    children: list[Child], *, embedded: list[Any], env: dict[str, str], log_dir: Path, stop_event: threading.Event
) -> None:
    """Restart a child or an embedded server that dies (a child at most 5 times a minute), until asked to stop.

    An embedded server comes back on its own port (clients reconnect to the URL they know); one that cannot
    start yet (a killed PostgreSQL's last backends still hold its shared memory) is tried again each second
    for a minute. Everything restarted is stopped with the rest, since it replaces what ``embedded`` holds.
    """
    down_since: dict[int, float] = {}
    while not stop_event.wait(0.5):
        for server in embedded:
            if server.running():
                down_since.pop(id(server), None)
                continue
            if id(server) not in down_since:
                click.echo(f"embedded {server.what} stopped; restarting", err=True)
            first = down_since.setdefault(id(server), time.monotonic())
            try:
                server.start()
            except Exception as exc:  # noqa: BLE001 - retried until the minute is up
                if time.monotonic() - first > 60:
                    raise click.ClickException(f"embedded {server.what} does not start again: {exc}") from None
                stop_event.wait(1.0)
            else:
                click.echo(f"embedded {server.what} restarted", err=True)
                down_since.pop(id(server), None)
        for child in children:
            if child.process is not None and child.process.poll() is not None:
                now = time.monotonic()
                child.restarts = [t for t in child.restarts if now - t < 60] + [now]
                if len(child.restarts) > 5:
                    log_path = log_dir / (child.name + ".log")
                    raise click.ClickException(f"{child.name} keeps dying{_cause(log_path)}; see {log_path}")
                click.echo(f"{child.name} exited with {child.process.returncode}; restarting", err=True)
                _spawn(child, env, log_dir)


def _stop_children(children: list[Child]) -> None:
    for child in children:
        if child.process is not None and child.process.poll() is None:
            child.process.send_signal(signal.SIGTERM)
    # The API drains its connections first (api.serve.graceful), then finishes running requests.
    deadline = time.monotonic() + 45
    for child in children:
        if child.process is None:
            continue
        try:
            child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.process.kill()
            child.process.wait()
