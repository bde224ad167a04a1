"""What the sync and async clients share: settings, one description per REST call, reading an answer,
and the retry policy. Only sending differs between the two clients."""

from __future__ import annotations

import email.utils
import os
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel

from engram_client.errors import EngramConnectionError, EngramError, error_for

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
DEFAULT_URL = "http://127.0.0.1:8000"
RETRY_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class Settings:
    """Where engram is and how to talk to it; ``None`` arguments fall back to ENGRAM_URL / ENGRAM_API_KEY."""

    base_url: str
    headers: dict[str, str]
    agent_id: str | None
    persona: str | None
    max_retries: int
    backoff: float
    max_backoff: float

    @classmethod
    def resolve(
        cls,
        *,
        base_url: str | None,
        api_key: str | None,
        agent_id: str | None,
        persona: str | None,
        max_retries: int,
        backoff: float,
        max_backoff: float,
    ) -> Settings:
        url = (base_url or os.environ.get("ENGRAM_URL") or DEFAULT_URL).rstrip("/")
        key = api_key or os.environ.get("ENGRAM_API_KEY") or None
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return cls(url, headers, agent_id, persona, max(0, max_retries), backoff, max_backoff)

    def retry_delay(self, attempt: int, response: httpx.Response | None) -> float:
        """Seconds to wait before retry number ``attempt`` (0-based): the server's Retry-After when it sent
        one, else exponential backoff with jitter, never more than ``max_backoff``."""
        advised = retry_after(response) if response is not None else None
        if advised is not None:
            return min(advised, self.max_backoff)
        return min(self.backoff * (2.0**attempt) * (0.5 + random.random() / 2), self.max_backoff)


def retry_after(response: httpx.Response) -> float | None:
    """Retry-After in seconds, whether sent as a number or as an HTTP date."""
    value = response.headers.get("Retry-After")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


@dataclass
class Call(Generic[T]):
    """One REST request and how to read its answer."""

    method: str
    path: str
    parse: Callable[[Any], T]
    params: dict[str, Any] = field(default_factory=dict)
    json: Any = None
    markdown: str | None = None  # a text/markdown body instead of JSON (the import)
    text_answer: bool | None = False  # the answer is text (the export); None: whatever its content type says

    def request_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"params": {k: v for k, v in self.params.items() if v is not None and v != []}}
        if self.markdown is not None:
            kwargs["content"] = self.markdown.encode("utf-8")
            kwargs["headers"] = {"Content-Type": "text/markdown; charset=utf-8"}
        elif self.json is not None:
            kwargs["json"] = self.json
        return kwargs


def read(call: Call[T], response: httpx.Response) -> T:
    """The parsed answer, or the typed error it carries."""
    if response.status_code >= 400:
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        raise error_for(
            response.status_code,
            body,
            request_id=response.headers.get("X-Request-ID"),
            retry_after=retry_after(response),
        )
    as_text = call.text_answer
    if as_text is None:
        as_text = "json" not in response.headers.get("Content-Type", "")
    if as_text:
        return call.parse(response.text)
    try:
        return call.parse(response.json())
    except ValueError as exc:
        raise EngramError(f"unreadable answer: {exc}", status=response.status_code, code="bad_response") from None


def should_retry(response: httpx.Response, attempt: int, settings: Settings) -> bool:
    return response.status_code in RETRY_STATUSES and attempt < settings.max_retries


def connection_error(exc: httpx.HTTPError, settings: Settings) -> EngramError:
    return EngramConnectionError(f"cannot reach engram at {settings.base_url}: {exc}", code="unreachable")


def parser(model: type[M]) -> Callable[[Any], M]:
    return model.model_validate


def list_parser(model: type[M], key: str) -> Callable[[Any], list[M]]:
    """The list under ``key`` of an answer, each item as ``model``."""
    return lambda body: [model.model_validate(item) for item in body[key]]


def segment(value: str) -> str:
    """A path segment: an id or name quoted whole (a ``/`` in it stays part of it)."""
    return quote(value, safe="")


def memory_path(memory_id: str) -> str:
    return f"/v1/memories/{segment(memory_id)}"


def json_value(value: Any) -> Any:
    """A keyword argument as JSON: models by their fields, datetimes as ISO 8601."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if isinstance(value, date):  # datetimes too
        return value.isoformat()
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return value


def given(fields: Mapping[str, Any], *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The arguments a caller gave (``None`` means "not given", so the server's defaults apply)."""
    return {k: json_value(v) for k, v in fields.items() if v is not None and k != "self" and k not in skip}


def identity(settings: Settings, agent_id: str | None, persona: str | None) -> dict[str, Any]:
    """The caller's agent and persona: the call's own, else the client's defaults."""
    return {"agent_id": agent_id or settings.agent_id, "persona": persona or settings.persona}
