"""Markdown export and import of memories (CONTRACT section 4; reference memory-categories.md).

Format: one block per memory, YAML front matter between two ``---`` lines, then the content verbatim::

    ---
    key: '42'
    kind: fact
    category: core
    tags: [customer, plan_pro]
    ---
    Bob Chen, Acme. Pro since Jan 15.

Rules that make the format lossless:

* A delimiter is a line that is exactly ``---`` (a trailing ``\\r`` tolerated). The content runs from the
  line after the closing front-matter delimiter up to the next delimiter or the end of the file, and
  the renderer ends every block with one newline, so the content is the text between those lines.
* Content lines that would read as a delimiter are escaped: a line made of zero or more backslashes
  followed by ``---`` gets one more leading backslash on export and loses one on import. So ``---``
  becomes ``\\---``, ``\\---`` becomes ``\\\\---``, and every other line is untouched.
* Lines are split on ``\\n`` only (not ``str.splitlines``), so unicode line separators inside content
  survive.
* Front matter is read with YAML 1.2-style scalars (only ``true``/``false`` are booleans, only plain
  decimals are numbers), so hand-written ``key: 0100`` or ``tags: [no]`` stay strings.

Import keys: ``key`` (the id; omitted -> allocated), ``kind``, ``category``, ``importance``,
``occurred_at``, ``tags``, ``entities``, ``associations``, ``source``, ``run_id``, ``persona``,
``agent_id``, ``query``. ``status``, ``stale_reason``, ``superseded_by``, ``created_by``,
``created_at``, ``updated_at`` and ``access_count`` are informational: an import saves active memories
owned by the importing key, with fresh ``created_at`` in file order. ``history`` lists the memory's
revisions newest first, as ``GET /v1/memories/{id}/history`` does; an import restores them with their
authors and times. Any other key is an error.

Export writes the caller's visible ``active`` and ``stale`` memories (stale ones are live notes whose
attached query lost an entity; re-saving them, which an import does, is the documented cure), oldest
first so an import keeps their relative order. Forgotten memories are not exported.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from core.errors import EngramError, Invalid
from core.memories.history import VersionIn, histories_for, restore_history
from core.memories.listing import list_memories
from core.memories.models import Memory
from core.memories.schemas import ListFilters, SaveMemoryIn, SaveResult, parse_model
from core.memories.service import save_memories
from core.tenancy.context import Caller

DELIMITER = "---"
MEDIA_TYPE = "text/markdown"
_DELIMITER_LIKE = re.compile(r"\\*---\r?")
_ESCAPED_DELIMITER = re.compile(r"\\+---\r?")

# Front-matter keys in the order they are written; the first group is restored by an import.
RESTORED_KEYS = (
    "key",
    "kind",
    "category",
    "importance",
    "occurred_at",
    "tags",
    "entities",
    "associations",
    "source",
    "run_id",
    "persona",
    "agent_id",
    "query",
)
INFORMATIONAL_KEYS = (
    "status",
    "stale_reason",
    "superseded_by",
    "created_by",
    "created_at",
    "updated_at",
    "access_count",
)
HISTORY_KEY = "history"
_ALWAYS_WRITTEN = {"key", "kind", "category", "importance", "occurred_at", "tags", "entities", "status"}


class _FrontMatterLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars: no octal/sexagesimal ints, no yes/no booleans."""


_FrontMatterLoader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in (
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^[-+]?(?:0|[1-9][0-9]*)$", list("-+0123456789")),
    (
        "tag:yaml.org,2002:float",
        r"^[-+]?(?:(?:0|[1-9][0-9]*)\.[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?$",
        list("-+.0123456789"),
    ),
):
    _FrontMatterLoader.add_implicit_resolver(_tag, re.compile(_pattern), _first)


@dataclass
class Block:
    """One memory block as read from the file: its 1-based position, first line, front matter, content."""

    number: int
    line: int
    front_matter: dict[str, Any]
    content: str


def _is_delimiter(line: str) -> bool:
    return line.rstrip("\r") == DELIMITER


