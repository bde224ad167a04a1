"""engram's Python SDK (engram_client): sync and async over the real API, and local mode in-process (the
SDK's client answered by the app in this process, as the CLI and MCP use it), give the same results for
every REST call (one scenario, three tenants with the same catalog, compared field by field)."""

from __future__ import annotations

import inspect
import re
import uuid
from collections.abc import Callable
from datetime import date
from typing import Any

import anyio
import httpx
import pytest
from engram_client import AsyncEngramClient, EngramClient, MemoryHistory
from engram_client import EngramError as EngramAPIError

from api.sdk import LocalEngramClient
from api.sdk import as_json as dump
from tests.helpers.api import OPERATOR_KEY
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
    out["save_model"] = await run(lambda: engram.save_memory(content="refunds take 30 days", id="kb.1"))
    out["save_invalid"] = await run(lambda: engram.save_memory(content=""))
    out["save_unknown_entity"] = await run(lambda: engram.save_memory(content="x", linked_entities=["shop.nope"]))
    out["batch"] = await run(
        lambda: engram.save_memories(
            [{"content": "a", "run_id": "run-1", "category": "conversation"}, {"content": "b", "kind": "bogus"}]
        )
    )
    out["get"] = await run(lambda: engram.get_memory("1"))
    out["patch"] = await run(lambda: engram.update_memory("1", tags=["units", "money"]))
    out["list"] = await run(lambda: engram.list_memories(tags="units"))
    out["list_model"] = await run(lambda: engram.list_memories(limit=1, sort="importance"))
    out["list_too_many"] = await run(lambda: engram.list_memories(limit=500))
    out["hydrate"] = await run(lambda: engram.hydrate(budget_bytes=40))
    out["search"] = await run(lambda: engram.search(question="what unit is the amount in"))
    out["search_model"] = await run(lambda: engram.search(entities=["shop.orders"], max_entities=2))
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
        with LocalEngramClient(api_key=local_tenant.admin_key) as local_client:
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
        with EngramClient(base_url=api_url, api_key=key) as remote, LocalEngramClient(api_key=key) as local:
            for engram in (remote, local):
                for thunk in (
                    lambda e=engram: e.create_key(user="x@example.com"),
                    lambda e=engram: e.ingest_datasource("shop"),
                    lambda e=engram: e.delete_datasource("shop"),
                ):
                    assert (await attempt(thunk))["status"] == 403

    anyio.run(main)


