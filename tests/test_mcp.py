"""The MCP server through the official SDK's client: over stdio (`engram mcp`) and streamable HTTP (/mcp)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from core.embedded import free_port
from tests.test_catalog_support import create_and_ingest, sqlite_source

REPO = Path(__file__).resolve().parents[1]
TOOLS = {
    "save_memory",
    "get_memory",
    "update_memory",
    "forget_memory",
    "list_memories",
    "search",
    "hydrate",
    "inspect_model",
    "ingest_datasource",
}


@pytest.fixture(scope="module")
def api_url(stack) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """The real API (uvicorn) in a subprocess on the test stack."""
    port = free_port()
    log = Path(tempfile.mkstemp(prefix="engram-mcp-api-", suffix=".log", dir="/tmp")[1])
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "api.main:app", "--port", str(port), "--log-level", "warning"],
            cwd=REPO,
            env={**os.environ, **stack.env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield url
        process.terminate()
        process.wait(timeout=30)


@asynccontextmanager
async def http_session(url: str, api_key: str, headers: dict[str, str] | None = None) -> AsyncIterator[ClientSession]:
    auth = {"Authorization": f"Bearer {api_key}", **(headers or {})}
    async with (
        httpx.AsyncClient(headers=auth, timeout=60) as http,
        streamable_http_client(url + "/mcp", http_client=http) as (read, write, _),
        ClientSession(read, write) as session,
    ):
        await session.initialize()
        yield session


@asynccontextmanager
async def stdio_session(stack, api_key: str, *args: str) -> AsyncIterator[ClientSession]:  # type: ignore[no-untyped-def]
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "api.cli", "mcp", *args],
        env={**os.environ, **stack.env, "ENGRAM_API_KEY": api_key},
        cwd=str(REPO),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, tool: str, arguments: dict[str, Any], *, error: bool = False) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert result.isError is error, result.content
    if error:
        return json.loads(result.content[0].text)["error"]  # type: ignore[union-attr]
    assert result.structuredContent is not None
    assert json.loads(result.content[0].text) == result.structuredContent  # type: ignore[union-attr]
    return result.structuredContent


async def _lifecycle(session: ClientSession, client, tenant) -> None:  # type: ignore[no-untyped-def]
    """List the tools, then save, search, get, update and forget one memory; errors match REST."""
    listed = {t.name: t for t in (await session.list_tools()).tools}
    assert set(listed) == TOOLS
    for tool in listed.values():
        assert "Example" in (tool.description or ""), tool.name
    schema = listed["save_memory"].inputSchema
    # `content` or its REST alias `learning`: neither is required alone, one of them is.
    assert not schema.get("required") and {"content", "learning"} <= set(schema["properties"])
    assert "ctx" not in schema["properties"]
    aliased = await call(session, "save_memory", {"learning": "invoices are due in 14 days"})
    assert (await call(session, "get_memory", {"id": aliased["memory_id"]}))["content"] == "invoices are due in 14 days"
    neither = await call(session, "save_memory", {"tags": ["x"]}, error=True)
    assert neither["status"] == 422 and neither["field"] == "content"
    saved = await call(
        session, "save_memory", {"content": "the refund window is 30 days", "tags": ["policy"], "kind": "decision"}
    )
    memory_id = saved["memory_id"]
    found = await call(session, "search", {"question": "how long is the refund window?"})
    assert memory_id in [hit["id"] for hit in found["memories"]]
    got = await call(session, "get_memory", {"id": memory_id})
    assert (got["content"], got["kind"], got["tags"], got["importance"]) == (
        "the refund window is 30 days",
        "decision",
        ["policy"],
        0.8,
    )
    updated = await call(session, "update_memory", {"id": memory_id, "content": "the refund window is 45 days"})
    assert updated["content"] == "the refund window is 45 days" and updated["created_at"] == got["created_at"]
    forgotten = await call(session, "forget_memory", {"id": memory_id, "reason": "policy changed"})
    assert forgotten == {"memory_id": memory_id, "status": "forgotten"}
    missing = await call(session, "get_memory", {"id": memory_id}, error=True)
    rest = client.get(f"/v1/memories/{memory_id}", headers=tenant.headers()).json()["error"]
    assert (missing["code"], missing["message"], missing["status"]) == (rest["code"], rest["message"], 404)
    invalid = await call(session, "save_memory", {"content": "x", "linked_entities": ["nowhere.table"]}, error=True)
    assert invalid["status"] == 422 and invalid["field"] == "linked_entities.0"


def test_stdio_lists_saves_searches_and_forgets(stack, client, tenant):
    async def main() -> None:
        async with stdio_session(stack, tenant.admin_key) as session:
            await _lifecycle(session, client, tenant)

    anyio.run(main)


def test_http_lists_saves_searches_and_forgets(api_url, client, tenant):
    async def main() -> None:
        async with http_session(api_url, tenant.admin_key) as session:
            await _lifecycle(session, client, tenant)

    anyio.run(main)


def test_http_needs_a_valid_key(api_url):
    """/mcp answers 401 in the REST error shape without a key or with a wrong one."""
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    for headers in ({}, {"Authorization": "Bearer egk_wrong"}):
        response = httpx.post(api_url + "/mcp", json=body, headers=headers)
        assert response.status_code == 401, response.text
        assert response.json()["error"]["code"] == "unauthorized"


def test_stdio_refuses_a_wrong_key(stack):
    env = {**os.environ, **stack.env, "ENGRAM_API_KEY": "egk_wrong"}
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", "mcp"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0 and "ENGRAM_API_KEY was refused" in result.stderr and result.stdout == ""


def test_identity_hydrate_list_and_catalog_tools(api_url, client, tenant, member_key, tmp_path):
    """Agent identity comes from the tool argument or the X-Engram-Agent-Id header; hydrate and list see
    only what that agent may; inspect_model shows learnings; ingest needs an admin key."""
    with sqlite_source(tmp_path) as (url, schema):
        create_and_ingest(client, tenant, url=url, schema=schema)
    member = member_key()

    async def main() -> None:
        async with http_session(api_url, member, {"X-Engram-Agent-Id": "planner"}) as session:
            mine = await call(
                session, "save_memory", {"content": "amount is cents", "linked_entities": ["shop.orders.amount"]}
            )
            other = await call(session, "save_memory", {"content": "someone else's note", "agent_id": "writer"})
            hydrated = await call(session, "hydrate", {"budget_bytes": 1000})
            assert [m["id"] for m in hydrated["memories"]] == [mine["memory_id"]]
            assert hydrated["memories"][0]["agent_id"] == "planner"
            listed = await call(session, "list_memories", {"agent_id": "writer", "limit": 10})
            assert [m["id"] for m in listed["memories"]] == [other["memory_id"]]
            model = await call(session, "inspect_model", {"datasource": "shop", "model": "orders"})
            assert mine["memory_id"] in [m["id"] for m in model["learnings"]]
            denied = await call(session, "ingest_datasource", {"datasource": "shop"}, error=True)
            assert denied["status"] == 403
            missing = await call(session, "inspect_model", {"datasource": "shop", "model": "nope"}, error=True)
            assert missing["status"] == 404
        async with http_session(api_url, tenant.admin_key) as session:
            accepted = await call(session, "ingest_datasource", {"datasource": "shop"})
            job = client.get(f"/v1/jobs/{accepted['job_id']}", headers=tenant.headers()).json()
            assert job["kind"] == "ingest"

    anyio.run(main)
