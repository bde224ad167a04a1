"""A small synchronous REST client (the CLI uses it; the full typed client builds on it)."""

from __future__ import annotations

from typing import Any

import httpx


class EngramAPIError(Exception):
    def __init__(self, status: int, error: dict[str, Any]):
        super().__init__(f"{status} {error.get('code')}: {error.get('message')}")
        self.status = status
        self.error = error


class EngramClient:
    def __init__(self, *, base_url: str, api_key: str | None, timeout: float = 60.0):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.Client(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def request(
        self, method: str, path: str, *, json: Any = None, params: dict[str, Any] | None = None
    ) -> Any:
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        response = self._http.request(method, path, json=json, params=clean)
        try:
            body = response.json()
        except ValueError:
            body = {"error": {"code": "bad_response", "message": response.text[:500]}}
        if response.status_code >= 400:
            raise EngramAPIError(
                response.status_code, body.get("error", {}) if isinstance(body, dict) else {}
            )
        return body

    def save_memory(self, **fields: Any) -> dict[str, Any]:
        return self.request("POST", "/v1/memories", json={k: v for k, v in fields.items() if v is not None})

    def get_memory(self, memory_id: str, **params: Any) -> dict[str, Any]:
        return self.request("GET", f"/v1/memories/{_quote(memory_id)}", params=params)

    def forget_memory(self, memory_id: str, **params: Any) -> dict[str, Any]:
        return self.request("DELETE", f"/v1/memories/{_quote(memory_id)}", params=params)

    def list_memories(self, **params: Any) -> dict[str, Any]:
        return self.request("GET", "/v1/memories", params=params)


def _quote(memory_id: str) -> str:
    from urllib.parse import quote

    return quote(memory_id, safe="")
