"""The audit log (CONTRACT section 10): every write and admin action of a tenant, recorded with the change in
its transaction, readable by the tenant's admins, and append-only by the database itself."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from core.audit.service import Actor, prune_audit, purge_tenant_audit, record, record_operator
from core.db import get_engine, get_owner_engine, system_session, tenant_session
from tests.helpers.processes import REPO, answers_health, stop_process


def _entries(client, tenant, **params):  # type: ignore[no-untyped-def]
    response = client.get("/v1/audit", params=params, headers=tenant.headers())
    assert response.status_code == 200, response.text
    return response.json()["entries"]


def test_writes_and_admin_actions_are_recorded_with_actor_target_and_request_id(client, tenant, member_key):
    member = member_key("ana@example.com")
    headers = {**tenant.headers(member), "X-Request-ID": "req-save-1"}
    assert (
        client.post("/v1/memories", json={"content": "orders are in cents", "id": "m1"}, headers=headers).status_code
        == 201
    )
    assert (
        client.patch(
            "/v1/memories/m1", json={"content": "orders are in USD cents"}, headers=tenant.headers(member)
        ).status_code
        == 200
    )
    batch = {"items": [{"content": f"note {i}"} for i in range(3)] + [{"content": ""}], "agent_id": "planner"}
    assert client.post("/v1/memories:batch", json=batch, headers=tenant.headers()).status_code == 200
    assert client.delete("/v1/memories/m1", headers=tenant.headers()).status_code == 200
    assert client.delete("/v1/memories/m1?purge=true", headers=tenant.headers()).status_code == 200

    entries = _entries(client, tenant, limit=200)
    actions = [(e["action"], e["target"]) for e in reversed(entries)]
    assert actions[:1] == [("key.create", actions[0][1])]  # the member key issued by the fixture
    assert actions[1:] == [
        ("memory.save", "memory:m1"),
        ("memory.update", "memory:m1"),
        ("memory.save", "memory:1"),
        ("memory.save", "memory:2"),
        ("memory.save", "memory:3"),  # the invalid fourth item saved nothing and left nothing
        ("memory.forget", "memory:m1"),
        ("memory.purge", "memory:m1"),
    ]
    save = next(e for e in entries if e["target"] == "memory:m1" and e["action"] == "memory.save")
    assert save["request_id"] == "req-save-1"
    assert save["actor"]["user"] == "ana@example.com" and save["actor"]["key_id"]
    batch_entry = next(e for e in entries if e["target"] == "memory:2")
    assert batch_entry["actor"]["agent_id"] == "planner" and batch_entry["request_id"]
    assert all("orders" not in json.dumps(e) for e in entries)  # no content in the log


def test_a_batch_leaves_an_entry_and_an_event_per_saved_item_in_its_own_statement(client, tenant):
    """New, upserted and repeated ids in one batch: an entry per saved item in input order, and its event
    (memory.updated for a memory that existed before the batch), written with the save (no worker runs here:
    the delivery rows are the events)."""
    headers = tenant.headers()
    assert client.post("/v1/memories", json={"content": "old", "id": "kept"}, headers=headers).status_code == 201
    hook = {"url": "http://127.0.0.1:9/hook", "events": ["memory.created", "memory.updated"]}
    assert client.post("/v1/webhooks", json=hook, headers=headers).status_code == 201
    items = [
        {"content": "a"},
        {"content": "b", "id": "kept", "kind": "decision"},
        {"content": ""},
        {"content": "c", "id": "twice"},
        {"content": "d", "id": "twice", "category": "daily"},
        {"content": "e"},
    ]
    response = client.post("/v1/memories:batch", json={"items": items, "agent_id": "planner"}, headers=headers)
    ids = [r.get("memory_id") for r in response.json()["results"]]
    assert ids == ["1", "kept", None, "twice", "twice", "2"]
    saves = [e for e in reversed(_entries(client, tenant, action="memory.save"))][1:]
    assert [e["target"] for e in saves] == [f"memory:{i}" for i in ids if i is not None]
    assert {e["actor"]["agent_id"] for e in saves} == {"planner"}
    with tenant_session(tenant.tenant_id) as session:
        rows = session.execute(text("SELECT event_type, data FROM webhook_deliveries")).all()
    user = saves[0]["actor"]["user"]
    assert sorted((t, d["memory_id"], d["kind"], d["category"], d["user"], d["agent_id"]) for t, d in rows) == [
        ("memory.created", "1", "fact", "core", user, "planner"),
        ("memory.created", "2", "fact", "core", user, "planner"),
        ("memory.created", "twice", "fact", "core", user, "planner"),
        ("memory.created", "twice", "fact", "daily", user, "planner"),
        ("memory.updated", "kept", "decision", "core", user, "planner"),
    ]
    assert client.get("/v1/memories/twice", headers=headers).json()["content"] == "d"  # the later item won


def test_saves_of_new_memories_write_an_event_exactly_while_a_webhook_listens(client, tenant):
    """A save of new memories leaves the events out while no webhook listens (the process remembers which
    tenants it saw with one): a webhook registered, disabled or enabled between saves still gets every event
    of the saves made while it listens, and none of the others."""
    headers = tenant.headers()

    def save(content: str) -> None:
        assert client.post("/v1/memories", json={"content": content}, headers=headers).status_code == 201

    def delivered() -> list[str]:
        with tenant_session(tenant.tenant_id) as session:
            rows = session.execute(text("SELECT data FROM webhook_deliveries")).scalars().all()
        return sorted(row["memory_id"] for row in rows)

    save("before any webhook")
    hook = {"url": "http://127.0.0.1:9/hook", "events": ["memory.created"]}
    created = client.post("/v1/webhooks", json=hook, headers=headers)
    assert created.status_code == 201
    save("heard")
    batch = client.post("/v1/memories:batch", json={"items": [{"content": "heard too"}]}, headers=headers)
    assert batch.status_code == 200
    path = f"/v1/webhooks/{created.json()['id']}"
    assert client.patch(path, json={"enabled": False}, headers=headers).status_code == 200
    save("while disabled")
    save("still disabled")
    assert client.patch(path, json={"enabled": True}, headers=headers).status_code == 200
    save("heard again")
    assert delivered() == ["2", "3", "6"]
    assert len(_entries(client, tenant, action="memory.save")) == 6  # every save has its entry either way


def test_filters_and_cursor_walk_the_log(client, tenant, member_key, tmp_path):
    member = member_key("bo@example.com")
    for i in range(5):
        client.post("/v1/memories", json={"content": f"n{i}"}, headers=tenant.headers(member))
    source = tmp_path / "shop.db"
    sqlite3.connect(source).executescript("CREATE TABLE orders (id INTEGER PRIMARY KEY, amount INTEGER);").close()
    ds = {"name": "shop", "url": f"sqlite:///{source}"}
    assert client.post("/v1/datasources", json=ds, headers=tenant.headers()).status_code == 201
    assert client.delete("/v1/datasources/shop", headers=tenant.headers()).status_code == 200

    assert [e["action"] for e in _entries(client, tenant, action="datasource")] == [
        "datasource.remove",
        "datasource.add",
    ]
    assert {e["actor"]["user"] for e in _entries(client, tenant, actor="bo@example.com")} == {"bo@example.com"}
    assert len(_entries(client, tenant, action="memory.save")) == 5
    assert _entries(client, tenant, since=(datetime.now(UTC) + timedelta(hours=1)).isoformat()) == []

    seen, cursor = [], None
    while True:
        page = client.get(
            "/v1/audit", params={"limit": 2, **({"cursor": cursor} if cursor else {})}, headers=tenant.headers()
        ).json()
        seen += [e["id"] for e in page["entries"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 8  # key.create, 5 saves, datasource add and remove


def test_admin_only_and_bad_input_is_a_4xx(client, tenant, member_key):
    member = member_key()
    assert client.get("/v1/audit", headers=tenant.headers(member)).status_code == 403
    for params, field in (
        ({"limit": 0}, "limit"),
        ({"cursor": "%%%"}, "cursor"),
        ({"since": "yesterday"}, "since"),
        ({"bogus": 1}, "bogus"),
    ):
        response = client.get("/v1/audit", params=params, headers=tenant.headers())
        assert response.status_code in (400, 422), (params, response.text)
        assert response.json()["error"]["field"] == field


def test_a_tenant_reads_only_its_own_entries(client, make_tenant):
    a, b = make_tenant("audit-a"), make_tenant("audit-b")
    for i in range(3):
        client.post("/v1/memories", json={"content": "a's note", "id": f"only-a-{i}"}, headers=a.headers())
    assert _entries(client, b) == []
    client.post("/v1/memories", json={"content": "b's note"}, headers=b.headers())
    # Ids count per tenant: b's first entry is 1 however busy a was (a global count would tell b about a).
    assert [e["id"] for e in _entries(client, b)] == ["1"]
    with tenant_session(b.tenant_id) as session:  # raw SQL: row-level security alone keeps a's rows away
        assert session.execute(text("SELECT count(*) FROM audit_entries")).scalar() == 1


def test_a_rolled_back_change_leaves_no_entry(client, tenant):
    from core.memories.schemas import SaveMemoryIn
    from core.memories.service import save_memory
    from core.tenancy.service import authenticate

    with system_session() as session:
        caller = authenticate(session, api_key=tenant.admin_key)
    with pytest.raises(RuntimeError), tenant_session(tenant.tenant_id) as session:
        item = SaveMemoryIn(content="never committed", id="ghost")
        save_memory(session, caller=caller, item=item, action="memory.save")
        raise RuntimeError("the request failed after the save")
    assert _entries(client, tenant) == []


def test_the_service_role_cannot_update_or_delete_entries(client, tenant):
    client.post("/v1/memories", json={"content": "x", "id": "kept"}, headers=tenant.headers())
    for statement in (
        "UPDATE audit_entries SET action = 'forged'",
        "DELETE FROM audit_entries",
        "TRUNCATE audit_entries",
        "UPDATE operator_audit SET action = 'forged'",
        "DELETE FROM operator_audit",
    ):
        for mode in ("tenant", "system"):
            session_of = tenant_session(tenant.tenant_id) if mode == "tenant" else system_session()
            with pytest.raises(DBAPIError, match="permission denied"), session_of as session:
                session.execute(text(statement))
    with get_engine().connect() as connection:  # the very role the service logs in as
        assert connection.execute(text("SELECT current_user")).scalar() == "engram_app"
        for privilege in ("UPDATE", "DELETE", "TRUNCATE"):
            assert not connection.execute(
                text("SELECT has_table_privilege('audit_entries', :p)"), {"p": privilege}
            ).scalar()
        assert connection.execute(text("SELECT has_table_privilege('audit_entries', 'INSERT')")).scalar()
    assert [e["action"] for e in _entries(client, tenant)] == ["memory.save"]


def test_prune_removes_entries_past_retention_through_the_owner(client, tenant):
    record_at = datetime.now(UTC) - timedelta(days=400)
    with tenant_session(tenant.tenant_id) as session:
        record(
            session,
            caller_or_actor=Actor(tenant_id=tenant.tenant_id, user="system"),
            action="memory.save",
            target="memory:old",
        )
    # Backdate it as the owner (what no service role can do), then prune as the service does.
    with get_owner_engine().begin() as connection:
        connection.execute(text("SELECT set_config('engram.system', 'on', true)"))
        connection.execute(
            text("UPDATE audit_entries SET at = :at WHERE tenant_id = :t AND target = 'memory:old'"),
            {"at": record_at, "t": tenant.tenant_id},
        )
    client.post("/v1/memories", json={"content": "fresh", "id": "fresh"}, headers=tenant.headers())
    with pytest.raises(DBAPIError, match="at least one day"), system_session() as session:
        prune_audit(session, retention_days=0.5)
    with pytest.raises(DBAPIError, match="system mode only"), tenant_session(tenant.tenant_id) as session:
        prune_audit(session, retention_days=365)
    from core.config import get_settings
    from core.lifecycle.prune import run_prune

    with system_session() as session:
        result = run_prune(session, settings=get_settings())
    assert result["audit_removed"] >= 1
    assert [e["target"] for e in _entries(client, tenant)] == ["memory:fresh"]


def test_offboarding_records_the_operator_trail_then_removes_the_tenants_entries(client, make_tenant):
    gone = make_tenant("audit-gone")
    client.post("/v1/memories", json={"content": "x"}, headers=gone.headers())
    with system_session() as session:
        record_operator(
            session, action="tenant.offboard", tenant_name=gone.name, actor="operator", detail={"job": "j1"}
        )
        assert purge_tenant_audit(session, tenant_id=gone.tenant_id) == 1
    with system_session() as session:
        assert (
            session.execute(
                text("SELECT count(*) FROM audit_entries WHERE tenant_id = :t"), {"t": gone.tenant_id}
            ).scalar()
            == 0
        )
        trail = session.execute(
            text("SELECT action, actor, detail FROM operator_audit WHERE tenant_name = :n"), {"n": gone.name}
        ).one()
    assert trail == ("tenant.offboard", "operator", {"job": "j1"})
    columns = {
        c
        for (c,) in get_engine()
        .connect()
        .execute(text("SELECT column_name FROM information_schema.columns WHERE table_name = 'operator_audit'"))
    }
    assert "tenant_id" not in columns


@pytest.fixture
def api_with_log(stack):  # type: ignore[no-untyped-def]
    """A real API over TCP whose log (JSON lines, with request ids) the test reads."""
    from api.serve.embedded import free_port

    port = free_port()
    log = Path(tempfile.mkstemp(prefix="engram-audit-api-", suffix=".log", dir="/tmp")[1])
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "api.main:app", "--port", str(port), "--log-level", "warning"],
            cwd=REPO,
            env={**os.environ, **stack.env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while not answers_health(url):
            assert process.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield url, log
    finally:
        stop_process(process, timeout=30)
        log.unlink(missing_ok=True)


def _logged_request_ids(log: Path, path: str) -> set[str]:
    ids = set()
    for line in log.read_text(errors="replace").splitlines():
        try:
            record_ = json.loads(line)
        except ValueError:
            continue
        if path in str(record_.get("message", "")) and record_.get("request_id"):
            ids.add(record_["request_id"])
    return ids


def test_cli_and_mcp_writes_appear_with_their_request_ids(stack, client, tenant, api_with_log):
    url, log = api_with_log
    env = {**os.environ, **stack.env, "ENGRAM_API_KEY": tenant.admin_key}
    saved = subprocess.run(
        [
            sys.executable,
            "-m",
            "api.cli",
            "memory",
            "--url",
            url,
            "save",
            "from the cli",
            "--id",
            "cli-1",
            "--format",
            "json",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert saved.returncode == 0, saved.stderr

    # An MCP tool call over the streamable-HTTP endpoint, with the agent's own request id.
    mcp_headers = {
        "Authorization": f"Bearer {tenant.admin_key}",
        "Accept": "application/json, text/event-stream",
        "X-Request-ID": "mcp-call-7",
    }
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "save_memory", "arguments": {"content": "from an agent", "id": "mcp-1"}},
    }
    answer = httpx.post(f"{url}/mcp", json=call, headers=mcp_headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert not answer.json()["result"].get("isError"), answer.text

    listed = subprocess.run(
        [sys.executable, "-m", "api.cli", "audit", "--url", url, "--format", "json", "--action", "memory.save"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    by_target = {e["target"]: e for e in json.loads(listed.stdout)["entries"]}
    assert by_target["memory:mcp-1"]["request_id"] == "mcp-call-7"
    cli_request = by_target["memory:cli-1"]["request_id"]
    assert cli_request and cli_request in _logged_request_ids(log, "POST /v1/memories")

    table = subprocess.run(
        [sys.executable, "-m", "api.cli", "audit", "--url", url, "--limit", "1"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert table.returncode == 0 and "memory.save" in table.stdout and "memory:mcp-1" in table.stdout


def test_operator_actions_on_a_tenant_are_in_its_log_and_the_operators_trail(client, make_tenant):
    from tests.helpers.api import OPERATOR_KEY

    tenant = make_tenant("audit-op")
    operator = {"Authorization": f"Bearer {OPERATOR_KEY}"}
    body = {"state": "suspended", "quotas": {"max_memories": 10}}
    assert client.patch(f"/v1/tenants/{tenant.name}", json=body, headers=operator).status_code == 200
    assert client.patch(f"/v1/tenants/{tenant.name}", json={"state": "active"}, headers=operator).status_code == 200
    entries = _entries(client, tenant)
    assert [(e["action"], e["actor"]["user"]) for e in reversed(entries)] == [
        ("tenant.suspended", "operator"),
        ("tenant.quotas", "operator"),
        ("tenant.resumed", "operator"),
    ]
    assert client.delete(f"/v1/tenants/{tenant.name}", headers=operator).status_code == 202
    with system_session() as session:
        trail = (
            session.execute(
                text("SELECT action FROM operator_audit WHERE tenant_name = :n ORDER BY id"), {"n": tenant.name}
            )
            .scalars()
            .all()
        )
    assert trail == ["tenant.suspended", "tenant.quotas", "tenant.resumed", "tenant.offboard"]
