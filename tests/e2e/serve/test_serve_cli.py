"""`engram serve` end to end on a bare home, the CLI against it, and a clean stop (CONTRACT section 1)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from api.serve.embedded import free_port
from tests.helpers.processes import make_temp_dir

REPO = Path(__file__).resolve().parents[3]


def _engram(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    if check:
        assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
    return result


@pytest.fixture(scope="module")
def served():  # type: ignore[no-untyped-def]
    """A real `engram serve` with embedded PostgreSQL and Redis under a fresh home."""
    home = make_temp_dir("engram-serve-")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    env["ENGRAM_HOME"] = str(home / "home")
    log = open(home / "serve.out", "w")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "-m", "api.cli", "serve", "--port", str(port), "--home", str(home / "home")],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    started = time.monotonic()
    output = ""
    while time.monotonic() - started < 60:
        output = (home / "serve.out").read_text()
        if "Press Ctrl-C" in output or process.poll() is not None:
            break
        time.sleep(0.2)
    assert "Press Ctrl-C" in output, output
    key = re.search(r"admin key \(shown once\): (\S+)", output).group(1)  # type: ignore[union-attr]
    info = {
        "process": process,
        "port": port,
        "home": home / "home",
        "env": env,
        "key": key,
        "output": output,
        "startup_seconds": time.monotonic() - started,
    }
    yield info
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    log.close()
    shutil.rmtree(home, ignore_errors=True)


def test_serve_prints_urls_and_answers_health(served):
    """Within 30 s the API answers /healthz and the terminal shows the API URL and the admin key."""
    assert served["startup_seconds"] < 30
    assert f"http://127.0.0.1:{served['port']}" in served["output"]
    assert "/dashboard" in served["output"] and served["key"].startswith("egk_")
    # One line says which datasources this single-machine server accepts.
    assert "datasources (local mode): loopback and private hosts" in served["output"]
    assert httpx.get(f"http://127.0.0.1:{served['port']}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"http://127.0.0.1:{served['port']}/readyz").status_code == 200


def test_cli_memory_commands_against_serve(served):
    env = {**served["env"], "ENGRAM_API_KEY": served["key"]}
    saved = json.loads(
        _engram("memory", "save", "orders.amount is in cents", "--tag", "units", "--format", "json", env=env).stdout
    )
    mid = saved["memory_id"]
    got = json.loads(_engram("memory", "get", mid, "--format", "json", env=env).stdout)
    assert got["content"] == "orders.amount is in cents" and got["tags"] == ["units"]
    listed = json.loads(_engram("memory", "list", "--format", "json", env=env).stdout)
    assert mid in [m["id"] for m in listed["memories"]]
    table = _engram("memory", "list", "--format", "table", env=env).stdout
    assert "CONTENT" in table and "orders.amount is in cents" in table
    forgotten = json.loads(_engram("memory", "forget", mid, "--reason", "test", "--format", "json", env=env).stdout)
    assert forgotten == {"memory_id": mid, "status": "forgotten"}
    missing = _engram("memory", "get", mid, "--format", "json", env=env, check=False)
    assert missing.returncode != 0 and json.loads(missing.stderr)["error"]["code"] == "not_found"


def test_tenant_create_while_serve_runs(served):
    result = _engram("tenant", "create", "acme", "--json", "--home", str(served["home"]), env=served["env"])
    body = json.loads(result.stdout)
    assert body["tenant"] == "acme" and body["api_key"].startswith("egk_")
    response = httpx.post(
        f"http://127.0.0.1:{served['port']}/v1/memories",
        json={"content": "acme's first memory"},
        headers={"Authorization": f"Bearer {body['api_key']}"},
    )
    assert response.status_code == 201 and response.json()["memory_id"] == "1"
    again = _engram("tenant", "create", "acme", "--json", "--home", str(served["home"]), env=served["env"], check=False)
    assert again.returncode != 0 and "already exists" in again.stderr


def test_cli_search_and_jobs_against_serve(served):
    env = {**served["env"], "ENGRAM_API_KEY": served["key"]}
    _engram("memory", "save", "the warehouse closes at six on fridays", "--format", "json", env=env)
    found = json.loads(_engram("search", "when does the warehouse close", "--format", "json", env=env).stdout)
    assert any("warehouse" in hit["text"] for hit in found["memories"])
    assert set(found["channels"]) == {"entity_bm25", "fulltext", "dense", "graph"}
    jobs = json.loads(_engram("jobs", "--format", "json", env=env).stdout)["jobs"]
    assert jobs and {"id", "kind", "state", "attempts"} <= set(jobs[0])
    shown = json.loads(_engram("jobs", "show", jobs[0]["id"], "--format", "json", env=env).stdout)
    assert shown["id"] == jobs[0]["id"]
    bad = _engram("search", "--mode", "typed", "--format", "json", env=env, check=False)
    assert bad.returncode != 0 and json.loads(bad.stderr)["error"]["code"] == "validation_error"


def test_tenant_commands_on_the_served_home(served):
    """`engram tenant ...` on a home that `serve` runs: REST calls with the home's operator key."""
    env, home = served["env"], str(served["home"])
    created = json.loads(_engram("tenant", "create", "globex", "--json", "--max-memories", "1", "--home", home,
                                 env=env).stdout)  # fmt: skip
    key = {"Authorization": f"Bearer {created['api_key']}"}
    url = f"http://127.0.0.1:{served['port']}"
    shown = json.loads(_engram("tenant", "show", "globex", "--format", "json", "--home", home, env=env).stdout)
    assert shown["state"] == "active" and shown["quotas"]["max_memories"] == 1
    _engram("tenant", "suspend", "globex", "--home", home, env=env)
    assert httpx.get(f"{url}/v1/memories", headers=key).json()["error"]["code"] == "tenant_suspended"
    table = _engram("tenant", "list", "--state", "suspended", "--home", home, env=env).stdout
    assert "globex" in table and "suspended" in table
    _engram("tenant", "resume", "globex", "--home", home, env=env)
    assert httpx.get(f"{url}/v1/memories", headers=key).status_code == 200
    _engram("tenant", "quota", "globex", "--max-memories", "none", "--requests-per-minute", "600", "--home", home,
            env=env)  # fmt: skip
    quotas = json.loads(_engram("tenant", "quota", "globex", "--format", "json", "--home", home, env=env).stdout)
    assert quotas["max_memories"] is None and quotas["requests_per_minute"] == 600
    bad = _engram("tenant", "quota", "globex", "--max-memories", "lots", "--home", home, env=env, check=False)
    assert bad.returncode != 0 and "whole number" in bad.stderr
    started = json.loads(_engram("tenant", "delete", "globex", "--yes", "--format", "json", "--home", home,
                                 env=env).stdout)  # fmt: skip
    assert started["job_id"]
    assert httpx.get(f"{url}/v1/memories", headers=key).status_code == 401
    missing = _engram("tenant", "show", "globex", "--home", home, env=env, check=False)
    assert missing.returncode != 0 and json.loads(missing.stderr)["error"]["code"] == "not_found"


def test_sigterm_stops_everything(served):
    """SIGTERM stops the API, worker, beat, PostgreSQL and Redis that serve started: nothing is left."""
    process = served["process"]
    tree = psutil.Process(process.pid).children(recursive=True)
    runtime = json.loads((served["home"] / "runtime.json").read_text())
    assert len(tree) >= 5, [p.cmdline() for p in tree]
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in tree):
        time.sleep(0.2)
    alive = [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert alive == [], [p.cmdline() for p in alive]
    assert not (served["home"] / "runtime.json").exists()
    assert runtime["database_url"].startswith("postgresql+psycopg://postgres:")  # the embedded one needs a password
    assert runtime["datasource_policy"] == "local"
