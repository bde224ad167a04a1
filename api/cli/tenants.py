"""`engram tenant ...`: the operator's calls of CONTRACT section 9 from the command line.

Every command is a REST call made with the operator key, to one of:
- a remote engram: ``--url`` / ``ENGRAM_URL`` (the key from ``--operator-key`` / ``ENGRAM_OPERATOR_KEY``);
- the `engram serve` running on ``--home`` (its operator key from the settings or the home's file);
- otherwise the database itself (``ENGRAM_DATABASE_URL``, or the home's embedded cluster started for the
  command), through engram's own routes in this process, so a local command answers exactly as the API.
A home that holds no engram is refused in one line, and nothing is created there.
"""

# Imports inside the commands are deferred: `engram` loads only the command that runs (see api.cli); the
# in-process app and the database only when no API URL is given.
from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from engram_client import EngramClient

from api.cli import _set_home
from api.cli.memory import emit
from api.cli.ops import _call

QUOTA_FLAGS = (
    ("--max-memories", "max_memories"),
    ("--max-datasources", "max_datasources"),
    ("--requests-per-minute", "requests_per_minute"),
    ("--embedding-texts-per-day", "embedding_texts_per_day"),
)
_COLUMNS = ("tenant", "state", "memories", "datasources", "requests", "searches", "saves", "quotas", "created_at")


def _home_operator_key(home: Path) -> str | None:
    from core.config import get_settings

    configured = get_settings().operator_key
    if configured:
        return configured
    path = home / "operator_key"
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


@contextmanager
def operator_client(*, url: str | None, operator_key: str | None, home: str | None) -> Iterator[Any]:
    """A client holding the operator key, bound to the engram this command is pointed at."""
    from core.config import get_settings
    from core.runtime import read_runtime

    url = url or (None if home else os.environ.get("ENGRAM_URL"))
    if url:
        key = operator_key or os.environ.get("ENGRAM_OPERATOR_KEY")
        if not key:
            raise click.UsageError("the operator key is needed: give --operator-key or set ENGRAM_OPERATOR_KEY")
        with EngramClient(url, api_key=key) as client:
            yield client
        return
    _set_home(home)
    settings = get_settings()
    record = read_runtime()
    served_key = _home_operator_key(settings.home)
    if record and record.get("api_url") and served_key and not settings.database_url:
        with EngramClient(str(record["api_url"]), api_key=served_key) as client:
            yield client
        return
    if not settings.database_url and not record:
        from api.serve.embedded import existing_pg_data_dir

        if existing_pg_data_dir(settings.home) is None:
            raise click.ClickException(
                f"no engram at {settings.home}: start one with `engram serve --home {settings.home}`, "
                "or point at one with --url / ENGRAM_URL or ENGRAM_DATABASE_URL"
            )
    with _in_process(operator_key or served_key) as client:
        yield client


@contextmanager
def _in_process(operator_key: str | None) -> Iterator[Any]:
    """engram's routes in this process, on the configured or the home's database, with an operator key."""
    from api.cli.database import database_session_for_cli
    from api.sdk import LOCAL_URL, InProcessTransport
    from core.config import reset_settings_cache

    if not os.environ.get("ENGRAM_OPERATOR_KEY"):
        # This process's own key: the routes admit the operator by comparing with the setting.
        os.environ["ENGRAM_OPERATOR_KEY"] = operator_key or "egop_" + secrets.token_urlsafe(32)
        reset_settings_cache()
    key = os.environ["ENGRAM_OPERATOR_KEY"]
    with database_session_for_cli():
        from core.migrate import upgrade

        upgrade()
        with EngramClient(LOCAL_URL, api_key=key, transport=InProcessTransport()) as client:
            yield client




def _row(tenant: dict[str, Any]) -> dict[str, Any]:
    """A tenant object flattened for a table: usage figures as columns, quotas as one cell."""
    quotas = tenant.get("quotas") or {}
    limits = ", ".join(f"{k}={v}" for k, v in quotas.items() if v is not None) or "unlimited"
    return {**tenant, **(tenant.get("usage") or {}), "quotas": limits}


connection = [
    click.option("--url", default=None, help="API URL of a remote engram (default: $ENGRAM_URL, else the local home)"),
    click.option("--operator-key", default=None, help="the operator key (default: $ENGRAM_OPERATOR_KEY)"),
    click.option("--home", type=click.Path(file_okay=False), default=None, help="engram home (default ~/.engram)"),
]
format_option = click.option(
    "--format", "fmt", type=click.Choice(["json", "table"]), default="table", show_default=True
)


def with_connection(fn: Any) -> Any:
    for option in reversed(connection):
        fn = option(fn)
    return fn


def _quota_options(fn: Any) -> Any:
    for flag, name in reversed(QUOTA_FLAGS):
        fn = click.option(flag, name, default=None, metavar="N|none", help=f"{name} (none: unlimited)")(fn)
    return fn


def _quotas(values: dict[str, str | None]) -> dict[str, int | None]:
    chosen: dict[str, int | None] = {}
    for name, raw in values.items():
        if raw is None:
            continue
        if raw.lower() in ("none", "unlimited", "null"):
            chosen[name] = None
        elif raw.isdigit():
            chosen[name] = int(raw)
        else:
            raise click.BadParameter(f"{name} must be a whole number or 'none'")
    return chosen


