"""The SDK's models and parameters stay those of the server: compared with the server's OpenAPI document
(``create_app().openapi()``, what /openapi.json serves), so a field added, renamed or dropped on one side
fails here instead of in a user's program."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path
from typing import Any

import engram_client.models as sdk
import engram_client.resources as more
import pytest
from engram_client import AsyncEngramClient, EngramClient
from pydantic import BaseModel

SDK = Path(__file__).resolve().parents[3] / "clients" / "python"


@pytest.fixture(scope="module")
def spec(app) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    return app.openapi()


def component(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return spec["components"]["schemas"][name]


# SDK model -> the spec's component of the same answer.
RESPONSES: list[tuple[type[BaseModel], str]] = [
    (sdk.Memory, "Memory"),
    (sdk.Association, "AssociationOut"),
    (sdk.MemoryPage, "MemoryPage"),
    (sdk.ForgetResult, "ForgetResult"),
    (sdk.HydrateResult, "HydrateResult"),
    (sdk.BatchResult, "BatchResult"),
    (sdk.BatchItemError, "BatchItemError"),
    (sdk.ErrorBody, "ErrorBody"),
    (sdk.Job, "Job"),
    (sdk.SaveResult, "SaveResult"),
    (sdk.SearchResponse, "SearchResponse"),
    (sdk.MemoryHit, "MemoryHit"),
    (sdk.ExampleQueryHit, "ExampleQueryHit"),
    (sdk.EntityHit, "EntityHit"),
    (sdk.Channels, "Channels"),
    (more.MemoryVersion, "MemoryVersion"),
    (more.MemoryHistory, "MemoryHistory"),
    (more.ImportResult, "ImportResult"),
    (more.RunEnded, "RunEnded"),
    (more.Datasource, "Datasource"),
    (more.Deleted, "Deleted"),
    (more.JobAccepted, "JobAccepted"),
    (more.JobPage, "JobPage"),
    (more.ModelInspection, "ModelInspection"),
    (more.IssuedKey, "IssuedKeyOut"),
    (more.ApiKey, "KeyOut"),
    (more.KeyRevoked, "KeyRevoked"),
    (more.CoverageRow, "CoverageRow"),
    (more.Health, "Health"),
    (more.Readiness, "Readiness"),
    (more.Quotas, "Quotas"),
    (more.Usage, "Usage"),
    (more.UsageDay, "UsageDay"),
    (more.UsageReport, "UsageReport"),
    (more.Tenant, "TenantOut"),
    (more.ProvisionedTenant, "ProvisionedOut"),
    (more.TenantPage, "TenantPage"),
    (more.AuditActor, "AuditActor"),
    (more.AuditEntry, "AuditEntryOut"),
    (more.AuditPage, "AuditPage"),
    (more.Webhook, "WebhookOut"),
    (more.WebhookCreated, "WebhookCreated"),
    (more.WebhookUpdated, "WebhookUpdated"),
    (more.WebhookDeleted, "WebhookDeleted"),
    (more.DeliveryAttempt, "DeliveryAttempt"),
    (more.WebhookDelivery, "WebhookDeliveryOut"),
    (more.WebhookDeliveryPage, "WebhookDeliveryPage"),
    (more.JobBulkResult, "JobBulkResult"),
    (more.ReindexProgress, "ReindexProgress"),
]


@pytest.mark.parametrize(("ours", "name"), RESPONSES, ids=[name for _, name in RESPONSES])
def test_response_models_have_the_spec_fields(spec, ours, name):
    """Same field names; and the SDK never requires a field the server may leave out."""
    schema = component(spec, name)
    assert {info.alias or field for field, info in ours.model_fields.items()} == set(schema["properties"])
    required = {info.alias or field for field, info in ours.model_fields.items() if info.is_required()}
    assert required <= set(schema.get("required", []))


def _parameters(method: str, *, outside: set[str] = frozenset()) -> set[str]:  # type: ignore[assignment]
    return set(inspect.signature(getattr(EngramClient, method)).parameters) - {"self"} - outside


# Each SDK method's keyword parameters against the request body it sends.
BODIES: list[tuple[str, str, set[str]]] = [
    ("save_memory", "SaveMemoryIn", set()),
    ("update_memory", "PatchMemoryIn", {"memory_id"}),  # the id is in the path
    ("search", "SearchRequest", set()),
    ("hydrate", "HydrateIn", set()),
]


@pytest.mark.parametrize(("method", "name", "outside"), BODIES, ids=[m for m, _, _ in BODIES])
def test_method_parameters_are_the_request_body_fields(spec, method, name, outside):
    assert _parameters(method, outside=outside) == set(component(spec, name)["properties"])


# ... and against the query (and path) parameters of the calls without a body.
QUERIES: list[tuple[str, str, str]] = [
    ("list_memories", "/v1/memories", "get"),
    ("get_memory", "/v1/memories/{memory_id}", "get"),
    ("forget_memory", "/v1/memories/{memory_id}", "delete"),
]


@pytest.mark.parametrize(("method", "path", "verb"), QUERIES, ids=[m for m, _, _ in QUERIES])
def test_method_parameters_are_the_query_parameters(spec, method, path, verb):
    documented = {parameter["name"] for parameter in spec["paths"][path][verb]["parameters"]}
    assert _parameters(method) == documented


def test_the_async_calls_are_the_sync_ones_awaitable():
    """The async client's admin calls are generated from the sync ones; the file in the repository is current,
    and every sync method has an async twin with the same signature."""
    script = SDK / "scripts" / "make_async_admin.py"
    assert subprocess.run([sys.executable, str(script), "--check"], timeout=60).returncode == 0, f"run {script}"
    for name in (n for n in dir(EngramClient) if not n.startswith("_") and n != "close"):
        assert inspect.signature(getattr(AsyncEngramClient, name)) == inspect.signature(getattr(EngramClient, name))


def test_the_sdk_stands_alone():
    """The SDK is its own distribution too: importing all of it loads nothing of the server."""
    code = (
        "import sys, engram_client, engram_client.langchain, engram_client.langgraph\n"
        "server = sorted(m for m in sys.modules if m.split('.')[0] in ('core', 'api', 'workers'))\n"
        "assert not server, server\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=SDK)
    assert result.returncode == 0, result.stderr
