"""`engram tenant ...` (CONTRACT section 9): through a remote engram's REST API with the operator key
(`--url` / ENGRAM_URL), directly on the configured database, and refused in one line on a home that holds no
engram (creating nothing there)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import httpx

from tests.conftest import OPERATOR_KEY, REPO, make_temp_dir
from tests.live_api import running_api


def _engram(*args: str, env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [sys.executable, "-m", "api.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    if check:
        assert result.returncode == 0, f"{args}: {result.stdout}\n{result.stderr}"
    return result


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}


def test_tenant_commands_through_a_remote_api(stack):
    name = f"remote-{uuid.uuid4().hex[:8]}"
    with running_api(stack.env) as url:
        env = {**_clean_env(), "ENGRAM_URL": url, "ENGRAM_OPERATOR_KEY": OPERATOR_KEY}
        created = json.loads(_engram("tenant", "create", name, "--json", env=env).stdout)
        assert set(created) == {"tenant", "api_key"} and created["tenant"] == name
        listed = json.loads(_engram("tenant", "list", "--prefix", name, "--format", "json", env=env).stdout)
        assert [t["tenant"] for t in listed["tenants"]] == [name]
        again = _engram("tenant", "create", name, env=env, check=False)
        assert again.returncode == 1 and json.loads(again.stderr)["error"]["code"] == "conflict"
        # Without the operator key: one clear line, no call.
        keyless = _engram("tenant", "list", env={**_clean_env(), "ENGRAM_URL": url}, check=False)
        assert keyless.returncode != 0 and "operator key" in keyless.stderr
        wrong = _engram("tenant", "list", "--url", url, "--operator-key", "egk_not-it", env=_clean_env(), check=False)
        assert wrong.returncode == 1 and json.loads(wrong.stderr)["error"]["code"] in ("unauthorized", "forbidden")
        started = json.loads(_engram("tenant", "delete", name, "--yes", "--format", "json", env=env).stdout)
        assert started["tenant"] == name and started["job_id"]
        headers = {"Authorization": f"Bearer {created['api_key']}"}
        assert httpx.get(f"{url}/v1/memories", headers=headers).status_code == 401


def test_tenant_commands_on_the_configured_database(stack):
    """No serve and no URL: engram's own routes in the CLI's process, on ENGRAM_DATABASE_URL."""
    name = f"direct-{uuid.uuid4().hex[:8]}"
    env = {**_clean_env(), "ENGRAM_DATABASE_URL": stack.database_url, "ENGRAM_REDIS_URL": stack.redis_url,
           "ENGRAM_SECRET_KEY": stack.env["ENGRAM_SECRET_KEY"], "ENGRAM_HOME": str(stack.home)}  # fmt: skip
    created = json.loads(_engram("tenant", "create", name, "--json", "--max-datasources", "3", env=env).stdout)
    assert created["api_key"].startswith("egk_")
    shown = json.loads(_engram("tenant", "show", name, "--format", "json", env=env).stdout)
    assert shown["quotas"]["max_datasources"] == 3 and shown["usage"]["memories"] == 0
    _engram("tenant", "suspend", name, env=env)
    assert json.loads(_engram("tenant", "show", name, "--format", "json", env=env).stdout)["state"] == "suspended"


def test_a_home_without_engram_is_refused_in_one_line_and_left_untouched():
    base = make_temp_dir("engram-nohome-")
    try:
        home = base / "nothing-here"
        for args in (("list",), ("create", "acme", "--json"), ("show", "acme"), ("delete", "acme", "--yes")):
            result = _engram("tenant", *args, "--home", str(home), env=_clean_env(), check=False)
            assert result.returncode != 0
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1 and "no engram at" in lines[0], result.stderr
            assert "Traceback" not in result.stderr
        assert not home.exists()
    finally:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
