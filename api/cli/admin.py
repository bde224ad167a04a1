"""`engram datasource ...` and `engram key ...`: the tenant admin's REST calls from the command line."""

from __future__ import annotations

from typing import Any

import click

from api.cli.memory import emit, format_option
from api.cli.ops import _call, _http, with_connection


def _rest(url: str | None, api_key: str | None, method: str, path: str, **kwargs: Any) -> Any:
    client = _http(url, api_key)
    try:
        return _call(client, method, path, **kwargs)
    finally:
        client.close()


@click.group("datasource")
def datasource() -> None:
    """Register, list and remove the databases the memories talk about (admin key)."""


@datasource.command("add")
@click.argument("name")
@click.argument("source_url", metavar="URL")
@click.option("--description", default=None)
@click.option("--schema", default=None, help="database schema to reflect (PostgreSQL)")
@click.option("--ingest/--no-ingest", default=False, help="queue an ingest right away")
@format_option
@with_connection
def datasource_add(
    name: str,
    source_url: str,
    description: str | None,
    schema: str | None,
    ingest: bool,
    fmt: str,
    url: str | None,
    api_key: str | None,
) -> None:
    """Register URL (an SQLAlchemy URL; credentials are stored encrypted) as datasource NAME."""
    body = {"name": name, "url": source_url, "description": description, "schema": schema}
    created = _rest(url, api_key, "POST", "/v1/datasources", json={k: v for k, v in body.items() if v is not None})
    if ingest:
        created["ingest_job"] = _rest(url, api_key, "POST", f"/v1/datasources/{name}/ingest", json={})["job_id"]
    emit(created, fmt=fmt, columns=("name", "dialect", "url", *(("ingest_job",) if ingest else ())))


@datasource.command("list")
@format_option
@with_connection
def datasource_list(fmt: str, url: str | None, api_key: str | None) -> None:
    """The tenant's datasources (URLs without their passwords)."""
    page = _rest(url, api_key, "GET", "/v1/datasources")
    columns = ("name", "dialect", "model_count", "last_ingested_at", "url")
    emit(page, fmt=fmt, rows=page["datasources"], columns=columns)


@datasource.command("remove")
@click.argument("name")
@format_option
@with_connection
def datasource_remove(name: str, fmt: str, url: str | None, api_key: str | None) -> None:
    """Delete datasource NAME with its models, columns and embeddings (memories lose their links to it)."""
    emit(_rest(url, api_key, "DELETE", f"/v1/datasources/{name}"), fmt=fmt, columns=("datasource", "status"))


@click.group("key")
def key() -> None:
    """Issue, list and revoke the tenant's API keys (admin key)."""


@key.command("create")
@click.option("--user", required=True, help="the key's user (an email)")
@click.option("--role", type=click.Choice(["member", "admin"]), default="member", show_default=True)
@click.option("--agent-id", default=None, help="bind the key to this agent")
@click.option("--persona", default=None, help="bind the key to this persona")
@click.option("--read-only", is_flag=True, help="the key may read but never write")
@format_option
@with_connection
def key_create(
    user: str,
    role: str,
    agent_id: str | None,
    persona: str | None,
    read_only: bool,
    fmt: str,
    url: str | None,
    api_key: str | None,
) -> None:
    """Issue a key; its secret is shown once."""
    body: dict[str, Any] = {"user": user, "role": role, "agent_id": agent_id, "persona": persona}
    if read_only:
        body["read_only"] = True
    issued = _rest(url, api_key, "POST", "/v1/keys", json={k: v for k, v in body.items() if v is not None})
    emit(issued, fmt=fmt, columns=("id", "user", "role", "agent_id", "persona", "read_only", "api_key"))


@key.command("list")
@format_option
@with_connection
def key_list(fmt: str, url: str | None, api_key: str | None) -> None:
    """The tenant's live keys (never their secrets)."""
    page = _rest(url, api_key, "GET", "/v1/keys")
    columns = ("id", "user", "role", "agent_id", "persona", "read_only", "created_at")
    emit(page, fmt=fmt, rows=page["keys"], columns=columns)


@key.command("revoke")
@click.argument("key_id")
@format_option
@with_connection
def key_revoke(key_id: str, fmt: str, url: str | None, api_key: str | None) -> None:
    """Revoke key KEY_ID (its id from `engram key list`, not its secret)."""
    emit(_rest(url, api_key, "DELETE", f"/v1/keys/{key_id}"), fmt=fmt, columns=("id", "revoked"))
