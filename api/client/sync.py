"""Python clients of engram.

* :class:`EngramClient` — synchronous, over the REST API (the CLI uses it).
* :class:`api.client.aio.AsyncEngramClient` — the same methods, awaitable.
* ``EngramClient.local(api_key=...)`` — :class:`api.client.local.LocalEngramClient`: this client with its
  requests answered by engram's own routes in-process, against the configured database (no HTTP server).

Every method takes and returns the API's models (``SaveMemoryIn``, ``SearchRequest``, ... in;
``SaveResult``, ``Memory``, ``SearchResponse``, ... out) and raises :class:`EngramAPIError` carrying the
REST error's status, code, message and field::

    with EngramClient(base_url="http://127.0.0.1:8000", api_key=key, agent_id="planner") as engram:
        saved = engram.save_memory(content="orders.amount is in cents", tags=["units"])
        hits = engram.search(question="what unit is the order amount in?")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import httpx

from api.client.base import Call, EngramAPIError, RestCalls, clean_params

if TYPE_CHECKING:
    from api.client.local import LocalEngramClient

__all__ = ["EngramAPIError", "EngramClient"]


def request_kwargs(call: Call) -> dict[str, Any]:
    """httpx keyword arguments for a call (shared with the async client)."""
    kwargs: dict[str, Any] = {"params": clean_params(call.params)}
    if call.text is not None:
        kwargs["content"] = call.text.encode("utf-8")
        kwargs["headers"] = {"Content-Type": "text/markdown; charset=utf-8"}
    elif call.json is not None:
        kwargs["json"] = call.json
    return kwargs


def read_response(call: Call, response: httpx.Response) -> Any:
    """The parsed result of a response, or the EngramAPIError it carries (shared with the async client)."""
    if response.status_code >= 400:
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        raise EngramAPIError.from_body(response.status_code, body)
    if call.raw:
        return call.parse(response.text)
    try:
        return call.parse(response.json())
    except ValueError as exc:
        raise EngramAPIError(response.status_code, "bad_response", f"unreadable answer: {exc}") from None


class EngramClient(RestCalls):
    """Synchronous REST client; ``agent_id`` / ``persona`` are the identity sent when a call names none."""

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str | None,
        agent_id: str | None = None,
        persona: str | None = None,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
    ):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.agent_id, self.persona = agent_id, persona
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport)

    @classmethod
    def local(
        cls,
        *,
        api_key: str,
        agent_id: str | None = None,
        persona: str | None = None,
        install_queue: bool = True,
    ) -> LocalEngramClient:
        """A client whose requests the REST routes answer in this process (database from the settings, or
        the running `engram serve` of ENGRAM_HOME); same methods and results as over HTTP."""
        from api.client.local import LocalEngramClient

        return LocalEngramClient(api_key=api_key, agent_id=agent_id, persona=persona, install_queue=install_queue)

    def __enter__(self) -> EngramClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _send(self, call: Call) -> Any:
        response = self._http.request(call.method, call.path, **request_kwargs(call))
        return read_response(call, response)

    def request(self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None) -> Any:
        """A raw call: the decoded JSON answer (for routes without a typed method)."""
        return self._send(Call(method, path, lambda body: body, params=params or {}, json=json))
