"""deploy/: the Kubernetes manifests and the Grafana dashboard.

The kustomize base and the Redis overlay are rendered by kustomize itself (`kubectl kustomize`,
Debian's kubernetes-client; .ci/run installs it) and every resource is validated against the
Kubernetes 1.37 schemas by kubernetes-validate (strict: no unknown fields), offline. The rendered
resources are then checked against compactd: probes on the routes it serves, the port it
listens on, the Secret its environment reads. Every query of the Grafana dashboard names only
metrics that a running compactd exports at /metrics.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx
import kubernetes_validate
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from proxy.app.openapi import document
from proxy.config import ServerSettings

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
GRAFANA = ROOT / "deploy" / "grafana" / "compactd.json"
VERSION = "1.37.0"
METRIC = re.compile(r"\bcompactd_[a-z0-9_]+\b")


def render(target: str) -> list[dict[str, Any]]:
    """The resources kustomize builds from deploy/kubernetes/<target>."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        why = "kubectl is not installed (apt-get install kubernetes-client)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the manifests cannot be rendered under CI: {why}")
        pytest.skip(why)
    out = subprocess.run(
        [kubectl, "kustomize", str(KUBE / target)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return [r for r in yaml.safe_load_all(out.stdout) if r]


def by_kind(resources: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(r for r in resources if r["kind"] == kind and r["metadata"]["name"] == name)


@pytest.mark.parametrize("target", ["base", "overlays/redis"])
def test_every_rendered_resource_is_valid_against_the_kubernetes_schemas(target: str) -> None:
    resources = render(target)
    assert resources
    for resource in resources:
        kubernetes_validate.validate(resource, VERSION, strict=True)


def test_the_validator_refuses_what_kubernetes_would() -> None:
    deployment = by_kind(render("base"), "Deployment", "compactd")
    deployment["spec"]["replicas"] = "three"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSION, strict=True)
    deployment["spec"]["replicas"] = 1
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, VERSION, strict=True)


def test_the_base_runs_compactd_with_probes_resources_secret_and_metrics() -> None:
    resources = render("base")
    pod = by_kind(resources, "Deployment", "compactd")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    routes = document()["paths"]
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert {"/healthz", "/readyz", "/metrics"} <= set(routes)
    (port,) = container["ports"]
    assert port["containerPort"] == ServerSettings().port
    assert container["resources"]["requests"]["memory"]
    assert container["resources"]["limits"]["memory"]
    env = {e["name"]: e for e in container["env"]}
    assert env["COMPACTD_SERVER_HOST"]["value"] == "0.0.0.0"
    secret = by_kind(resources, "Secret", "compactd")
    for name, key in (
        ("COMPACTD_SECRET", "tenant-secret"),
        ("COMPACTD_UPSTREAM_API_KEY", "upstream-api-key"),
    ):
        ref = env[name]["valueFrom"]["secretKeyRef"]
        assert ref["name"] == "compactd"
        assert key in secret["stringData"]
    metrics = by_kind(resources, "Service", "compactd-metrics")
    assert metrics["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
    assert metrics["spec"]["ports"][0]["targetPort"] == port["name"]
    selector = metrics["spec"]["selector"]
    labels = by_kind(resources, "Deployment", "compactd")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= labels.items()
    assert by_kind(resources, "PersistentVolumeClaim", "compactd-data")


def test_the_redis_overlay_runs_replicas_on_one_redis_without_a_volume_claim() -> None:
    resources = render("overlays/redis")
    deployment = by_kind(resources, "Deployment", "compactd")
    assert deployment["spec"]["replicas"] > 1
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["REDIS_URL"] == "redis://compactd-redis:6379/0"
    assert "COMPACTD_SECRET" in env  # the base's environment is kept
    assert not [r for r in resources if r["kind"] == "PersistentVolumeClaim"]
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"] == {"name": "data", "emptyDir": {}}
    redis = by_kind(resources, "StatefulSet", "compactd-redis")
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    service = by_kind(resources, "Service", "compactd-redis")
    assert service["spec"]["ports"][0]["port"] == 6379


def exported(text: str) -> set[str]:
    """Every series name a /metrics exposition can carry, from its families' types."""
    names: set[str] = set()
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count")}
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(family.name + s for s in suffixes.get(family.type, ()))
        names.update(s.name for s in family.samples)
    return names


async def test_every_grafana_query_names_metrics_a_running_compactd_exports(
    upstream: tuple[object, str], make_proxy: Any
) -> None:
    _, url = upstream
    async with make_proxy(url) as proxy, httpx.AsyncClient(base_url=proxy) as http:
        body = {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}
        await http.post("/v1/chat/completions", json=body, headers={"authorization": "Bearer k"})
        live = exported((await http.get("/metrics")).text)
    dashboard = json.loads(GRAFANA.read_text())
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(queries) >= 15
    unknown = sorted({m for q in queries for m in METRIC.findall(q)} - live)
    assert unknown == []
    assert all(METRIC.search(q) for q in queries)  # no query without a compactd metric
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
