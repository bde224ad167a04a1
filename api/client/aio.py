"""The asynchronous REST client: every method of :class:`api.client.EngramClient`, awaitable.

    async with AsyncEngramClient(base_url=url, api_key=key) as engram:
        saved = await engram.save_memory(content="orders.amount is in cents")

The call descriptions are shared with the sync client (:class:`api.client.base.RestCalls`); only the
transport differs, so both send the same requests and return the same models.
"""

from __future__ import annotations

from typing import Any

import httpx

from api.client.base import Call, EngramAPIError, RestCalls
from api.client.sync import read_response, request_kwargs

__all__ = ["AsyncEngramClient", "EngramAPIError"]


class AsyncEngramClient(RestCalls):
    """Async REST client. The inherited methods return awaitables of the annotated result types."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        agent_id: str | None = None,
        persona: str | None = None,
        timeout: float = 60.0,
        transport: httpx.AsyncBaseTransport | None = None,
    ):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.agent_id, self.persona = agent_id, persona
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )

    async def __aenter__(self) -> AsyncEngramClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _send(self, call: Call) -> Any:  # type: ignore[override]
        response = await self._http.request(call.method, call.path, **request_kwargs(call))
        return read_response(call, response)

    async def request(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None) -> Any:
        return await self._send(Call(method, path, lambda body: body, params=params or {}, json=json))
