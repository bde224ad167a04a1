"""Markdown export and import of memories: thin adapters from HTTP to core.memories.transfer."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from api.auth import require_caller
from api.openapi import IDENTITY, operation
from api.routes.memories import acting_identity
from api.schemas import ImportResult
from api.threads import Route, in_thread
from core.config import get_settings
from core.db import allow_longer, tenant_session, tenant_write
from core.errors import BadRequest, EngramError, Invalid
from core.memories import trail, transfer
from core.memories.schemas import unknown_fields
from core.tenancy.context import Caller
from core.tenancy.usage import buffer as usage_buffer

router = APIRouter(prefix="/v1", tags=["memories"], route_class=Route)

EXPORT_FORMATS = ("markdown",)
_MARKDOWN_MEDIA = ("text/markdown", "text/x-markdown", "text/plain")


class UnsupportedMedia(EngramError):
    status, code = 415, "unsupported_media_type"


class ImportIn(BaseModel):
    """`POST /v1/memories:import` as JSON (the markdown may also be the body itself, as text/markdown)."""

    model_config = ConfigDict(extra="forbid")

    markdown: str = Field(description="an export of `GET /v1/memories:export`")


_IMPORT = operation(
    summary="Import memories from markdown",
    body=ImportIn,
    example={"markdown": "---\nkey: '1'\nkind: fact\n---\norders.amount is in cents\n"},
    response=ImportResult,
    errors=(400, 403, 413, 415),
    query=IDENTITY,
)
_IMPORT["openapi_extra"]["requestBody"]["content"]["text/markdown"] = {"schema": {"type": "string"}}


@router.get(
    "/memories:export",
    response_class=Response,
    **operation(
        summary="Export memories as markdown",
        response=None,
        response_media=transfer.MEDIA_TYPE,
        errors=(403,),
        query=IDENTITY,
    ),
)
def export_memories(
    request: Request,
    format: str = Query(default="markdown", description="markdown (the only format)"),
    caller: Caller = Depends(require_caller),
) -> Response:
    """The caller's visible memories, one block of YAML front matter and content each; importing the export
    restores the same memories."""
    if format not in EXPORT_FORMATS:
        raise Invalid(f"format must be one of {', '.join(EXPORT_FORMATS)}", field="format")
    caller = acting_identity(caller, None, request)
    with tenant_session(caller.tenant_id) as session:
        text = transfer.export_markdown(session, caller=caller)
    return Response(
        text,
        media_type=f"{transfer.MEDIA_TYPE}; charset=utf-8",
        headers={"Content-Disposition": 'attachment; filename="engram-memories.md"'},
    )


async def _markdown_body(request: Request) -> str:
    """The markdown of an import: a text/markdown body, or JSON ``{"markdown": "..."}``."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    raw = await request.body()
    if media == "application/json" or media.endswith("+json"):
        try:
            body: Any = json.loads(raw)
        except (ValueError, RecursionError):
            raise BadRequest("the request body is not valid JSON") from None
        if not isinstance(body, dict) or not isinstance(body.get("markdown"), str):
            raise Invalid('send {"markdown": "..."} or the markdown itself as text/markdown', field="markdown")
        unknown_fields(ImportIn, body)
        return str(body["markdown"])
    if media not in _MARKDOWN_MEDIA:
        raise UnsupportedMedia("send the export as 'Content-Type: text/markdown' or JSON {\"markdown\": ...}")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRequest("the markdown is not valid UTF-8") from None


@router.post("/memories:import", **_IMPORT)
async def import_memories(request: Request, caller: Caller = Depends(require_caller)) -> dict[str, Any]:
    """Saves every block of an export (upserting by `key`); a bad block fails the whole import, naming it."""
    text = await _markdown_body(request)
    if not text.strip():
        raise Invalid("the markdown holds no memory blocks", field="markdown")
    caller = acting_identity(caller, None, request)
    return await in_thread(_import, caller, text)


def _import(caller: Caller, text: str) -> dict[str, Any]:
    seconds = get_settings().db_import_statement_timeout_seconds

    def import_all(session: Session) -> dict[str, Any]:
        allow_longer(session, seconds=seconds)  # a whole export is more than a request's budget
        imported = transfer.import_markdown(session, caller=caller, text=text)
        trail.memories_imported(session, caller=caller, memory_ids=imported["memory_ids"])
        return imported

    imported = tenant_write(caller.tenant_id, import_all)
    usage_buffer.add(caller.tenant_id, saves=imported["imported"])
    return imported
