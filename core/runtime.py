"""Where the running services are: explicit settings, else the runtime file `engram serve` writes.

`engram serve` records the URLs of its embedded PostgreSQL and Redis (and of the API) in
``<home>/runtime.json`` so that `engram tenant create`, `engram migrate`, the CLI and `engram mcp` reach
the same storage while it runs.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from core.config import get_settings


def engram_command() -> list[str]:
    """The argv that runs this installation's `engram` in a child process, from any current directory.

    ``python -m api.cli`` puts the current directory first on ``sys.path``: started from a project holding
    an ``api/`` (or ``core/``, ``workers/``) package, the child imported that one (``No module named
    api.cli``). ``-P`` (Python 3.11+) leaves the current directory out; PYTHONPATH still applies.
    """
    return [sys.executable, "-P", "-m", "api.cli"]


class ServiceNotRunning(RuntimeError):
    pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read_runtime(home: Path | None = None) -> dict[str, Any] | None:
    """The runtime record of a live `engram serve` on this home, or None."""
    path = (home or get_settings().home) / "runtime.json"
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not _pid_alive(int(record.get("pid", 0) or 0)):
        return None
    return record


def write_runtime(record: dict[str, Any], home: Path | None = None) -> None:
    path = (home or get_settings().home) / "runtime.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.chmod(0o600)
    tmp.replace(path)


def clear_runtime(home: Path | None = None) -> None:
    path = (home or get_settings().home) / "runtime.json"
    path.unlink(missing_ok=True)


def _resolve(key: str, setting: str) -> str:
    settings = get_settings()
    explicit = getattr(settings, setting)
    if explicit:
        return explicit
    record = read_runtime()
    if record and record.get(key):
        return str(record[key])
    raise ServiceNotRunning(
        f"no {setting.upper()} configured and no running `engram serve` under {settings.home}: "
        f"start `engram serve` or set ENGRAM_{setting.upper()}"
    )


def resolve_database_url() -> str:
    return _resolve("database_url", "database_url")


def resolve_redis_url() -> str:
    return _resolve("redis_url", "redis_url")


def resolve_api_url() -> str:
    record = read_runtime()
    if record and record.get("api_url"):
        return str(record["api_url"])
    settings = get_settings()
    return f"http://{settings.host}:{settings.port}"