@click.group("tenant")
def tenant() -> None:
    """Provision, list, suspend, limit and offboard tenants (the operator key)."""


@tenant.command("create")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help='print {"tenant", "api_key"} only')
@click.option("--admin-user", default="admin@localhost", show_default=True)
@_quota_options
@with_connection
def tenant_create(
    name: str, as_json: bool, admin_user: str, url: str | None, operator_key: str | None, home: str | None,
    **quota_values: str | None,
) -> None:  # fmt: skip
    """Create a tenant and its first admin key (shown once)."""
    body: dict[str, Any] = {"name": name, "admin_user": admin_user}
    quotas = _quotas(quota_values)
    if quotas:
        body["quotas"] = quotas
    with operator_client(url=url, operator_key=operator_key, home=home) as client:
        made = _call(client, "POST", "/v1/tenants", json=body)
    if as_json:
        click.echo(json.dumps({"tenant": made["tenant"], "api_key": made["api_key"]}))
    else:
        click.echo(f"tenant {made['tenant']} created\nadmin key (shown once): {made['api_key']}")


@tenant.command("list")
@click.option("--state", type=click.Choice(["active", "suspended"]), default=None)
@click.option("--prefix", "prefix", default=None, help="only names starting with this")
@click.option("--limit", default=1000, show_default=True, help="at most this many tenants")
@format_option
@with_connection
def tenant_list(
    state: str | None, prefix: str | None, limit: int, fmt: str, url: str | None, operator_key: str | None,
    home: str | None,
) -> None:  # fmt: skip
    """Tenants by name, with state, quotas and today's usage."""
    tenants: list[dict[str, Any]] = []
    cursor: str | None = None
    with operator_client(url=url, operator_key=operator_key, home=home) as client:
        while len(tenants) < limit:
            params = {k: v for k, v in {"state": state, "q": prefix, "cursor": cursor}.items() if v}
            page = _call(client, "GET", "/v1/tenants", params={**params, "limit": min(200, limit - len(tenants))})
            tenants += page["tenants"]
            cursor = page["next_cursor"]
            if not cursor:
                break
    emit({"tenants": tenants}, fmt=fmt, rows=[_row(t) for t in tenants], columns=_COLUMNS)


@tenant.command("show")
@click.argument("name")
@format_option
@with_connection
def tenant_show(name: str, fmt: str, url: str | None, operator_key: str | None, home: str | None) -> None:
    """One tenant with its current usage."""
    with operator_client(url=url, operator_key=operator_key, home=home) as client:
        found = _call(client, "GET", f"/v1/tenants/{name}")
    emit(found, fmt=fmt, rows=[_row(found)], columns=_COLUMNS)


def _patch(name: str, body: dict[str, Any], *, fmt: str, url: str | None, key: str | None, home: str | None) -> None:
    with operator_client(url=url, operator_key=key, home=home) as client:
        changed = _call(client, "PATCH", f"/v1/tenants/{name}", json=body)
    emit(changed, fmt=fmt, rows=[_row(changed)], columns=_COLUMNS)


@tenant.command("suspend")
@click.argument("name")
@format_option
@with_connection
def tenant_suspend(name: str, fmt: str, url: str | None, operator_key: str | None, home: str | None) -> None:
    """Refuse the tenant's keys (403 tenant_suspended); its data and queued jobs are kept."""
    _patch(name, {"state": "suspended"}, fmt=fmt, url=url, key=operator_key, home=home)


@tenant.command("resume")
@click.argument("name")
@format_option
@with_connection
def tenant_resume(name: str, fmt: str, url: str | None, operator_key: str | None, home: str | None) -> None:
    """Let a suspended tenant's keys in again; its queued jobs go on."""
    _patch(name, {"state": "active"}, fmt=fmt, url=url, key=operator_key, home=home)


@tenant.command("quota")
@click.argument("name")
@_quota_options
@format_option
@with_connection
def tenant_quota(
    name: str, fmt: str, url: str | None, operator_key: str | None, home: str | None, **quota_values: str | None
) -> None:
    """Set the quotas named (none: unlimited); with none named, show the tenant's."""
    quotas = _quotas(quota_values)
    if not quotas:
        with operator_client(url=url, operator_key=operator_key, home=home) as client:
            found = _call(client, "GET", f"/v1/tenants/{name}")
        emit(found["quotas"], fmt=fmt, rows=[found["quotas"]], columns=tuple(found["quotas"]))
        return
    _patch(name, {"quotas": quotas}, fmt=fmt, url=url, key=operator_key, home=home)


@tenant.command("delete")
@click.argument("name")
@click.option("--yes", is_flag=True, help="do not ask for confirmation")
@format_option
@with_connection
def tenant_delete(
    name: str, yes: bool, fmt: str, url: str | None, operator_key: str | None, home: str | None
) -> None:
    """Offboard the tenant: its keys stop at once and a purge job removes all its data."""
    if not yes:
        click.confirm(f"Offboard tenant {name!r} and erase all its data?", abort=True)
    with operator_client(url=url, operator_key=operator_key, home=home) as client:
        started = _call(client, "DELETE", f"/v1/tenants/{name}")
    emit({"tenant": name, **started}, fmt=fmt, columns=("tenant", "job_id"))
