"""The TypeScript client (clients/typescript) run by the machine's Node against a real engram API process:
generated from the server's current OpenAPI document, type-checked by tsc, then save, search, list, get,
forget and typed errors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts.export_openapi import export
from tests.helpers.processes import running_api

CLIENT = Path(__file__).resolve().parents[3] / "clients" / "typescript"
NODE, NPM = shutil.which("node"), shutil.which("npm")

pytestmark = pytest.mark.skipif(NODE is None or NPM is None, reason="Node.js is not installed")


@pytest.fixture(scope="module")
def built_client(tmp_path_factory) -> Path:
    """A copy of the client whose types are generated from this checkout's spec, type-checked."""
    if not (CLIENT / "node_modules" / ".package-lock.json").exists():
        subprocess.run([NPM, "ci", "--no-audit", "--no-fund"], cwd=CLIENT, check=True, timeout=600)
    copy = tmp_path_factory.mktemp("ts-client")
    for part in ("src", "examples", "package.json", "tsconfig.json", "generate.mjs"):
        source = CLIENT / part
        (shutil.copytree if source.is_dir() else shutil.copy)(source, copy / part)
    (copy / "node_modules").symlink_to(CLIENT / "node_modules")
    export(copy / "openapi.json")
    for script in ("generate", "typecheck"):
        result = subprocess.run([NPM, "run", "-s", script], cwd=copy, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
    return copy


@pytest.fixture(scope="module")
def api_url(stack) -> Iterator[str]:  # type: ignore[no-untyped-def]
    with running_api(stack.env) as url:
        yield url


def test_quickstart_runs_against_a_real_engram(built_client, api_url, tenant):
    env = {**os.environ, "ENGRAM_URL": api_url, "ENGRAM_API_KEY": tenant.admin_key}
    result = subprocess.run(
        [NODE, "examples/quickstart.mjs"], cwd=built_client, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    lines = [line.split(" ", 1) for line in result.stdout.splitlines()]
    out: dict[str, list] = {}
    for name, value in lines:
        out.setdefault(name, []).append(json.loads(value))
    memory_id = out["saved"][0]["memory_id"]
    assert memory_id in [hit["id"] for hit in out["search"][0]]
    assert out["list"][0] == [memory_id]
    assert out["get"][0] == {"id": memory_id, "kind": "fact", "agent_id": "ts-quickstart"}
    assert out["forget"][0] == {"memory_id": memory_id, "status": "forgotten"}
    assert out["error"] == [
        {"status": 404, "code": "not_found"},
        {"status": 422, "code": "validation_error", "field": "importance"},
    ]
