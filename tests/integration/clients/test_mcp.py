"""The MCP server through the official SDK's client: over stdio (`engram mcp`) and streamable HTTP (/mcp)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from api.mcp.size import measure
from core import __version__
from tests.helpers.catalog import create_and_ingest, sqlite_source

REPO = Path(__file__).resolve().parents[3]
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
async def stdio_session(stack, api_key: str | None, *args: str) -> AsyncIterator[ClientSession]:  # type: ignore[no-untyped-def]
    env = {**os.environ, **stack.env}
    env.pop("ENGRAM_API_KEY", None)
    if api_key is not None:
        env["ENGRAM_API_KEY"] = api_key
    params = StdioServerParameters(command=sys.executable, args=["-m", "api.cli", "mcp", *args], env=env, cwd=str(REPO))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        init = await session.initialize()
        assert init.serverInfo.name == "engram" and init.serverInfo.version == __version__
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
    assert {"content", "learning"} <= set(schema["properties"]) and "ctx" not in schema["properties"]
    for tool in listed.values():
        properties = tool.inputSchema["properties"]
        assert all(p.get("description") for p in properties.values()), (tool.name, properties)
        assert tool.annotations is not None
        destructive = tool.name in ("forget_memory", "ingest_datasource")
        assert tool.annotations.destructiveHint is destructive, tool.name
        read_only = tool.name in ("search", "get_memory", "list_memories", "hydrate", "inspect_model")
        assert tool.annotations.readOnlyHint is read_only, tool.name
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
    # Arguments the tool's schema refuses answer in the same shape, not as pydantic's text.
    bad = await call(session, "save_memory", {"content": "x", "importance": 5}, error=True)
    assert (bad["code"], bad["field"], bad["status"]) == ("validation_error", "importance", 422), bad
    bad_kind = await call(session, "search", {"question": "x", "mode": "sideways"}, error=True)
    assert (bad_kind["code"], bad_kind["field"]) == ("validation_error", "mode"), bad_kind
    # `learning` is the contract's alias of `content`.
    aliased = await call(session, "save_memory", {"learning": "the alias works"})
    assert (await call(session, "get_memory", {"id": aliased["memory_id"]}))["content"] == "the alias works"
    nothing = await call(session, "save_memory", {"tags": ["x"]}, error=True)
    assert nothing["status"] == 422 and nothing["field"] == "content", nothing


def test_stdio_lists_saves_searches_and_forgets(stack, client, tenant):
    async def main() -> None:
        async with stdio_session(stack, tenant.admin_key) as session:
            await _lifecycle(session, client, tenant)

    anyio.run(main)


def test_remote_stdio_serves_a_hosted_engram(stack, api_url, client, tenant):
    """`engram mcp --url URL --api-key KEY` serves the same tools through the REST API of another process."""

    async def main() -> None:
        async with stdio_session(stack, None, "--url", api_url, "--api-key", tenant.admin_key) as session:
            await _lifecycle(session, client, tenant)
        # The URL and key from the environment work too; this process has no database it could reach
        # itself, so the save can only have gone through the hosted engram.
        unreachable = "postgresql+psycopg://nobody@127.0.0.1:9/none"
        remote_env = {**stack.env, "ENGRAM_URL": api_url, "ENGRAM_DATABASE_URL": unreachable}
        env_stack = type(stack)(stack.database_url, stack.redis_url, stack.home, remote_env)
        async with stdio_session(env_stack, tenant.admin_key) as session:
            saved = await call(session, "save_memory", {"content": "saved through ENGRAM_URL"})
        rest = client.get(f"/v1/memories/{saved['memory_id']}", headers=tenant.headers())
        assert rest.status_code == 200 and rest.json()["content"] == "saved through ENGRAM_URL"

    anyio.run(main)


def test_remote_stdio_refuses_a_wrong_key_or_url(stack, api_url):
    env = {k: v for k, v in {**os.environ, **stack.env}.items() if k != "ENGRAM_API_KEY"}
    for args, expected in (
        (["--url", api_url, "--api-key", "egk_wrong"], "ENGRAM_API_KEY was refused"),
        (["--url", "http://127.0.0.1:9", "--api-key", "egk_wrong"], "cannot reach engram"),
        (["--url", api_url], "set ENGRAM_API_KEY"),
    ):
        command = [sys.executable, "-m", "api.cli", "mcp", *args]
        result = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        assert result.returncode != 0 and expected in result.stderr and result.stdout == "", result.stderr


def test_tool_definitions_stay_lean():
    """The nine tool definitions are sent on every turn: their size is measured and held under a budget."""
    measured = measure()
    print(measured)
    assert set(measured["tools"]) == TOOLS
    assert 0 < measured["total_tokens"] < 3500, measured


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


def test_tools_name_a_memory_by_memory_id_and_still_accept_id(api_url, tenant):
    """Every tool names a memory `memory_id`, as the answers do; `id`, the first name, still works."""

    async def main() -> None:
        async with http_session(api_url, tenant.admin_key) as session:
            listed = {t.name: t.inputSchema for t in (await session.list_tools()).tools}
            for tool in ("get_memory", "update_memory", "forget_memory"):
                assert "memory_id" in listed[tool]["required"] and "id" not in listed[tool]["properties"], tool
            save_arguments = listed["save_memory"]["properties"]
            assert "memory_id" in save_arguments and "id" not in save_arguments
            saved = await call(session, "save_memory", {"content": "named once", "memory_id": "named-1"})
            assert saved["memory_id"] == "named-1"
            assert (await call(session, "get_memory", {"memory_id": "named-1"}))["content"] == "named once"
            assert (await call(session, "get_memory", {"id": "named-1"}))["content"] == "named once"
            updated = await call(session, "update_memory", {"memory_id": "named-1", "content": "named twice"})
            assert updated["content"] == "named twice"
            missing = await call(session, "get_memory", {}, error=True)
            assert missing["status"] == 422 and missing["field"] == "memory_id"
            assert (await call(session, "forget_memory", {"memory_id": "named-1"}))["status"] == "forgotten"

    anyio.run(main)
