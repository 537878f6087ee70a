"""docker-compose.cluster.yml, the reference topology, is valid and says what the README says.

Compose itself validates it (`docker compose config`, or Debian's `docker-compose config` where
the plugin is missing, as on this machine: neither needs an engine; .ci/run installs the latter).
The file is also checked against compactd's own config loader and against the local cluster that
the store tests start without Docker (tests/store/redis_cluster.py): same nodes, same settings.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from proxy.config import load_settings
from proxy.store.redis.client import cluster_seeds
from tests.store.redis_cluster import NODE_SETTINGS

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.cluster.yml"
SECRET = "0123456789abcdef0123456789abcdef"


def spec() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}` and `${VAR:?error}` (error if unset)."""

    def one(m: re.Match[str]) -> str:
        name, op, arg = m.group(1), m.group(2) or "", m.group(3) or ""
        if env.get(name):
            return env[name]
        if op == ":?":
            raise KeyError(f"{name}: {arg}")
        return arg

    return re.sub(r"\$\{(\w+)(:-|:\?)?([^}]*)\}", one, value)


def services(kind: str) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in spec()["services"].items() if n.startswith(kind)}


def redis_flags(service: dict[str, Any]) -> str:
    return " ".join(service["command"])


def test_two_compactd_instances_share_the_cluster_the_secret_and_durability() -> None:
    compactds = services("compactd-")
    nodes = {n for n in services("redis-") if n != "redis-cluster-init"}

    assert len(compactds) == 2
    for svc in compactds.values():
        env = {
            k: interpolate(str(v), {"COMPACTD_SECRET": SECRET})
            for k, v in svc["environment"].items()
        }
        settings = load_settings(None, env=env)  # compactd's own loader accepts it as is
        seeds, _ = cluster_seeds(settings.store.url)
        assert {host for host, _ in seeds} <= nodes
        assert settings.store.min_replicas_ack == 1
        assert settings.server.secret == SECRET
        assert (
            svc["depends_on"]["redis-cluster-init"]["condition"] == "service_completed_successfully"
        )
        assert all(p.startswith("127.0.0.1:") for p in svc["ports"])
    # Without a shared secret the file refuses to start (each instance would be its own tenant).
    raw = next(iter(compactds.values()))["environment"]["COMPACTD_SECRET"]
    try:
        interpolate(raw, {})
    except KeyError:
        pass
    else:
        raise AssertionError("COMPACTD_SECRET must be required")


def test_six_redis_nodes_run_as_the_local_test_cluster_does() -> None:
    nodes = {n: s for n, s in services("redis-").items() if n != "redis-cluster-init"}
    init = spec()["services"]["redis-cluster-init"]
    fixture_flags = " ".join(NODE_SETTINGS)

    assert len(nodes) == 6
    for svc in nodes.values():
        flags = redis_flags(svc)
        for setting in (
            "--cluster-enabled yes",
            "--appendonly yes",
            "--maxmemory-policy noeviction",
        ):
            assert setting in flags
            assert setting in fixture_flags  # the suite's cluster runs the same way
        assert svc["healthcheck"]["test"][-1] == "ping"
        assert any(v.endswith(":/data") for v in svc["volumes"])
    create = " ".join(init["command"])
    assert "--cluster-replicas 1" in create
    assert "--cluster-yes" in create
    assert set(init["depends_on"]) == set(nodes)
    declared = set(spec()["volumes"])
    used = {v.split(":")[0] for s in spec()["services"].values() for v in s.get("volumes", [])}
    assert used <= declared


def compose_cli() -> list[str] | None:
    """`docker compose` (the plugin) or Debian's `docker-compose`, whichever is installed.
    Both validate a file without an engine; .ci/run installs the latter."""
    docker = shutil.which("docker")
    if docker:
        version = subprocess.run([docker, "compose", "version"], capture_output=True, check=False)
        if version.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def compose_config(cli: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*cli, "-f", str(COMPOSE), "config", "--quiet"],
        capture_output=True,
        text=True,
        env={**{k: v for k, v in os.environ.items() if not k.startswith("COMPACTD_")}, **env},
        cwd=ROOT,
        check=False,
    )


def test_docker_compose_accepts_the_file_and_refuses_it_without_the_secret() -> None:
    cli = compose_cli()
    if cli is None:
        if os.environ.get("CI", "").lower() == "true":
            raise AssertionError("no compose CLI: apt-get install docker-compose")
        pytest.skip("neither `docker compose` nor `docker-compose` is installed")
    valid = compose_config(cli, {"COMPACTD_SECRET": SECRET})
    unset = compose_config(cli, {})

    assert valid.returncode == 0, valid.stderr
    assert unset.returncode != 0
    assert "COMPACTD_SECRET" in unset.stderr
