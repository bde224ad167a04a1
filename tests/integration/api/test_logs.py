"""Logs: JSON lines off a terminal, the request id from the API into the worker's lines of the job it caused,
and no key, password or secret in the logs of a full run (API and worker saving with keys, a datasource
with a password)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys

import httpx
import pytest

from api.serve.embedded import free_port
from core.logging import add_secret, configure_logging, make_formatter, redact, request_id_scope
from tests.helpers.api import OPERATOR_KEY
from tests.helpers.catalog import sqlite_source
from tests.helpers.processes import REPO, WorkerProcess, wait_for

DS_PASSWORD = "Tiger-Secret-Pw-4711"


@pytest.mark.parametrize(
    ("text", "leaked"),
    [
        ("Authorization: Bearer egk_abcDEF123-_xyz", "egk_abcDEF123-_xyz"),
        ("key egop_lOvnFeMLGhGszv8ln2SFyUjaah0rkkMOtBpHpEjI6bE issued", "lOvnFeMLGhGszv8"),
        ("connect postgresql+psycopg://scott:tiger99@db:5432/shop failed", "tiger99"),
        ("dsn host=db user=scott password=tiger99 dbname=shop", "tiger99"),
        ('{"secret_key": "c2VjcmV0LXZhbHVl"}', "c2VjcmV0LXZhbHVl"),
        ("redis://:hunter2@cache:6379/0", "hunter2"),
    ],
)
def test_redact_removes_keys_tokens_and_passwords(text, leaked):
    assert leaked not in redact(text)


def test_configured_secrets_are_redacted_as_literals_and_lines_are_json():
    add_secret("a-configured-secret-value")
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(make_formatter(process="test", json_lines=True))
    from core.logging import ContextFilter

    handler.addFilter(ContextFilter())
    logger = logging.getLogger("engram.test.redact")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with request_id_scope("req-77"):
            logger.warning("value is %s", "a-configured-secret-value", extra={"route": "/x"})
        try:
            raise ValueError("password=swordfish in a traceback")
        except ValueError:
            logger.exception("failed")
    finally:
        logger.removeHandler(handler)
    first, second = (json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{"))
    assert first["message"] == "value is ***" and first["request_id"] == "req-77" and first["route"] == "/x"
    assert first["level"] == "WARNING" and first["logger"] == "engram.test.redact" and first["process"] == "test"
    assert "request_id" not in second and "swordfish" not in second["exc_info"]


def test_readable_lines_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    configure_logging(process="test", stream=stream, level="INFO")
    try:
        with request_id_scope("req-tty"):
            logging.getLogger("engram.test.tty").info("hello %s", "there")
    finally:  # the rest of the suite logs as before
        root.handlers[:] = handlers
        root.setLevel(level)
    line = stream.getvalue().strip()
    assert not line.startswith("{") and "INFO" in line and "hello there" in line and "request_id=req-tty" in line


def test_a_full_run_logs_request_ids_into_jobs_and_never_a_secret(stack, tmp_path):
    # Local datasource policy: the API tries to reach the loopback source instead of refusing it unseen.
    extra = {"ENGRAM_LOG_LEVEL": "DEBUG", "ENGRAM_ACCESS_LOG": "true", "ENGRAM_DATASOURCE_POLICY": "local"}
    env = {**os.environ, **stack.env, **extra}
    port = free_port()
    api_log = tmp_path / "api.log"
    worker = WorkerProcess(stack, extra_env=extra)
    with open(api_log, "wb") as out:
        api = subprocess.Popen(
            [sys.executable, "-m", "api.cli", "api", "--port", str(port), "--no-migrate"],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(f"{base}/healthz"), timeout=60)
        with httpx.Client(base_url=base, timeout=30) as http:
            admin = _tenant_key(stack)
            headers = {"Authorization": f"Bearer {admin}"}
            member = http.post("/v1/keys", json={"user": "m@example.com", "role": "member"}, headers=headers)
            member_key = member.json()["api_key"]
            saved = http.post(
                "/v1/memories",
                json={"content": "log me by request id"},
                headers={**headers, "X-Request-ID": "logs-req-1"},
            )
            assert saved.status_code == 201, saved.text
            http.post(
                "/v1/memories", json={"content": "by a member"}, headers={"Authorization": f"Bearer {member_key}"}
            )
            # A PostgreSQL source given with a password (nothing listens there: the API refuses it after trying).
            url = f"postgresql://scott:{DS_PASSWORD}@127.0.0.1:{free_port()}/shop"
            refused = http.post("/v1/datasources", json={"name": "pw", "url": url}, headers=headers)
            assert refused.status_code == 422, refused.text
            with sqlite_source(tmp_path) as (sqlite_url, _):
                created = http.post("/v1/datasources", json={"name": "shop", "url": sqlite_url}, headers=headers)
            assert created.status_code == 201, created.text
            job = http.post("/v1/datasources/shop/ingest", json={}, headers={**headers, "X-Request-ID": "logs-req-2"})
            job_id = job.json()["job_id"]

            def ingested() -> bool:
                state = http.get(f"/v1/jobs/{job_id}", headers=headers).json()["state"]
                return state == "succeeded"

            wait_for(ingested, timeout=60)
            http.get("/metrics", headers={"Authorization": f"Bearer {OPERATOR_KEY}"})
            wait_for(lambda: "logs-req-1" in worker.log(), timeout=30)
    finally:
        api.terminate()
        api.wait(timeout=30)
        worker.stop()
    api_text, worker_text = api_log.read_text(), worker.log()
    everything = api_text + worker_text
    for secret in (admin, member_key, OPERATOR_KEY, stack.env["ENGRAM_SECRET_KEY"], DS_PASSWORD):
        assert secret not in everything, f"{secret[:8]}... leaked into the logs"
    api_lines = _json_lines(api_text)
    access = [line for line in api_lines if line.get("logger") == "engram.access"]
    save_line = next(line for line in access if line.get("request_id") == "logs-req-1")
    assert save_line["route"] == "/v1/memories" and save_line["status"] == 201
    worker_lines = _json_lines(worker_text)
    embed_lines = [line for line in worker_lines if "engram.job.embed" in line["message"]]
    assert any(line.get("request_id") == "logs-req-1" for line in embed_lines)
    assert any(line.get("request_id") == "logs-req-2" for line in worker_lines)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _tenant_key(stack) -> str:  # type: ignore[no-untyped-def]
    import uuid

    from core.db import system_session
    from core.tenancy.service import create_tenant

    with system_session() as session:
        return create_tenant(session, name=f"logs-{uuid.uuid4().hex[:8]}").api_key


def _json_lines(text: str) -> list[dict]:
    lines = []
    for raw in text.splitlines():
        if raw.startswith("{"):
            lines.append(json.loads(raw))
    assert lines, text[-2000:]
    return lines
