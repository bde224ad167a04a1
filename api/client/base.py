"""What the sync and async REST clients share: the error type, input validation, and one description of
every REST call (:class:`RestCalls`), so both clients send exactly the same requests.

A call method builds a :class:`Call` and hands it to ``self._send``: the sync client returns the parsed
result, the async client a coroutine of it. Inputs are validated with the core request models before
anything is sent, raising the same :class:`EngramAPIError` (same status, code, message and field) the
server would.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

from pydantic import BaseModel, TypeAdapter
from sqlalchemy.exc import OperationalError

from api.schemas import (
    BatchResult,
    CoverageRow,
    Datasource,
    Deleted,
    ForgetResult,
    HydrateResult,
    ImportResult,
    IssuedKeyOut,
    Job,
    JobAccepted,
    JobPage,
    KeyRevoked,
    Memory,
    MemoryPage,
    ModelInspection,
    RunEnded,
)
from core.entities.schemas import DatasourceIn, ModelPatchIn, ModelPutIn
from core.errors import EngramError
from core.memories.schemas import ListFilters, PatchMemoryIn, SaveMemoryIn, SaveResult, parse_model
from core.search.schemas import SearchRequest, SearchResponse

M = TypeVar("M", bound=BaseModel)
F = TypeVar("F", bound=Callable[..., Any])


class EngramAPIError(Exception):
    """An error answer of the API (or of local mode): the JSON error shape as attributes."""

    def __init__(self, status: int, code: str, message: str, field: str | None = None, details: dict | None = None):
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.details = details or {}

    @property
    def error(self) -> dict[str, Any]:
        """The ``{"code", "message", "field"?}`` object of the REST error shape."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return {**body, **{k: v for k, v in self.details.items() if k not in body}}

    @classmethod
    def from_engram(cls, exc: EngramError) -> EngramAPIError:
        return cls(exc.status, exc.code, exc.message, exc.field, exc.details)

    @classmethod
    def from_body(cls, status: int, body: Any) -> EngramAPIError:
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            return cls(status, "bad_response", str(body)[:500])
        details = {k: v for k, v in error.items() if k not in ("code", "message", "field")}
        return cls(status, str(error.get("code")), str(error.get("message")), error.get("field"), details)


def as_api_errors(method: F) -> F:
    """Raise what the REST client would: EngramAPIError with the route's status, code and message."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return method(*args, **kwargs)
        except EngramError as exc:
            raise EngramAPIError.from_engram(exc) from None
        except OperationalError:
            raise EngramAPIError(503, "unavailable", "the database is unavailable; retry shortly") from None

    return wrapper  # type: ignore[return-value]


def validated(model: type[M], value: M | dict[str, Any] | None, fields: dict[str, Any]) -> M:
    """A request model from an instance or keyword fields (``None`` fields mean "not given")."""
    if isinstance(value, model):
        if fields:
            raise TypeError(f"give a {model.__name__} or keyword fields, not both")
        return value
    given: dict[str, Any] = dict(value) if isinstance(value, dict) else {}
    body = {**given, **{k: v for k, v in fields.items() if v is not None}}
    try:
        return parse_model(model, body)
    except EngramError as exc:
        raise EngramAPIError.from_engram(exc) from None


def body_of(model: BaseModel) -> dict[str, Any]:
    """The JSON body of a request model: only the fields that were set, so server defaults apply."""
    return model.model_dump(mode="json", exclude_unset=True)


def memory_path(memory_id: str) -> str:
    return f"/v1/memories/{quote(memory_id, safe='')}"


def segment(name: str) -> str:
    return quote(name, safe="")


def model_parser(model: type[M]) -> Callable[[Any], M]:
    return model.model_validate


def list_parser(model: type[M], key: str | None = None) -> Callable[[Any], list[M]]:
    adapter = TypeAdapter(list[model])  # type: ignore[valid-type]
    return lambda body: adapter.validate_python(body[key] if key else body)


@dataclass
class Call:
    """One REST request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[Any], Any]
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    text: str | None = None  # a text/markdown body instead of JSON
    raw: bool = False  # the answer is text (the export), not JSON