# Every operation of the OpenAPI document and the SDK method that makes it.
OPERATIONS = {
    ("get", "/healthz"): "health",
    ("get", "/readyz"): "readiness",
    ("post", "/v1/memories"): "save_memory",
    ("post", "/v1/memories:batch"): "save_memories",
    ("get", "/v1/memories"): "list_memories",
    ("get", "/v1/memories/{memory_id}"): "get_memory",
    ("get", "/v1/memories/{memory_id}/history"): "memory_history",
    ("patch", "/v1/memories/{memory_id}"): "update_memory",
    ("delete", "/v1/memories/{memory_id}"): "forget_memory",
    ("post", "/v1/hydrate"): "hydrate",
    ("get", "/v1/memories:export"): "export_memories",
    ("post", "/v1/memories:import"): "import_memories",
    ("delete", "/v1/runs/{run_id}"): "end_run",
    ("post", "/v1/search"): "search",
    ("post", "/v1/datasources"): "create_datasource",
    ("get", "/v1/datasources"): "list_datasources",
    ("get", "/v1/datasources/{name}"): "get_datasource",
    ("delete", "/v1/datasources/{name}"): "delete_datasource",
    ("post", "/v1/datasources/{name}/ingest"): "ingest_datasource",
    ("post", "/v1/datasources/{name}/refresh-samples"): "refresh_samples",
    ("get", "/v1/models/{datasource}/{name}"): "inspect_model",
    ("put", "/v1/models/{datasource}/{name}"): "put_model",
    ("patch", "/v1/models/{datasource}/{name}"): "patch_model",
    ("delete", "/v1/models/{datasource}/{name}"): "delete_model",
    ("get", "/v1/jobs"): "list_jobs",
    ("get", "/v1/jobs/{job_id}"): "get_job",
    ("post", "/v1/jobs/{job_id}/retry"): "retry_job",
    ("post", "/v1/jobs:retry"): "retry_failed_jobs",
    ("post", "/v1/jobs:discard"): "discard_failed_jobs",
    ("post", "/v1/jobs/{job_id}/discard"): "discard_job",
    ("post", "/v1/jobs/{job_id}/cancel"): "cancel_job",
    ("get", "/v1/ops/reindex"): "reindex_progress",
    ("post", "/v1/ops/reindex:pause"): "pause_reindex",
    ("post", "/v1/ops/reindex:resume"): "resume_reindex",
    ("get", "/v1/ops/coverage"): "coverage",
    ("post", "/v1/keys"): "create_key",
    ("get", "/v1/keys"): "list_keys",
    ("delete", "/v1/keys/{key_id}"): "revoke_key",
    ("post", "/v1/tenants"): "create_tenant",
    ("get", "/v1/tenants"): "list_tenants",
    ("get", "/v1/tenants/{name}"): "get_tenant",
    ("patch", "/v1/tenants/{name}"): "update_tenant",
    ("delete", "/v1/tenants/{name}"): "delete_tenant",
    ("get", "/v1/usage"): "usage",
    ("get", "/v1/audit"): "list_audit",
    ("post", "/v1/webhooks"): "create_webhook",
    ("get", "/v1/webhooks"): "list_webhooks",
    ("get", "/v1/webhooks/{webhook_id}"): "get_webhook",
    ("patch", "/v1/webhooks/{webhook_id}"): "update_webhook",
    ("delete", "/v1/webhooks/{webhook_id}"): "delete_webhook",
    ("get", "/v1/webhooks/{webhook_id}/deliveries"): "webhook_deliveries",
}


def test_bad_keys_and_signatures(app):  # type: ignore[no-untyped-def]
    """A wrong key is 401 in local mode too; the SDK has one method per REST call of the OpenAPI document,
    and the three clients expose the same methods and signatures."""
    with pytest.raises(EngramAPIError) as raised:
        LocalEngramClient(api_key="egk_wrong")
    assert raised.value.status == 401 and raised.value.code == "unauthorized"
    public = [
        n
        for n in dir(EngramClient)
        if not n.startswith("_") and callable(getattr(EngramClient, n)) and n not in ("request", "local", "close")
    ]
    documented = {(verb, path) for path, item in app.openapi()["paths"].items() for verb in item}
    assert documented == set(OPERATIONS), documented ^ set(OPERATIONS)
    assert sorted(public) == sorted(OPERATIONS.values())
    for name in public:
        remote = inspect.signature(getattr(EngramClient, name))
        assert inspect.signature(getattr(LocalEngramClient, name)) == remote, name
        assert inspect.signature(getattr(AsyncEngramClient, name)) == remote, name
        assert inspect.iscoroutinefunction(getattr(AsyncEngramClient, name)), name


def test_local_mode_is_the_rest_client_over_the_app_itself():
    """Local mode adds no call of its own: every method is the REST client's, served by the routes in-process,
    so it cannot drift from what a server answers."""
    own = {name for name in vars(LocalEngramClient) if not name.startswith("__")}
    assert own == set(), own
    assert issubclass(LocalEngramClient, EngramClient)


