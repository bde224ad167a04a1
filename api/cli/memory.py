"""`engram memory ...`: the CLI face of the memory REST calls."""

# Imports inside the commands are deferred: `engram` loads only the command that runs (see api.cli).
from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click
from engram_client import EngramClient, EngramConnectionError, EngramError

from api.sdk import as_json

TABLE_COLUMNS = ("id", "kind", "category", "importance", "created_at", "content")


def _default_url() -> str:
    if os.environ.get("ENGRAM_URL"):
        return os.environ["ENGRAM_URL"]
    from core.runtime import resolve_api_url

    return resolve_api_url()


@contextmanager
def _client(ctx: click.Context) -> Iterator[EngramClient]:
    opts = ctx.parent.params if ctx.parent else {}
    url = opts.get("url") or _default_url()
    api_key = opts.get("api_key") or os.environ.get("ENGRAM_API_KEY")
    if not api_key:
        raise click.UsageError("give --api-key or set ENGRAM_API_KEY")
    client = EngramClient(url, api_key=api_key)
    try:
        yield client
    except EngramConnectionError as exc:  # connection refused and friends: a message, not a traceback
        raise click.ClickException(exc.message) from None
    except EngramError as exc:
        click.echo(json.dumps({"error": exc.error}), err=True)
        sys.exit(1)
    finally:
        client.close()


# Columns shown whole in a table: an error cut at 60 characters usually loses the part that explains it, and
# a cut URL or key is of no use.
UNCUT_COLUMNS = frozenset({"error", "url", "api_key"})