class RestCalls:
    """Every REST call of CONTRACT.md as a method; subclasses define ``_send`` and the default identity."""

    agent_id: str | None = None
    persona: str | None = None

    def _send(self, call: Call) -> Any:
        raise NotImplementedError

    def _who(self, agent_id: str | None, persona: str | None) -> dict[str, Any]:
        return {"agent_id": agent_id or self.agent_id, "persona": persona or self.persona}

    # Memories

    def save_memory(self, item: SaveMemoryIn | None = None, **fields: Any) -> SaveResult:
        body = body_of(validated(SaveMemoryIn, item, fields))
        body.update({k: v for k, v in self._who(None, None).items() if v and k not in body})
        return self._send(Call("POST", "/v1/memories", model_parser(SaveResult), json=body))

    def save_memories(
        self,
        items: Sequence[SaveMemoryIn | dict[str, Any]],
        *,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> BatchResult:
        raw = [body_of(i) if isinstance(i, BaseModel) else i for i in items]
        body = {"items": raw, **{k: v for k, v in self._who(agent_id, persona).items() if v}}
        return self._send(Call("POST", "/v1/memories:batch", model_parser(BatchResult), json=body))

    def get_memory(
        self,
        memory_id: str,
        *,
        include_forgotten: bool = False,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> Memory:
        params = {**self._who(agent_id, persona), "include_forgotten": "true" if include_forgotten else None}
        return self._send(Call("GET", memory_path(memory_id), model_parser(Memory), params=params))

    def patch_memory(
        self,
        memory_id: str,
        patch: PatchMemoryIn | None = None,
        *,
        agent_id: str | None = None,
        persona: str | None = None,
        **fields: Any,
    ) -> Memory:
        body = body_of(validated(PatchMemoryIn, patch, fields))
        call = Call(
            "PATCH", memory_path(memory_id), model_parser(Memory), json=body, params=self._who(agent_id, persona)
        )
        return self._send(call)

    def forget_memory(
        self,
        memory_id: str,
        *,
        reason: str | None = None,
        purge: bool = False,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> ForgetResult:
        params = {**self._who(agent_id, persona), "reason": reason, "purge": "true" if purge else None}
        return self._send(Call("DELETE", memory_path(memory_id), model_parser(ForgetResult), params=params))

    def list_memories(
        self,
        filters: ListFilters | None = None,
        *,
        agent_id: str | None = None,
        persona: str | None = None,
        **fields: Any,
    ) -> MemoryPage:
        chosen = validated(ListFilters, filters, fields)
        params = {**body_of(chosen), **self._who(agent_id, persona)}
        return self._send(Call("GET", "/v1/memories", model_parser(MemoryPage), params=params))

    def hydrate(self, *, budget_bytes: int, agent_id: str | None = None, persona: str | None = None) -> HydrateResult:
        body = {"budget_bytes": budget_bytes, **{k: v for k, v in self._who(agent_id, persona).items() if v}}
        return self._send(Call("POST", "/v1/hydrate", model_parser(HydrateResult), json=body))

    def export_memories(self, *, agent_id: str | None = None, persona: str | None = None) -> str:
        params = {"format": "markdown", **self._who(agent_id, persona)}
        return self._send(Call("GET", "/v1/memories:export", str, params=params, raw=True))

    def import_memories(
        self, markdown: str, *, agent_id: str | None = None, persona: str | None = None
    ) -> ImportResult:
        call = Call(
            "POST",
            "/v1/memories:import",
            model_parser(ImportResult),
            text=markdown,
            params=self._who(agent_id, persona),
        )
        return self._send(call)

    def end_run(
        self,
        run_id: str,
        *,
        all_categories: bool = False,
        purge: bool = False,
        agent_id: str | None = None,
        persona: str | None = None,
    ) -> RunEnded:
        flags = {"all": "true" if all_categories else None, "purge": "true" if purge else None}
        params = {**self._who(agent_id, persona), **flags}
        return self._send(Call("DELETE", f"/v1/runs/{segment(run_id)}", model_parser(RunEnded), params=params))

    # Search

    def search(self, request: SearchRequest | None = None, **fields: Any) -> SearchResponse:
        body = body_of(validated(SearchRequest, request, fields))
        body.update({k: v for k, v in self._who(None, None).items() if v and k not in body})
        return self._send(Call("POST", "/v1/search", model_parser(SearchResponse), json=body))

    # Keys

    def create_key(self, *, user: str, role: str = "member") -> IssuedKeyOut:
        body = {"user": user, "role": role}
        return self._send(Call("POST", "/v1/keys", model_parser(IssuedKeyOut), json=body))

    def revoke_key(self, key_id: str) -> KeyRevoked:
        return self._send(Call("DELETE", f"/v1/keys/{segment(key_id)}", model_parser(KeyRevoked)))

    # Catalog

    def create_datasource(self, body: DatasourceIn | None = None, **fields: Any) -> Datasource:
        parsed = validated(DatasourceIn, body, fields)
        json_body = parsed.model_dump(mode="json", exclude_unset=True, by_alias=True)
        return self._send(Call("POST", "/v1/datasources", model_parser(Datasource), json=json_body))

    def list_datasources(self) -> list[Datasource]:
        return self._send(Call("GET", "/v1/datasources", list_parser(Datasource, "datasources")))

    def get_datasource(self, name: str) -> Datasource:
        return self._send(Call("GET", f"/v1/datasources/{segment(name)}", model_parser(Datasource)))

    def delete_datasource(self, name: str) -> Deleted:
        return self._send(Call("DELETE", f"/v1/datasources/{segment(name)}", model_parser(Deleted)))

    def ingest_datasource(self, name: str) -> JobAccepted:
        call = Call("POST", f"/v1/datasources/{segment(name)}/ingest", model_parser(JobAccepted))
        return self._send(call)

    def refresh_samples(self, name: str, *, models: list[str] | None = None) -> JobAccepted:
        body = {"models": models} if models is not None else {}
        call = Call("POST", f"/v1/datasources/{segment(name)}/refresh-samples", model_parser(JobAccepted), json=body)
        return self._send(call)

    def inspect_model(
        self, datasource: str, name: str, *, agent_id: str | None = None, persona: str | None = None
    ) -> ModelInspection:
        path = f"/v1/models/{segment(datasource)}/{segment(name)}"
        return self._send(Call("GET", path, model_parser(ModelInspection), params=self._who(agent_id, persona)))

    def put_model(self, datasource: str, name: str, body: ModelPutIn | None = None, **fields: Any) -> ModelInspection:
        path = f"/v1/models/{segment(datasource)}/{segment(name)}"
        json_body = body_of(validated(ModelPutIn, body, fields))
        return self._send(Call("PUT", path, model_parser(ModelInspection), json=json_body))

    def patch_model(
        self, datasource: str, name: str, body: ModelPatchIn | None = None, **fields: Any
    ) -> ModelInspection:
        path = f"/v1/models/{segment(datasource)}/{segment(name)}"
        json_body = body_of(validated(ModelPatchIn, body, fields))
        return self._send(Call("PATCH", path, model_parser(ModelInspection), json=json_body))

    def delete_model(self, datasource: str, name: str) -> Deleted:
        path = f"/v1/models/{segment(datasource)}/{segment(name)}"
        return self._send(Call("DELETE", path, model_parser(Deleted)))

    # Jobs and operations

    def get_job(self, job_id: str) -> Job:
        return self._send(Call("GET", f"/v1/jobs/{segment(job_id)}", model_parser(Job)))

    def list_jobs(
        self, *, kind: str | None = None, state: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> JobPage:
        params = {"kind": kind, "state": state, "limit": limit, "cursor": cursor}
        return self._send(Call("GET", "/v1/jobs", model_parser(JobPage), params=params))

    def retry_job(self, job_id: str) -> Job:
        return self._send(Call("POST", f"/v1/jobs/{segment(job_id)}/retry", model_parser(Job)))

    def coverage(self) -> list[CoverageRow]:
        return self._send(Call("GET", "/v1/ops/coverage", list_parser(CoverageRow, "coverage")))


def clean_params(params: dict[str, Any]) -> dict[str, Any]:
    """Query parameters without the unset ones; lists repeat the parameter, datetimes go as ISO text."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is None or value == []:
            continue
        out[key] = value
    return out


def dump(model: BaseModel | list[BaseModel] | str) -> Any:
    """A result as plain JSON data (what the REST answer's body was)."""
    if isinstance(model, str):
        return model
    if isinstance(model, list):
        return [m.model_dump(mode="json", by_alias=True) for m in model]
    return model.model_dump(mode="json", by_alias=True)
