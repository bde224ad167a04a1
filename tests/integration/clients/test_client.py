"""The Python clients: sync and async over the real API, and local mode in-process, give the same results
for every REST call (one scenario, three tenants with the same catalog, compared field by field)."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import anyio
import pytest

from api.client import EngramAPIError, EngramClient
from api.client.aio import AsyncEngramClient
from api.client.base import dump
from api.client.local import LocalEngramClient
from core.memories.schemas import ListFilters, SaveMemoryIn
from core.search.schemas import SearchRequest
from tests.helpers.catalog import create_and_ingest, sqlite_source

# Values that differ between tenants by construction (times, secrets, generated ids, tenant names).
VOLATILE = {
    "created_at",
    "updated_at",
    "occurred_at",
    "last_accessed_at",
    "sampled_at",
    "last_ingested_at",
    "started_at",
    "finished_at",
    "api_key",
    "job_id",
    "tenant",
    "tenant_id",
    "state",
    "attempts",
    "result",
    "next_cursor",
}


GENERATED_ID = re.compile(r"key_[0-9a-f]{16}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32}")


def normalise(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "<volatile>" if k in VOLATILE else normalise(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalise(v) for v in value]
    if isinstance(value, str) and GENERATED_ID.search(value):
        return GENERATED_ID.sub("<generated id>", value)
    if isinstance(value, str) and value.startswith("---\n"):  # the export: drop its record times
        times = ("created_at:", "updated_at:", "occurred_at:", "changed_at:")  # also inside `history:`
        return "\n".join(line for line in value.split("\n") if not line.strip().startswith(times))
    return value


def first_difference(got: Any, expected: Any, path: str = "") -> str:
    if isinstance(got, dict) and isinstance(expected, dict):
        for key in sorted(set(got) | set(expected)):
            if got.get(key) != expected.get(key):
                return first_difference(got.get(key), expected.get(key), f"{path}.{key}")
    if isinstance(got, list) and isinstance(expected, list) and len(got) == len(expected):
        for i, (a, b) in enumerate(zip(got, expected, strict=True)):
            if a != b:
                return first_difference(a, b, f"{path}.{i}")
    return f"{path}: {got!r} != {expected!r}"


async def attempt(thunk: Callable[[], Any]) -> Any:
    """The call's result as JSON data, or its error as {"status", "error"}; awaits async clients."""
    try:
        value = thunk()
        if inspect.isawaitable(value):
            value = await value
        return dump(value)
    except EngramAPIError as exc:
        return {"status": exc.status, "error": exc.error}


async def scenario(engram: Any) -> dict[str, Any]:
    """Every REST call once, in an order where each one has something to act on."""
    out: dict[str, Any] = {}
    run = attempt
    out["save"] = await run(
        lambda: engram.save_memory(
            content="orders.amount is in cents",
            kind="decision",
            tags=["units"],
            linked_entities=["shop.orders.amount"],
            occurred_at="2024-05-06T07:08:09+00:00",
        )
    )
    out["save_model"] = await run(lambda: engram.save_memory(SaveMemoryIn(content="refunds take 30 days", id="kb.1")))
    out["save_invalid"] = await run(lambda: engram.save_memory(content=""))
    out["save_unknown_entity"] = await run(lambda: engram.save_memory(content="x", linked_entities=["shop.nope"]))
    out["batch"] = await run(
        lambda: engram.save_memories(
            [{"content": "a", "run_id": "run-1", "category": "conversation"}, {"content": "b", "kind": "bogus"}]
        )
    )
    out["get"] = await run(lambda: engram.get_memory("1"))
    out["patch"] = await run(lambda: engram.patch_memory("1", tags=["units", "money"]))
    out["list"] = await run(lambda: engram.list_memories(tags="units"))
    out["list_model"] = await run(lambda: engram.list_memories(ListFilters(limit=1, sort="importance")))
    out["list_too_many"] = await run(lambda: engram.list_memories(limit=500))
    out["hydrate"] = await run(lambda: engram.hydrate(budget_bytes=40))
    out["search"] = await run(lambda: engram.search(question="what unit is the amount in"))
    out["search_model"] = await run(lambda: engram.search(SearchRequest(entities=["shop.orders"], max_entities=2)))
    markdown = await run(lambda: engram.export_memories())
    out["export"] = markdown
    out["import"] = await run(lambda: engram.import_memories(markdown))
    out["import_bad"] = await run(lambda: engram.import_memories("---\nkey: a\nkind: nope\n---\nx\n"))
    out["forget"] = await run(lambda: engram.forget_memory("kb.1", reason="outdated"))
    out["get_forgotten"] = await run(lambda: engram.get_memory("kb.1"))
    out["end_run"] = await run(lambda: engram.end_run("run-1"))
    key = await run(lambda: engram.create_key(user="member@example.com"))
    out["create_key"] = key
    out["revoke_key"] = await run(lambda: engram.revoke_key(key["id"]))
    out["revoke_again"] = await run(lambda: engram.revoke_key(key["id"]))
    out["datasources"] = await run(lambda: engram.list_datasources())
    out["datasource"] = await run(lambda: engram.get_datasource("shop"))
    out["datasource_bad"] = await run(lambda: engram.create_datasource(name="a.b", url="sqlite://"))
    out["inspect"] = await run(lambda: engram.inspect_model("shop", "orders"))
    out["patch_model"] = await run(lambda: engram.patch_model("shop", "orders", description="one row per order"))
    out["put_model"] = await run(lambda: engram.put_model("shop", "regions", label="Regions"))
    accepted = await run(lambda: engram.refresh_samples("shop", models=["orders"]))
    out["refresh"] = accepted
    out["job"] = await run(lambda: engram.get_job(accepted["job_id"]))
    out["jobs"] = await run(lambda: engram.list_jobs(kind="refresh_samples"))
    out["retry_healthy"] = await run(lambda: engram.retry_job(accepted["job_id"]))
    out["ingest"] = await run(lambda: engram.ingest_datasource("shop"))
    out["coverage"] = await run(lambda: engram.coverage())
    out["delete_model"] = await run(lambda: engram.delete_model("shop", "regions"))
    out["delete_datasource"] = await run(lambda: engram.delete_datasource("shop"))
    out["inspect_gone"] = await run(lambda: engram.inspect_model("shop", "orders"))
    return out


