"""deploy/k8s/base, checked offline: every built-in resource against the Kubernetes schemas bundled with
kubernetes-validate (strict: an unknown field fails), and the rules of this deployment as a table over the
rendered resources (probes, resources, secrets as deploy/README.md describes them, a KEDA ScaledObject per
lane on the Redis list its Celery queue is)."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from core.config import Settings
from core.jobs.lanes import LANES, QUEUES
from tests.helpers.processes import REPO

BASE = REPO / "deploy" / "k8s" / "base"
K8S_VERSION = "1.30.0"
CRDS = {("keda.sh/v1alpha1", "ScaledObject"), ("keda.sh/v1alpha1", "TriggerAuthentication")}


def _kustomization() -> dict[str, Any]:
    return yaml.safe_load((BASE / "kustomization.yaml").read_text())


def _resources() -> list[dict[str, Any]]:
    """What `kubectl apply -k` would send, before kustomize adds its labels (structure only)."""
    docs: list[dict[str, Any]] = []
    for name in _kustomization()["resources"]:
        docs += [d for d in yaml.safe_load_all((BASE / name).read_text()) if d]
    return docs


def _of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in _resources() if d["kind"] == kind}


def _pod_specs() -> dict[str, dict[str, Any]]:
    """Every workload's pod spec, by workload name (Deployments and the Job)."""
    found = {name: d["spec"]["template"]["spec"] for name, d in _of_kind("Deployment").items()}
    found.update({name: d["spec"]["template"]["spec"] for name, d in _of_kind("Job").items()})
    return found


def test_every_listed_file_exists_and_names_are_unique():
    for name in _kustomization()["resources"]:
        assert (BASE / name).is_file(), name
    keys = [(d["kind"], d["metadata"]["name"]) for d in _resources()]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize("doc", [d for d in _resources() if (d["apiVersion"], d["kind"]) not in CRDS],
                         ids=lambda d: f"{d['kind']}/{d['metadata']['name']}")  # fmt: skip
def test_each_resource_is_valid_against_the_kubernetes_schema(doc):
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_workload_requests_resources_runs_as_the_image_user_and_uses_the_kustomize_image():
    images = {i["name"] for i in _kustomization()["images"]}
    for name, spec in _pod_specs().items():
        assert spec["securityContext"]["runAsNonRoot"] and spec["securityContext"]["runAsUser"] == 10001, name
        for container in spec["containers"]:
            assert container["image"] in images, name
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), name
            assert "memory" in container["resources"]["limits"], name
            assert container["command"][0] == "engram", name


def _secrets_of(spec: dict[str, Any]) -> set[str]:
    names = set()
    for container in spec["containers"]:
        names |= {e["secretRef"]["name"] for e in container.get("envFrom", []) if "secretRef" in e}
        names |= {e["valueFrom"]["secretKeyRef"]["name"] for e in container.get("env", []) if "valueFrom" in e}
    return names


# Who sees which Secret (deploy/README.md, "Database roles": only the migrate step has the owner's URL).
SECRETS = [
    ("engram-migrate", {"engram-owner", "engram-runtime"}),
    ("engram-api", {"engram-runtime"}),
    ("engram-worker-interactive", {"engram-runtime"}),
    ("engram-worker-bulk", {"engram-runtime"}),
    ("engram-beat", {"engram-runtime"}),
]


@pytest.mark.parametrize(("workload", "secrets"), SECRETS)
def test_only_the_migrate_job_sees_the_owner_credentials(workload, secrets):
    assert _secrets_of(_pod_specs()[workload]) == secrets


def test_the_api_has_probes_an_hpa_a_pdb_and_a_service_that_select_it():
    api = _of_kind("Deployment")["engram-api"]
    labels = api["spec"]["template"]["metadata"]["labels"]
    (container,) = api["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "--no-migrate" in container["command"]
    hpa = _of_kind("HorizontalPodAutoscaler")["engram-api"]
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "engram-api"}
    assert hpa["spec"]["minReplicas"] >= 2
    assert _of_kind("PodDisruptionBudget")["engram-api"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert _of_kind("Service")["engram-api"]["spec"]["selector"].items() <= labels.items()


def test_every_deployment_selects_its_own_pods():
    for name, deployment in _of_kind("Deployment").items():
        selector = deployment["spec"]["selector"]["matchLabels"]
        assert selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items(), name


@pytest.mark.parametrize("lane", LANES)
def test_each_lane_has_its_workers_scaled_by_keda_on_its_redis_list(lane):
    deployment = _of_kind("Deployment")[f"engram-worker-{lane}"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["engram", "worker"] and command[command.index("--queues") + 1] == lane
    assert f"{lane}@$HOSTNAME" in " ".join(container["livenessProbe"]["exec"]["command"])
    scaled = _of_kind("ScaledObject")[f"engram-worker-{lane}"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] >= 1  # fresh saves (and beat's reconcile) never wait for a pod
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "redis" and trigger["metadata"]["listName"] == QUEUES[lane]
    assert int(trigger["metadata"]["listLength"]) > 0
    assert trigger["authenticationRef"]["name"] in _of_kind("TriggerAuthentication")
    # No HPA of our own on a KEDA-scaled Deployment: KEDA makes its own.
    assert all(h["spec"]["scaleTargetRef"]["name"] != deployment["metadata"]["name"]
               for h in _of_kind("HorizontalPodAutoscaler").values())  # fmt: skip


def test_exactly_one_beat_and_a_migrate_job():
    beat = _of_kind("Deployment")["engram-beat"]
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    (container,) = _of_kind("Job")["engram-migrate"]["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["engram", "migrate"]


def test_every_configured_setting_is_one_engram_reads():
    data = _of_kind("ConfigMap")["engram-settings"]["data"]
    for key in data:
        assert key.startswith("ENGRAM_") and key[len("ENGRAM_") :].lower() in Settings.model_fields, key


def test_the_worker_command_accepts_the_lanes_the_manifests_use():
    from click.testing import CliRunner

    from api.cli import main

    result = CliRunner().invoke(main, ["worker", "--help"])
    assert result.exit_code == 0
    for lane in LANES:
        assert lane in result.output