def escape_content(content: str) -> str:
    """Give every delimiter-like content line (``\\*---``) one more leading backslash."""
    return "\n".join("\\" + line if _DELIMITER_LIKE.fullmatch(line) else line for line in content.split("\n"))


def unescape_content(content: str) -> str:
    """Inverse of :func:`escape_content`."""
    return "\n".join(line[1:] if _ESCAPED_DELIMITER.fullmatch(line) else line for line in content.split("\n"))


def _front_matter(memory: dict[str, Any]) -> dict[str, Any]:
    values = {
        "key": memory["id"],
        **{k: memory.get(k) for k in (*RESTORED_KEYS[1:], *INFORMATIONAL_KEYS, HISTORY_KEY)},
    }
    return {k: v for k, v in values.items() if k in _ALWAYS_WRITTEN or v not in (None, [], {})}


# libyaml's emitter when PyYAML was built with it (about 10x faster on a large export), else the same in Python.
_SAFE_DUMPER: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def render_block(memory: dict[str, Any]) -> str:
    """One memory (the dict shape of the REST API) as a markdown block ending in a newline."""
    front = yaml.dump(
        _front_matter(memory),
        Dumper=_SAFE_DUMPER,
        allow_unicode=True,
        sort_keys=False,
        default_flow_style=None,
        width=1_000_000,
    )
    return f"{DELIMITER}\n{front}{DELIMITER}\n{escape_content(memory['content'])}\n"


def render_markdown(memories: list[dict[str, Any]]) -> str:
    return "".join(render_block(m) for m in memories)


def parse_markdown(text: str) -> list[Block]:
    """Split an export into blocks; malformed structure or front matter is a 422 naming the block."""
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the file is not part of the last memory's content
    start = 0
    while start < len(lines) and not lines[start].strip():
        start += 1
    if start < len(lines) and not _is_delimiter(lines[start]):
        raise Invalid(f"line {start + 1}: expected '---' to open a memory block", field="markdown")
    blocks: list[Block] = []
    i = start
    while i < len(lines):
        number, opened = len(blocks) + 1, i + 1
        close = next((j for j in range(i + 1, len(lines)) if _is_delimiter(lines[j])), None)
        if close is None:
            raise Invalid(f"block {number} (line {opened}): front matter is not closed by '---'", field="markdown")
        end = next((j for j in range(close + 1, len(lines)) if _is_delimiter(lines[j])), len(lines))
        front = _load_front_matter("\n".join(lines[i + 1 : close]), number=number, line=opened)
        content = unescape_content("\n".join(lines[close + 1 : end]))
        blocks.append(Block(number=number, line=opened, front_matter=front, content=content))
        i = end
    return blocks


