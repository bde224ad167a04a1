"""Every database wait is bounded: a lock held elsewhere, a statement over budget and a database that stops
answering all end a request with 503 + Retry-After within its budget, never a hang."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tests.helpers.processes import running_api
from tests.helpers.proxy import FreezableProxy

# The API's budget (db_statement_timeout_seconds + the client's margin) and slack for a loaded machine.
BUDGET_SECONDS = 4.5
SLACK_SECONDS = 2.5


def test_the_app_role_has_statement_lock_and_idle_bounds(stack):
    from core.db import APP_ROLE, get_owner_engine

    with get_owner_engine().connect() as connection:
        settings = connection.execute(
            text(
                "SELECT unnest(s.setconfig) FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole "
                "WHERE r.rolname = :role"
            ),
            {"role": APP_ROLE},
        ).scalars()
        names = {setting.split("=")[0] for setting in settings}
    assert {"statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout"} <= names


def test_a_lock_held_elsewhere_ends_in_a_503_within_the_budget(client, tenant):
    from core.db import system_connection

    holding = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with system_connection() as connection:
            connection.execute(text("SELECT 1 FROM tenants WHERE id = :t FOR UPDATE"), {"t": tenant.tenant_id})
            holding.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert holding.wait(10)
        started = time.monotonic()
        response = client.post("/v1/memories", json={"content": "blocked"}, headers=tenant.headers())
        elapsed = time.monotonic() - started
    finally:
        release.set()
        holder.join()
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"]
    assert "busy" in response.json()["error"]["message"]
    print(f"lock wait answered in {elapsed:.2f} s")
    assert elapsed < BUDGET_SECONDS + SLACK_SECONDS


@pytest.mark.slow
def test_a_database_that_stops_answering_gets_503s_not_a_hang(stack, tenant):
    """The API reaches PostgreSQL through a proxy that then stops relaying (as a SIGSTOPped server):
    requests already holding connections and new ones all get 503 + Retry-After within the budget, and
    once the database answers again saves succeed."""
    url = make_url(stack.database_url)
    proxy = FreezableProxy(upstream_host=url.host or "127.0.0.1", upstream_port=url.port or 5432)
    proxied = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    try:
        with running_api({**stack.env, "ENGRAM_DATABASE_URL": proxied}) as api:
            with httpx.Client(base_url=api, headers=tenant.headers(), timeout=30) as http:
                for i in range(4):  # warm: the pool holds live connections when the database freezes
                    assert http.post("/v1/memories", json={"content": f"before {i}"}).status_code == 201
            proxy.freeze()
            answers: list[tuple[int, str | None, float]] = []

            def save(n: int) -> None:
                with httpx.Client(base_url=api, headers=tenant.headers(), timeout=30) as http:
                    started = time.monotonic()
                    response = http.post("/v1/memories", json={"content": f"during {n} {uuid.uuid4().hex}"})
                    elapsed = time.monotonic() - started
                    answers.append((response.status_code, response.headers.get("Retry-After"), elapsed))

            threads = [threading.Thread(target=save, args=(n,)) for n in range(8)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            proxy.thaw()
            slowest = max(a[2] for a in answers)
            print(f"frozen database: {len(answers)} answers, slowest {slowest:.2f} s")
            assert [a[0] for a in answers] == [503] * 8, answers
            assert all(a[1] for a in answers)
            assert slowest < BUDGET_SECONDS + SLACK_SECONDS + 3.0  # a new connection's connect_timeout (3 s)
            with httpx.Client(base_url=api, headers=tenant.headers(), timeout=30) as http:
                deadline = time.monotonic() + 30
                while (status := http.post("/v1/memories", json={"content": "after"}).status_code) != 201:
                    assert status == 503 and time.monotonic() < deadline
                    time.sleep(0.5)
    finally:
        proxy.close()