@pytest.fixture
def three_tenants(client, make_tenant, tmp_path):  # type: ignore[no-untyped-def]
    tenants = [make_tenant("client") for _ in range(3)]
    with sqlite_source(tmp_path) as (url, schema):
        for tenant in tenants:
            create_and_ingest(client, tenant, url=url, schema=schema)
        yield tenants


def test_sync_async_and_local_give_the_same_results(api_url, three_tenants):  # noqa: F811
    sync_tenant, async_tenant, local_tenant = three_tenants

    async def main() -> list[dict[str, Any]]:
        with EngramClient(base_url=api_url, api_key=sync_tenant.admin_key) as sync_client:
            over_sync = await scenario(sync_client)
        async with AsyncEngramClient(base_url=api_url, api_key=async_tenant.admin_key) as async_client:
            over_async = await scenario(async_client)
        with EngramClient.local(api_key=local_tenant.admin_key) as local_client:
            in_process = await scenario(local_client)
        return [over_sync, over_async, in_process]

    over_sync, over_async, in_process = anyio.run(main)
    for name in over_sync:
        expected = normalise(over_sync[name])
        assert normalise(over_async[name]) == expected, (name, first_difference(normalise(over_async[name]), expected))
        assert normalise(in_process[name]) == expected, (name, first_difference(normalise(in_process[name]), expected))
    assert {r["patch"]["occurred_at"] for r in (over_sync, over_async, in_process)} == {"2024-05-06T07:08:09Z"}
    # The scenario exercised what it meant to: real results and the REST error shape.
    assert over_sync["save"]["entities"] == ["shop.orders.amount"]
    assert over_sync["save_invalid"]["status"] == 422 and over_sync["save_invalid"]["error"]["field"] == "content"
    assert over_sync["save_unknown_entity"]["status"] == 422
    assert "error" in over_sync["batch"]["results"][1] and over_sync["batch"]["results"][0]["memory_id"] == "2"
    assert over_sync["patch"]["tags"] == ["units", "money"] and over_sync["patch"]["occurred_at"].startswith("2024")
    assert over_sync["list_model"]["next_cursor"] and over_sync["list_too_many"]["status"] == 422
    assert "1" in [hit["id"] for hit in over_sync["search"]["memories"]]
    assert over_sync["import"]["memory_ids"] == ["1", "kb.1", "2"]
    assert over_sync["import_bad"]["error"]["field"] == "blocks.0.kind"
    assert over_sync["get_forgotten"]["status"] == 404 and over_sync["revoke_again"]["status"] == 404
    assert over_sync["end_run"]["count"] == 1
    assert over_sync["datasource"]["models"] == ["customers", "orders", "orders_archive", "regions"]
    assert over_sync["datasource_bad"]["status"] == 422
    assert over_sync["patch_model"]["description"] == "one row per order"
    assert over_sync["job"]["kind"] == "refresh_samples" and over_sync["jobs"]["jobs"]
    assert over_sync["retry_healthy"]["status"] == 409
    assert over_sync["coverage"] and over_sync["delete_datasource"]["status"] == "deleted"
    assert over_sync["inspect_gone"]["status"] == 404


def test_members_are_refused_admin_calls_the_same_way(api_url, client, tenant, member_key):  # noqa: F811
    """A member key gets 403 from key, catalog-write and retry calls, remotely and locally alike."""
    key = member_key()

    async def main() -> None:
        with EngramClient(base_url=api_url, api_key=key) as remote, EngramClient.local(api_key=key) as local:
            for engram in (remote, local):
                for thunk in (
                    lambda e=engram: e.create_key(user="x@example.com"),
                    lambda e=engram: e.ingest_datasource("shop"),
                    lambda e=engram: e.delete_datasource("shop"),
                ):
                    assert (await attempt(thunk))["status"] == 403

    anyio.run(main)


def test_bad_keys_and_signatures():
    """A wrong key is 401 in local mode too; the three clients expose the same methods and signatures."""
    with pytest.raises(EngramAPIError) as raised:
        EngramClient.local(api_key="egk_wrong")
    assert raised.value.status == 401 and raised.value.code == "unauthorized"
    public = [
        n
        for n in dir(EngramClient)
        if not n.startswith("_") and callable(getattr(EngramClient, n)) and n not in ("request", "local", "close")
    ]
    assert len(public) == 27
    for name in public:
        remote = inspect.signature(getattr(EngramClient, name))
        assert inspect.signature(getattr(LocalEngramClient, name)) == remote, name
        assert hasattr(AsyncEngramClient, name)


def test_local_mode_is_the_rest_client_over_the_app_itself():
    """Local mode adds no call of its own: every method is the REST client's, served by the routes in-process,
    so it cannot drift from what a server answers."""
    own = {name for name in vars(LocalEngramClient) if not name.startswith("__")}
    assert own == set(), own
    assert issubclass(LocalEngramClient, EngramClient)
