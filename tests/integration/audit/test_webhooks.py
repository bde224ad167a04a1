"""Webhooks (CONTRACT section 10) over the real stack: events committed with their change, delivered by a real
worker (retries scheduled by a real beat) to real HTTP receivers on loopback that verify every delivery with
the `standardwebhooks` package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import text
from standardwebhooks.webhooks import Webhook as Verifier
from standardwebhooks.webhooks import WebhookVerificationError

from core.db import system_session, tenant_session
from tests.helpers.processes import REPO, WorkerProcess, make_temp_dir, stop_process, wait_for

WEBHOOK_ENV = {
    "ENGRAM_WEBHOOK_TIMEOUT_SECONDS": "1",
    "ENGRAM_WEBHOOK_RETRY_BASE_SECONDS": "0.3",
    "ENGRAM_WEBHOOK_RETRY_MAX_SECONDS": "2",
    "ENGRAM_WEBHOOK_MAX_ATTEMPTS": "50",
    "ENGRAM_WEBHOOK_DISABLE_AFTER_SECONDS": "8",
    "ENGRAM_WEBHOOK_SWEEP_INTERVAL_SECONDS": "0.3",
    "ENGRAM_WEBHOOK_JOB_SECONDS": "5",
}


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    verified: Any = None  # the parsed body when the signature verified, else None


@dataclass
class Receiver:
    """A real HTTP endpoint on loopback: answers `status` (after `fail_first` 500s), or hangs `hang` seconds."""

    url: str = ""
    secret: str | None = None
    status: int = 200
    fail_first: int = 0
    hang: float = 0.0
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    in_flight: int = 0
    max_in_flight: int = 0

    def handle(self, headers: dict[str, str], body: bytes) -> int:
        verified = None
        if self.secret:
            try:
                verified = Verifier(self.secret).verify(body, headers)
            except WebhookVerificationError:
                verified = None
        with self.lock:
            self.received.append(Received(headers=headers, body=body, verified=verified))
            attempt = len(self.received)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.hang:
            time.sleep(self.hang)
        with self.lock:
            self.in_flight -= 1
        return 500 if attempt <= self.fail_first else self.status

    def events(self, type_: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            bodies = [r.verified for r in self.received if r.verified is not None]
        return [b for b in bodies if type_ is None or b["type"] == type_]


@contextmanager
def serving() -> Iterator[Receiver]:
    """A Receiver listening on a free loopback port until the block ends."""
    state = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("content-length", 0)))
            status = state.handle({k.lower(): v for k, v in self.headers.items()}, body)
            try:
                self.send_response(status)
                self.end_headers()
            except OSError:  # the sender timed out and went away
                pass

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with serving() as state:
        yield state


@pytest.fixture(scope="module")
def delivering(stack) -> Iterator[None]:  # type: ignore[no-untyped-def]
    """A worker and beat with short webhook timings, for this module only."""
    worker = WorkerProcess(stack, extra_env=WEBHOOK_ENV, concurrency=3)
    beat_dir = make_temp_dir("engram-beat-")
    env = {**os.environ, **stack.env, **WEBHOOK_ENV, "ENGRAM_HOME": str(beat_dir)}
    with open(beat_dir / "beat.log", "wb") as log:
        beat = subprocess.Popen([sys.executable, "-m", "api.cli", "beat"], cwd=REPO, env=env, stdout=log, stderr=log)
    try:
        yield
    finally:
        stop_process(beat)
        worker.stop()
        import shutil

        shutil.rmtree(beat_dir, ignore_errors=True)


def _register(client, tenant, receiver: Receiver, events: list[str] | None = None) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    body = {
        "url": receiver.url,
        "events": events or ["memory.created", "memory.updated", "memory.forgotten", "memory.purged"],
    }
    response = client.post("/v1/webhooks", json=body, headers=tenant.headers())
    assert response.status_code == 201, response.text
    created = response.json()
    receiver.secret = created["secret"]
    return created


def _deliveries(client, tenant, webhook_id: str) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    response = client.get(f"/v1/webhooks/{webhook_id}/deliveries", params={"limit": 200}, headers=tenant.headers())
    assert response.status_code == 200, response.text
    return response.json()["deliveries"]


def test_events_are_delivered_signed_per_standard_webhooks(delivering, client, tenant, receiver):
    hook = _register(client, tenant, receiver)
    assert hook["secret"].startswith("whsec_") and hook["events"][0] == "memory.created"
    listed = client.get(f"/v1/webhooks/{hook['id']}", headers=tenant.headers()).json()
    assert "secret" not in listed and listed["state"] == "enabled"

    assert client.post("/v1/memories", json={"content": "a", "id": "w1"}, headers=tenant.headers()).status_code == 201
    assert client.patch("/v1/memories/w1", json={"content": "b"}, headers=tenant.headers()).status_code == 200
    assert client.delete("/v1/memories/w1", headers=tenant.headers()).status_code == 200
    assert client.delete("/v1/memories/w1?purge=true", headers=tenant.headers()).status_code == 200
    wait_for(lambda: len(receiver.events()) == 4)
    assert [e["type"] for e in receiver.events()] == [
        "memory.created",
        "memory.updated",
        "memory.forgotten",
        "memory.purged",
    ]
    assert all(e["data"]["memory_id"] == "w1" and e["timestamp"] for e in receiver.events())
    assert all(r.verified is not None for r in receiver.received)  # every one verified with the secret
    headers = receiver.received[0].headers
    assert headers["webhook-id"].startswith("msg_") and headers["webhook-timestamp"].isdigit()

    deliveries = _deliveries(client, tenant, hook["id"])
    assert {d["id"] for d in deliveries} == {r.headers["webhook-id"] for r in receiver.received}
    assert all(d["state"] == "succeeded" and [a["status"] for a in d["attempts"]] == [200] for d in deliveries)

    # Rotation: a new secret, shown once; the old one no longer verifies what follows.
    rotated = client.patch(f"/v1/webhooks/{hook['id']}", json={"rotate_secret": True}, headers=tenant.headers()).json()
    assert rotated["secret"] != hook["secret"]
    receiver.secret = rotated["secret"]
    client.post("/v1/memories", json={"content": "c", "id": "w2"}, headers=tenant.headers())
    wait_for(lambda: len(receiver.received) == 5)
    assert receiver.received[-1].verified is not None
    with pytest.raises(WebhookVerificationError):
        Verifier(hook["secret"]).verify(receiver.received[-1].body, receiver.received[-1].headers)
    actions = [e["action"] for e in client.get("/v1/audit", headers=tenant.headers()).json()["entries"]]
    assert "webhook.create" in actions and "webhook.rotate_secret" in actions


def test_a_failing_receiver_gets_retries_with_the_same_id_until_it_recovers(delivering, client, tenant, receiver):
    receiver.fail_first = 3
    hook = _register(client, tenant, receiver)
    client.post("/v1/memories", json={"content": "retry me", "id": "r1"}, headers=tenant.headers())
    client.post("/v1/memories", json={"content": "and me", "id": "r2"}, headers=tenant.headers())
    wait_for(lambda: len(receiver.events("memory.created")) >= 5, timeout=60)
    wait_for(lambda: all(d["state"] == "succeeded" for d in _deliveries(client, tenant, hook["id"])), timeout=60)
    ids = [r.headers["webhook-id"] for r in receiver.received]
    first = ids[0]
    assert ids[:4] == [first] * 4  # the same message on every retry
    deliveries = {d["id"]: d for d in _deliveries(client, tenant, hook["id"])}
    assert [a["status"] for a in deliveries[first]["attempts"]] == [500, 500, 500, 200]
    assert len(deliveries) == 2 and set(ids) == set(deliveries)  # nothing lost, nothing invented
    memory_ids = [e["data"]["memory_id"] for e in receiver.events()]
    assert memory_ids[:4] == ["r1"] * 4 and "r2" in memory_ids
    assert client.get(f"/v1/webhooks/{hook['id']}", headers=tenant.headers()).json()["failing_since"] is None


def test_a_rolled_back_save_sends_nothing(delivering, client, tenant, receiver):
    from core.memories.schemas import SaveMemoryIn
    from core.memories.service import save_memory
    from core.tenancy.service import authenticate

    hook = _register(client, tenant, receiver)
    with system_session() as session:
        caller = authenticate(session, api_key=tenant.admin_key)
    with pytest.raises(RuntimeError), tenant_session(tenant.tenant_id) as session:
        item = SaveMemoryIn(content="never committed", id="ghost")
        save_memory(session, caller=caller, item=item, action="memory.save")
        raise RuntimeError("the request failed after the save")
    client.post("/v1/memories", json={"content": "committed", "id": "real"}, headers=tenant.headers())
    wait_for(lambda: len(receiver.events()) == 1)
    time.sleep(1.0)  # a sweep or two: a ghost event would have gone out by now
    assert [e["data"]["memory_id"] for e in receiver.events()] == ["real"]
    assert [d["data"]["memory_id"] for d in _deliveries(client, tenant, hook["id"])] == ["real"]


def test_a_hanging_receiver_delays_nothing_but_its_own_deliveries(delivering, client, make_tenant, receiver):
    slow_tenant, other = make_tenant("wh-slow"), make_tenant("wh-other")
    receiver.hang = 30.0  # far past the delivery timeout
    _register(client, slow_tenant, receiver)
    with serving() as healthy:
        healthy.hang = 0.2  # slow but within the timeout: shows one delivery at a time per webhook
        _register(client, other, healthy)
        for i in range(5):
            saved = client.post("/v1/memories", json={"content": f"s{i}"}, headers=slow_tenant.headers())
            assert saved.status_code == 201  # a save never waits on a receiver
        wait_for(lambda: len(receiver.received) >= 1)  # a worker is now held by the hanging receiver
        for i in range(4):
            client.post("/v1/memories", json={"content": f"o{i}", "id": f"o{i}"}, headers=other.headers())
        wait_for(lambda: len(healthy.events()) == 4, timeout=20)
        assert sorted(e["data"]["memory_id"] for e in healthy.events()) == ["o0", "o1", "o2", "o3"]
        assert healthy.max_in_flight == 1
    pending = [
        d for d in _deliveries(client, slow_tenant, _only_webhook(client, slow_tenant)) if d["state"] == "pending"
    ]
    assert pending and all(a["error"] == "timed out" for d in pending for a in d["attempts"])


def _only_webhook(client, tenant) -> str:  # type: ignore[no-untyped-def]
    (hook,) = client.get("/v1/webhooks", headers=tenant.headers()).json()["webhooks"]
    return str(hook["id"])


def test_a_webhook_failing_for_the_configured_time_is_disabled_and_the_log_says_so(
    delivering, client, tenant, receiver
):
    receiver.status = 503
    hook = _register(client, tenant, receiver)
    client.post("/v1/memories", json={"content": "x", "id": "d1"}, headers=tenant.headers())
    url = f"/v1/webhooks/{hook['id']}"
    wait_for(lambda: client.get(url, headers=tenant.headers()).json()["state"] == "disabled", timeout=60)
    disabled = client.get(url, headers=tenant.headers()).json()
    assert "HTTP 503" in disabled["disabled_reason"]
    entries = client.get("/v1/audit", params={"action": "webhook.disabled"}, headers=tenant.headers()).json()["entries"]
    assert [(e["target"], e["actor"]["user"]) for e in entries] == [(f"webhook:{hook['id']}", "system")]
    tried = len(receiver.received)
    client.post("/v1/memories", json={"content": "y", "id": "d2"}, headers=tenant.headers())
    time.sleep(1.5)
    assert len(receiver.received) == tried  # a disabled webhook gets nothing
    # Enabled again (receiver fixed): what was pending goes out.
    receiver.status = 200
    assert client.patch(url, json={"enabled": True}, headers=tenant.headers()).json()["state"] == "enabled"
    wait_for(lambda: all(d["state"] == "succeeded" for d in _deliveries(client, tenant, hook["id"])), timeout=30)


def test_a_failed_ingest_tells_job_failed_and_ingest_failed(delivering, client, tenant, receiver, tmp_path):
    hook = _register(client, tenant, receiver, events=["job.failed", "ingest.failed", "ingest.succeeded"])
    import sqlite3

    source = tmp_path / "shop.db"
    sqlite3.connect(source).executescript("CREATE TABLE orders (id INTEGER PRIMARY KEY);").close()
    assert (
        client.post(
            "/v1/datasources", json={"name": "shop", "url": f"sqlite:///{source}"}, headers=tenant.headers()
        ).status_code
        == 201
    )
    job = client.post("/v1/datasources/shop/ingest", headers=tenant.headers()).json()["job_id"]
    wait_for(lambda: len(receiver.events("ingest.succeeded")) == 1, timeout=60)
    assert receiver.events("ingest.succeeded")[0]["data"] == {"job_id": job, "datasource": "shop"}
    source.unlink()
    failed_job = client.post("/v1/datasources/shop/ingest", headers=tenant.headers()).json()["job_id"]
    wait_for(lambda: receiver.events("ingest.failed") and receiver.events("job.failed"), timeout=60)
    assert receiver.events("job.failed")[0]["data"]["job_id"] == failed_job
    assert receiver.events("ingest.failed")[0]["data"]["datasource"] == "shop"
    assert client.post(f"/v1/jobs/{failed_job}/retry", headers=tenant.headers()).status_code == 202
    retried = client.get("/v1/audit", params={"action": "job"}, headers=tenant.headers()).json()["entries"]
    assert [(e["action"], e["target"]) for e in retried] == [("job.retry", f"job:{failed_job}")]
    assert {d["type"] for d in _deliveries(client, tenant, hook["id"])} == {
        "ingest.succeeded",
        "ingest.failed",
        "job.failed",
    }


def test_a_thousand_item_batch_writes_its_events_in_bulk(delivering, client, tenant, receiver):
    hook = _register(client, tenant, receiver, events=["memory.created"])
    items = [{"content": f"bulk {i}"} for i in range(1000)]
    assert client.post("/v1/memories:batch", json={"items": items}, headers=tenant.headers()).status_code == 200
    with tenant_session(tenant.tenant_id) as session:
        jobs = session.execute(text("SELECT count(*) FROM jobs WHERE kind = 'webhook'")).scalar()
        deliveries = session.execute(text("SELECT count(*) FROM webhook_deliveries")).scalar()
        entries = session.execute(text("SELECT count(*) FROM audit_entries WHERE action = 'memory.save'")).scalar()
    assert (deliveries, entries) == (1000, 1000) and jobs <= 2  # one job for the batch (a follow-up at most)
    wait_for(lambda: len({r.headers["webhook-id"] for r in receiver.received}) == 1000, timeout=120)
    seen, cursor = [], None
    while True:
        params = {"limit": 200, **({"cursor": cursor} if cursor else {})}
        page = client.get(f"/v1/webhooks/{hook['id']}/deliveries", params=params, headers=tenant.headers()).json()
        seen += [d["id"] for d in page["deliveries"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert len(seen) == len(set(seen)) == 1000


def test_webhook_input_is_checked(client, tenant, member_key, monkeypatch):
    member = member_key()
    good = {"url": "http://127.0.0.1:9/hook", "events": ["memory.created"]}
    assert client.post("/v1/webhooks", json=good, headers=tenant.headers(member)).status_code == 403
    cases = [
        ({**good, "events": ["memory.exploded"]}, "events.0"),
        ({**good, "events": []}, "events"),
        ({**good, "url": "ftp://example.com/x"}, "url"),
        ({**good, "url": "http://user:pw@127.0.0.1/x"}, "url"),
        ({**good, "surprise": 1}, "surprise"),
        ({"events": ["memory.created"]}, "url"),
    ]
    for body, field_ in cases:
        response = client.post("/v1/webhooks", json=body, headers=tenant.headers())
        assert response.status_code == 422, (body, response.text)
        assert response.json()["error"]["field"] == field_, body
    assert client.get("/v1/webhooks/wh_nope", headers=tenant.headers()).status_code == 404
    assert client.patch("/v1/webhooks/wh_nope", json={}, headers=tenant.headers()).status_code == 404

    # Hosted mode refuses loopback, private, link-local and metadata hosts, as for datasources.
    from core.config import reset_settings_cache

    monkeypatch.setenv("ENGRAM_DATASOURCE_POLICY", "hosted")
    reset_settings_cache()
    try:
        for url in ("http://127.0.0.1/x", "http://10.1.2.3/x", "http://169.254.169.254/latest", "http://[::1]/x"):
            response = client.post("/v1/webhooks", json={**good, "url": url}, headers=tenant.headers())
            assert response.status_code == 422 and "not allowed" in response.json()["error"]["message"], url
    finally:
        monkeypatch.setenv("ENGRAM_DATASOURCE_POLICY", "local")
        reset_settings_cache()
    created = client.post("/v1/webhooks", json=good, headers=tenant.headers())
    assert created.status_code == 201
    hook_id = created.json()["id"]
    for params, status, field_ in (
        ({"limit": 0}, 422, "limit"),
        ({"cursor": "not-a-cursor"}, 400, "cursor"),
        ({"state": "lost"}, 422, "state"),
    ):
        response = client.get(f"/v1/webhooks/{hook_id}/deliveries", params=params, headers=tenant.headers())
        assert response.status_code == status and response.json()["error"]["field"] == field_, response.text
    for body, field_ in (({"enabled": "yes"}, "enabled"), ({"rotate_secret": 1}, "rotate_secret"), ({"x": 1}, "x")):
        response = client.patch(f"/v1/webhooks/{hook_id}", json=body, headers=tenant.headers())
        assert response.status_code == 422 and response.json()["error"]["field"] == field_, response.text
    assert [w["id"] for w in client.get("/v1/webhooks", headers=tenant.headers()).json()["webhooks"]] == [hook_id]
    assert client.delete(f"/v1/webhooks/{hook_id}", headers=tenant.headers()).json() == {"id": hook_id, "deleted": True}
    assert client.get("/v1/webhooks", headers=tenant.headers()).json()["webhooks"] == []
    stored = json.dumps(client.get("/v1/audit", headers=tenant.headers()).json())
    assert "webhook.create" in stored and "webhook.delete" in stored and "whsec_" not in stored


def test_prune_removes_finished_deliveries_past_retention(client, tenant, receiver):
    from core.config import get_settings
    from core.lifecycle.prune import run_prune
    from core.webhooks.service import emit_many

    hook = _register(client, tenant, receiver, events=["quota.exceeded"])
    with tenant_session(tenant.tenant_id) as session:
        emit_many(session, tenant_id=tenant.tenant_id, events=[("quota.exceeded", {"quota": "max_memories"})] * 2)
    with tenant_session(tenant.tenant_id) as session:
        old, kept = session.execute(text("SELECT id FROM webhook_deliveries ORDER BY id")).scalars().all()
        backdate = "UPDATE webhook_deliveries SET state = 'succeeded', finished_at = :at WHERE id = :d"
        session.execute(text(backdate), {"d": old, "at": datetime.now(UTC) - timedelta(days=400)})
    with system_session() as session:
        assert run_prune(session, settings=get_settings())["webhook_deliveries_removed"] >= 1
    remaining = _deliveries(client, tenant, hook["id"])
    assert [d["id"] for d in remaining] == [kept]  # pending, or delivered since by a running worker
    assert remaining[0]["data"] == {"quota": "max_memories"}


def test_a_named_host_is_resolved_checked_and_connected_to_by_address(delivering, client, tenant, receiver):
    port = receiver.url.split(":")[2].split("/")[0]
    receiver.url = f"http://localhost:{port}/hook"
    hook = _register(client, tenant, receiver, events=["memory.created"])
    client.post("/v1/memories", json={"content": "by name", "id": "named"}, headers=tenant.headers())
    wait_for(lambda: receiver.events(), timeout=30)
    assert receiver.received[0].headers["host"] == f"localhost:{port}"  # the name, though sent to an address
    assert receiver.events()[0]["data"]["memory_id"] == "named"
    assert _deliveries(client, tenant, hook["id"])[0]["state"] == "succeeded"


def test_pinned_requests_keep_the_name_for_host_and_tls():
    import ipaddress

    from core.webhooks.urls import pinned_request

    v4, v6 = ipaddress.ip_address("93.184.215.14"), ipaddress.ip_address("2606:2800:21f:cb07:6820:80da:af6b:8b2c")
    assert pinned_request("https://hooks.example.com/x?a=1", v4) == (
        "https://93.184.215.14/x?a=1",
        {"host": "hooks.example.com"},
        {"sni_hostname": "hooks.example.com"},
    )
    assert pinned_request("http://hooks.example.com:8080/x", v6) == (
        "http://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:8080/x",
        {"host": "hooks.example.com:8080"},
        {},
    )
    assert pinned_request("http://127.0.0.1:9/x", ipaddress.ip_address("127.0.0.1")) == ("http://127.0.0.1:9/x", {}, {})