def cell(value: Any) -> str:
    """A value as a person reads it in a table: lists as "a, b", numbers rounded, nothing for null."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{round(value, 3):g}"
    if isinstance(value, list | tuple):
        return ", ".join(cell(item) for item in value)
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return str(value)


def _short(value: Any, width: int = 60) -> str:
    text = " ".join(cell(value).split())  # one line: newlines and runs of spaces become one space
    return text if len(text) <= width else text[: width - 1] + "…"


def emit(
    data: Any, *, fmt: str, rows: list[dict[str, Any]] | None = None, columns: tuple[str, ...] = TABLE_COLUMNS
) -> None:
    if fmt == "json":
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    rows = rows if rows is not None else [data]

    def shown(row: dict[str, Any], column: str) -> str:
        return " ".join(cell(row.get(column)).split()) if column in UNCUT_COLUMNS else _short(row.get(column))

    widths = {c: max([len(c)] + [len(shown(r, c)) for r in rows]) for c in columns}
    # The last column is not padded, so an uncut error at the end of a row adds no trailing spaces.
    click.echo("  ".join(c.upper().ljust(widths[c]) for c in columns).rstrip())
    for row in rows:
        click.echo("  ".join(shown(row, c).ljust(widths[c]) for c in columns).rstrip())


format_option = click.option(
    "--format", "fmt", type=click.Choice(["json", "table"]), default="table", show_default=True
)


@click.group()
@click.option("--url", default=None, help="API URL (default: the running serve, or $ENGRAM_URL)")
@click.option("--api-key", default=None, help="API key (default $ENGRAM_API_KEY)")
def memory(url: str | None, api_key: str | None) -> None:
    """Save, get, list and forget memories over the REST API."""


@memory.command("save")
@click.argument("content")
@click.option("--id", "memory_id", default=None)
@click.option("--kind", default=None)
@click.option("--category", default=None)
@click.option("--importance", type=float, default=None)
@click.option("--tag", "tags", multiple=True)
@click.option("--entity", "entities", multiple=True, help="linked entity (repeatable)")
@click.option("--agent-id", default=None)
@click.option("--persona", default=None)
@click.option("--run-id", default=None)
@format_option
@click.pass_context
def save(
    ctx: click.Context,
    content: str,
    memory_id: str | None,
    kind: str | None,
    category: str | None,
    importance: float | None,
    tags: tuple[str, ...],
    entities: tuple[str, ...],
    agent_id: str | None,
    persona: str | None,
    run_id: str | None,
    fmt: str,
) -> None:
    """Save a memory."""
    with _client(ctx) as client:
        result = client.save_memory(
            content,
            id=memory_id,
            kind=kind,  # type: ignore[arg-type]  # the server refuses an unknown kind (422)
            category=category,  # type: ignore[arg-type]
            importance=importance,
            tags=list(tags) or None,
            linked_entities=list(entities) or None,
            agent_id=agent_id,
            persona=persona,
            run_id=run_id,
        )
    emit(as_json(result), fmt=fmt, columns=("memory_id", "entities", "warnings"))


@memory.command("get")
@click.argument("memory_id")
@click.option("--agent-id", default=None)
@click.option("--persona", default=None)
@format_option
@click.pass_context
def get(ctx: click.Context, memory_id: str, agent_id: str | None, persona: str | None, fmt: str) -> None:
    """Recall one memory by id."""
    with _client(ctx) as client:
        emit(as_json(client.get_memory(memory_id, agent_id=agent_id, persona=persona)), fmt=fmt)


@memory.command("forget")
@click.argument("memory_id")
@click.option("--reason", default=None)
@click.option("--purge", is_flag=True, help="hard delete")
@click.option("--agent-id", default=None)
@format_option
@click.pass_context
def forget(ctx: click.Context, memory_id: str, reason: str | None, purge: bool, agent_id: str | None, fmt: str) -> None:
    """Forget a memory (soft delete; --purge removes it for good)."""
    with _client(ctx) as client:
        result = client.forget_memory(memory_id, reason=reason, purge=purge, agent_id=agent_id)
    emit(as_json(result), fmt=fmt, columns=("memory_id", "status"))


@memory.command("list")
@click.option("--kind", default=None)
@click.option("--category", default=None)
@click.option("--tag", "tags", multiple=True)
@click.option("--status", default=None)
@click.option("--entity", default=None)
@click.option("--sort", default=None)
@click.option("--limit", type=int, default=None)
@click.option("--cursor", default=None)
@click.option("--agent-id", default=None)
@format_option
@click.pass_context
def list_(
    ctx: click.Context,
    kind: str | None,
    category: str | None,
    tags: tuple[str, ...],
    status: str | None,
    entity: str | None,
    sort: str | None,
    limit: int | None,
    cursor: str | None,
    agent_id: str | None,
    fmt: str,
) -> None:
    """List memories."""
    with _client(ctx) as client:
        page = as_json(
            client.list_memories(
                kind=kind,  # type: ignore[arg-type]  # the server refuses an unknown value (422)
                category=category,  # type: ignore[arg-type]
                tags=list(tags) or None,
                status=status,  # type: ignore[arg-type]
                entity=entity,
                sort=sort,  # type: ignore[arg-type]
                limit=limit,
                cursor=cursor,
                agent_id=agent_id,
            )
        )
    emit(page, fmt=fmt, rows=page["memories"])
    if fmt == "table" and page.get("next_cursor"):
        click.echo(f"next cursor: {page['next_cursor']}")


@memory.command("export")
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False, writable=True), default=None, help="file (default stdout)"
)
@click.option("--agent-id", default=None)
@click.option("--persona", default=None)
@click.pass_context
def export(ctx: click.Context, output: str | None, agent_id: str | None, persona: str | None) -> None:
    """Export the memories this key sees as markdown with YAML front matter (active and stale ones)."""
    with _client(ctx) as client:
        markdown = client.export_memories(agent_id=agent_id, persona=persona)
    if output is None:
        click.echo(markdown, nl=False)
        return
    with open(output, "w", encoding="utf-8", newline="") as handle:
        handle.write(markdown)
    from core.memories.transfer import parse_markdown

    click.echo(f"exported {len(parse_markdown(markdown))} memories to {output}", err=True)


@memory.command("import")
# Binary, so a carriage return inside a memory is not turned into a newline by text-mode reading.
@click.argument("file", type=click.File("rb"))
@click.option("--agent-id", default=None)
@click.option("--persona", default=None)
@format_option
@click.pass_context
def import_(ctx: click.Context, file: Any, agent_id: str | None, persona: str | None, fmt: str) -> None:
    """Import a markdown export (FILE, or - for stdin) in one transaction."""
    try:
        markdown = file.read().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise click.ClickException(f"{file.name} is not UTF-8: {exc}") from None
    with _client(ctx) as client:
        result = client.import_memories(markdown, agent_id=agent_id, persona=persona)
    data = as_json(result)
    if fmt == "json":
        emit(data, fmt=fmt)
    else:
        click.echo(f"imported {data['imported']} memories")
        for warning in data["warnings"]:
            click.echo(f"warning: {warning}")