def _load_front_matter(source: str, *, number: int, line: int) -> dict[str, Any]:
    where = f"block {number} (line {line})"
    try:
        loaded = yaml.load(source, Loader=_FrontMatterLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        detail = str(exc).replace("\n", " ")
        raise Invalid(f"{where}: front matter is not valid YAML: {detail}", field=f"blocks.{number - 1}") from None
    except RecursionError:
        raise Invalid(f"{where}: front matter nests too deeply", field=f"blocks.{number - 1}") from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise Invalid(f"{where}: front matter must be a mapping of keys", field=f"blocks.{number - 1}")
    unknown = sorted(
        str(k) for k in loaded if k not in RESTORED_KEYS and k not in INFORMATIONAL_KEYS and k != HISTORY_KEY
    )
    if unknown:
        raise Invalid(f"{where}: unknown front-matter key {unknown[0]!r}", field=f"blocks.{number - 1}.{unknown[0]}")
    return loaded


def _save_body(block: Block) -> dict[str, Any]:
    """The save body a block stands for (the informational keys dropped)."""
    front = block.front_matter
    body: dict[str, Any] = {k: front[k] for k in RESTORED_KEYS if k in front and front[k] is not None}
    key = body.pop("key", None)
    if isinstance(key, int) and not isinstance(key, bool):
        key = str(key)  # `key: 42` written by hand
    if key is not None:
        body["id"] = key
    if "entities" in body:
        body["linked_entities"] = body.pop("entities")
    body["content"] = block.content
    return body


def _history(block: Block) -> list[VersionIn]:
    """The block's revisions (newest first); a malformed one is a 422 naming it."""
    raw = block.front_matter.get(HISTORY_KEY)
    if raw is None:
        return []
    where = f"blocks.{block.number - 1}.{HISTORY_KEY}"
    if not isinstance(raw, list):
        raise Invalid(f"block {block.number} (line {block.line}): history must be a list of versions", field=where)
    return [parse_model(VersionIn, v, prefix=f"{where}.{i}.") for i, v in enumerate(raw)]


def _block_error(exc: EngramError, block: Block) -> EngramError:
    """The same error class and status, its message and field naming the block."""
    key = block.front_matter.get("key")
    where = f"block {block.number} (line {block.line}" + (f", key {str(key)!r})" if key is not None else ")")
    field = exc.field or ""
    if field == "id":
        field = "key"
    elif field.startswith("linked_entities"):
        field = "entities" + field[len("linked_entities") :]
    path = f"blocks.{block.number - 1}" + (f".{field}" if field else "")
    return type(exc)(f"{where}: {exc.message}", field=path, details=exc.details)


def import_markdown(session: Session, *, caller: Caller, text: str) -> dict[str, Any]:
    """Save every block of an export in the caller's transaction; the first bad block fails the import.

    All blocks go to one batch save, in which the batch's own ids count as existing: an association or
    a ``memory:<id>`` entity may name a memory that appears later in the file.
    """
    blocks = parse_markdown(text)
    items: list[SaveMemoryIn | EngramError] = []
    histories: list[list[VersionIn]] = []
    for block in blocks:
        try:
            items.append(parse_model(SaveMemoryIn, _save_body(block)))
        except EngramError as exc:
            raise _block_error(exc, block) from None
        try:
            histories.append(_history(block))
        except EngramError as exc:
            exc.message = f"block {block.number} (line {block.line}): {exc.message}"
            raise
    results = save_memories(session, caller=caller, items=items) if items else []
    saved: list[SaveResult] = []
    for block, result in zip(blocks, results, strict=True):
        if isinstance(result, EngramError):
            raise _block_error(result, block)
        saved.append(result)
    _restore_histories(session, caller=caller, saved=saved, histories=histories)
    warnings = [f"block {b.number}: {w}" for b, r in zip(blocks, saved, strict=True) for w in r.warnings]
    return {"imported": len(saved), "memory_ids": [r.memory_id for r in saved], "warnings": warnings}


def _restore_histories(
    session: Session, *, caller: Caller, saved: list[SaveResult], histories: list[list[VersionIn]]
) -> None:
    """Put each imported memory's exported revisions under the one the import wrote (a later block wins)."""
    wanted = {r.memory_id: h for r, h in zip(saved, histories, strict=True)}
    wanted = {mid: h for mid, h in wanted.items() if h}
    if not wanted:
        return
    rows = session.execute(select(Memory.id, Memory.change_seq).where(Memory.id.in_(list(wanted)))).all()
    seqs = {memory_id: int(seq) for memory_id, seq in rows}
    for memory_id, versions in wanted.items():
        restore_history(
            session, tenant_id=caller.tenant_id, memory_id=memory_id, change_seq=seqs[memory_id], versions=versions
        )


def exportable_memories(session: Session, *, caller: Caller) -> list[dict[str, Any]]:
    """The caller's visible active and stale memories, oldest first, in the REST dict shape."""
    rows: list[dict[str, Any]] = []
    for status in ("active", "stale"):
        cursor: str | None = None
        while True:
            page, cursor = list_memories(
                session, caller=caller, filters=ListFilters(status=status, limit=200, cursor=cursor)
            )
            rows.extend(page)
            if cursor is None:
                break
    out = sorted(rows, key=lambda m: (datetime.fromisoformat(m["created_at"]), m["id"]))
    histories = histories_for(session, [m["id"] for m in out])
    for memory in out:
        memory[HISTORY_KEY] = histories[memory["id"]]
    return out


def export_markdown(session: Session, *, caller: Caller) -> str:
    return render_markdown(exportable_memories(session, caller=caller))
