"""`engram audit`: the tenant's audit log over the REST API (an admin key)."""

from __future__ import annotations

from typing import Any

import click

from api.cli.memory import emit, format_option
from api.cli.ops import _call, _http, with_connection


def _row(entry: dict[str, Any]) -> dict[str, Any]:
    actor = entry.get("actor") or {}
    return {**entry, "user": actor.get("user"), "key_id": actor.get("key_id"), "agent_id": actor.get("agent_id")}


@click.command("audit")
@click.option("--action", default=None, help="an action (memory.save) or a family of them (memory)")
@click.option("--actor", default=None, help="a user, key id or agent id")
@click.option("--since", default=None, help="only entries at or after this ISO 8601 time")
@click.option("--limit", type=int, default=50, show_default=True, help="entries to show (pages are fetched)")
@format_option
@with_connection
def audit(
    action: str | None, actor: str | None, since: str | None, limit: int, fmt: str, url: str | None, api_key: str | None
) -> None:
    """Who did what in the tenant, newest first (an admin key)."""
    client = _http(url, api_key)
    entries: list[dict[str, Any]] = []
    cursor: str | None = None
    try:
        while len(entries) < limit:
            params = {"action": action, "actor": actor, "since": since, "limit": min(200, limit - len(entries))}
            page = _call(client, "GET", "/v1/audit", params={**params, "cursor": cursor})
            entries += page.get("entries", [])
            cursor = page.get("next_cursor")
            if not cursor:
                break
    finally:
        client.close()
    emit(
        {"entries": entries, "next_cursor": cursor},
        fmt=fmt,
        rows=[_row(e) for e in entries],
        columns=("at", "action", "target", "user", "key_id", "agent_id", "request_id"),
    )