class Recorder(httpx.BaseTransport):
    """Sends over HTTP and keeps every answer, to compare with what the OpenAPI document promises."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.answers: list[tuple[str, str, httpx.Response]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        response.read()
        self.answers.append((request.method.lower(), request.url.path, response))
        return response


def missing_fields(spec: dict[str, Any], schema: dict[str, Any], value: Any, where: str = "") -> list[str]:
    """The fields ``schema`` marks required that ``value`` lacks, at any depth (with their paths)."""
    if "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    if "anyOf" in schema:
        branches = [missing_fields(spec, branch, value, where) for branch in schema["anyOf"]]
        return min(branches, key=len)
    if isinstance(value, list) and "items" in schema:
        return [m for i, item in enumerate(value) for m in missing_fields(spec, schema["items"], item, f"{where}.{i}")]
    if not isinstance(value, dict):
        return []
    missing = [f"{where}.{name}" for name in schema.get("required", []) if name not in value]
    for name, sub in schema.get("properties", {}).items():
        if name in value:
            missing += missing_fields(spec, sub, value[name], f"{where}.{name}")
    return missing


@pytest.fixture
def tenant_with_catalog(client, make_tenant, tmp_path):  # type: ignore[no-untyped-def]
    tenant = make_tenant("answers")
    with sqlite_source(tmp_path) as (url, schema):
        create_and_ingest(client, tenant, url=url, schema=schema)
        yield tenant


def test_answers_carry_every_field_the_document_requires(api_url, tenant_with_catalog, app):  # noqa: F811
    """What generated clients (the TypeScript one) type as always present is in every answer of every call."""
    recorder = Recorder()
    with EngramClient(api_url, api_key=tenant_with_catalog.admin_key, transport=recorder) as engram:
        anyio.run(scenario, engram)
        # The calls the scenario leaves out, and the operator's.
        history = engram.memory_history("1", include_forgotten=True)
        assert history.versions[0].tags == ["units", "money"] and history.versions[-1].tags == ["units"]
        # The raw request: parsed as the model named, else as JSON, or as text when the answer is not JSON.
        raw = engram.request("GET", "/v1/memories/1/history", cast_to=MemoryHistory)
        assert isinstance(raw, MemoryHistory) and raw.versions == history.versions
        assert engram.request("GET", "/v1/memories/1")["tags"] == ["units", "money"]
        assert engram.request("GET", "/v1/memories:export", params={"format": "markdown"}).startswith("---\n")
        engram.list_keys()
        engram.health()
        engram.readiness()
        engram.usage(from_date=date.today())
        assert "memory.save" in {entry.action for entry in engram.list_audit(limit=200).entries}
        hook = engram.create_webhook("http://127.0.0.1:9/hook", events=["memory.created"], description="answers")
        assert hook.secret and [h.id for h in engram.list_webhooks()] == [hook.id]
        assert engram.update_webhook(hook.id, rotate_secret=True).secret not in (None, hook.secret)
        assert engram.update_webhook(hook.id, enabled=False).state == engram.get_webhook(hook.id).state
        assert engram.webhook_deliveries(hook.id, limit=5).deliveries == []
        assert engram.delete_webhook(hook.id).deleted
    with EngramClient(api_url, api_key=OPERATOR_KEY, transport=recorder) as operator:
        made = operator.create_tenant(f"answers-{uuid.uuid4().hex[:8]}", quotas={"max_memories": 10})
        operator.update_tenant(made.tenant, state="suspended")
        operator.list_tenants(prefix=made.tenant)
        operator.get_tenant(made.tenant)
        assert operator.retry_failed_jobs(tenant=made.tenant).count == 0
        assert operator.discard_failed_jobs(reason="answers", tenant=made.tenant).job_ids == []
        operator.reindex_progress()
        operator.delete_tenant(made.tenant)
    spec = app.openapi()
    templates = {
        (verb, re.compile(re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(path)))): op
        for path, item in spec["paths"].items()
        for verb, op in item.items()
    }
    checked, missing = set(), {}
    for verb, path, response in recorder.answers:
        if response.status_code >= 300 or "json" not in response.headers.get("Content-Type", ""):
            continue
        operation = next(op for (v, pattern), op in templates.items() if v == verb and pattern.fullmatch(path))
        schema = operation["responses"][str(response.status_code)]["content"]["application/json"]["schema"]
        if lacking := missing_fields(spec, schema, response.json()):
            missing[f"{verb} {path}"] = lacking
        checked.add(operation["operationId"])
    assert not missing, missing
    assert len(checked) >= 38, checked
