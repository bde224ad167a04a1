"""One function per REST call: the request it sends, given the arguments a client method received.

The clients' methods spell out their keyword parameters (for editors and type checkers) and hand what
was given to these builders, so the sync and async clients send exactly the same requests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from engram_client._calls import Call, Settings, given, identity, memory_path, parser, segment
from engram_client.models import (
    BatchResult,
    ForgetResult,
    HydrateResult,
    Memory,
    MemoryPage,
    SaveResult,
    SearchResponse,
)
from engram_client.resources import ImportResult, MemoryHistory, RunEnded

_WHO = ("agent_id", "persona")


def _who(settings: Settings, fields: Mapping[str, Any]) -> dict[str, Any]:
    return identity(settings, fields.get("agent_id"), fields.get("persona"))


def save_memory(settings: Settings, fields: Mapping[str, Any]) -> Call[SaveResult]:
    body = {**{k: v for k, v in _who(settings, fields).items() if v}, **given(fields, skip=_WHO)}
    return Call("POST", "/v1/memories", parser(SaveResult), json=body)


def save_memories(
    settings: Settings, items: Sequence[Mapping[str, Any]], fields: Mapping[str, Any]
) -> Call[BatchResult]:
    body = {"items": [given(item) for item in items], **{k: v for k, v in _who(settings, fields).items() if v}}
    return Call("POST", "/v1/memories:batch", parser(BatchResult), json=body)


def get_memory(settings: Settings, memory_id: str, fields: Mapping[str, Any]) -> Call[Memory]:
    params = {**_who(settings, fields), "include_forgotten": "true" if fields.get("include_forgotten") else None}
    return Call("GET", memory_path(memory_id), parser(Memory), params=params)


def memory_history(settings: Settings, memory_id: str, fields: Mapping[str, Any]) -> Call[MemoryHistory]:
    params = {**_who(settings, fields), "include_forgotten": "true" if fields.get("include_forgotten") else None}
    return Call("GET", memory_path(memory_id) + "/history", parser(MemoryHistory), params=params)


def update_memory(settings: Settings, memory_id: str, fields: Mapping[str, Any]) -> Call[Memory]:
    body = given(fields, skip=(*_WHO, "memory_id"))
    return Call("PATCH", memory_path(memory_id), parser(Memory), params=_who(settings, fields), json=body)


def forget_memory(settings: Settings, memory_id: str, fields: Mapping[str, Any]) -> Call[ForgetResult]:
    params = {
        **_who(settings, fields),
        "reason": fields.get("reason"),
        "purge": "true" if fields.get("purge") else None,
    }
    return Call("DELETE", memory_path(memory_id), parser(ForgetResult), params=params)


def list_memories(settings: Settings, fields: Mapping[str, Any]) -> Call[MemoryPage]:
    params = {**given(fields, skip=_WHO), **_who(settings, fields)}
    return Call("GET", "/v1/memories", parser(MemoryPage), params=params)


def hydrate(settings: Settings, fields: Mapping[str, Any]) -> Call[HydrateResult]:
    body = {"budget_bytes": fields["budget_bytes"], **{k: v for k, v in _who(settings, fields).items() if v}}
    return Call("POST", "/v1/hydrate", parser(HydrateResult), json=body)


def search(settings: Settings, fields: Mapping[str, Any]) -> Call[SearchResponse]:
    body = {**given(fields, skip=_WHO), **{k: v for k, v in _who(settings, fields).items() if v}}
    return Call("POST", "/v1/search", parser(SearchResponse), json=body)


def export_memories(settings: Settings, fields: Mapping[str, Any]) -> Call[str]:
    params = {"format": "markdown", **_who(settings, fields)}
    return Call("GET", "/v1/memories:export", str, params=params, text_answer=True)


def import_memories(settings: Settings, markdown: str, fields: Mapping[str, Any]) -> Call[ImportResult]:
    return Call("POST", "/v1/memories:import", parser(ImportResult), params=_who(settings, fields), markdown=markdown)


def end_run(settings: Settings, run_id: str, fields: Mapping[str, Any]) -> Call[RunEnded]:
    flags = {"all": "true" if fields.get("all_categories") else None, "purge": "true" if fields.get("purge") else None}
    params = {**_who(settings, fields), **flags}
    return Call("DELETE", f"/v1/runs/{segment(run_id)}", parser(RunEnded), params=params)
