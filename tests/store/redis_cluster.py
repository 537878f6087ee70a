"""A real local Redis Cluster for tests: six `redis-server --cluster-enabled yes` processes on
loopback (three masters, three replicas), created with `redis-cli --cluster create`.

The tests kill a master and let its replica take over, and move a slot from one master to
another key by key (so clients see ASK, then MOVED), as an operator's cluster would.
"""

from __future__ import annotations

import random
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from tests.store.redis_server import RedisServer

NODE_TIMEOUT_MS = 1000
"""cluster-node-timeout: a dead master is failed over a second or two after it stops."""

NODE_SETTINGS = (
    "--cluster-enabled",
    "yes",
    "--cluster-node-timeout",
    str(NODE_TIMEOUT_MS),
    "--appendonly",
    "yes",
    "--appendfsync",
    "everysec",
    "--maxmemory-policy",
    "noeviction",
)
"""How every node runs (docker-compose.cluster.yml runs its nodes the same way)."""


PORTS = range(20000, 22768)
"""Node ports: each with its bus port (p + 10000) below Linux's ephemeral range (32768 up), so an
outgoing connection of a busy machine cannot take a bus port between its choice and its bind."""

START_ATTEMPTS = 5
"""Ports a node may try: another process can still bind a chosen port before the node does."""


def free_cluster_port(rng: random.Random) -> int:
    """A port p such that p and its cluster bus port p + 10000 are both free on loopback."""
    for _ in range(200):
        port = rng.choice(PORTS)
        sockets = []
        try:
            for p in (port, port + 10000):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", p))
            return port
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError("no free port pair for a cluster node")


class ClusterNode(RedisServer):
    """One cluster node: AOF on (as in production), its own nodes.conf."""

    def __init__(self, directory: Path, port: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        super().__init__(
            directory,
            extra=(*NODE_SETTINGS, "--cluster-config-file", str(directory / "nodes.conf")),
        )
        self.port = port

    def client(self) -> redis.Redis:
        """A plain (non-cluster) client of this one node."""
        return redis.Redis(port=self.port, socket_timeout=5, socket_connect_timeout=1)

    def command(self, *args: object) -> Any:
        """One command's (parsed) reply from this node."""
        c = self.client()
        try:
            return c.execute_command(*args)
        finally:
            c.close()

    def info(self, section: str) -> dict[str, object]:
        """INFO of this node."""
        return dict(self.command("INFO", section))

    @property
    def alive(self) -> bool:
        """Whether the process runs."""
        return self._proc is not None and self._proc.poll() is None


class LocalCluster:
    """Six nodes on loopback; `url` is what `store.url` takes."""

    def __init__(self, directory: Path, masters: int = 3) -> None:
        self.rng = random.Random()
        self.nodes: list[ClusterNode] = []
        for i in range(masters * 2):
            self.nodes.append(ClusterNode(directory / f"node{i}", self._new_port()))
        self.masters = masters

    def _new_port(self) -> int:
        """A free node port no node of this cluster has."""
        while True:
            port = free_cluster_port(self.rng)
            if all(n.port != port for n in self.nodes):
                return port

    @property
    def url(self) -> str:
        """`redis+cluster://` with two seed nodes (the client discovers the rest)."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes[:2])

    def start(self) -> None:
        """Start every node, create the cluster (one replica per master), wait until it is ok."""
        for node in self.nodes:
            for attempt in range(START_ATTEMPTS):
                try:
                    node.start()
                    break
                except RuntimeError:
                    if node.alive or attempt == START_ATTEMPTS - 1:
                        raise  # it runs but does not answer, or no port worked
                    node.port = self._new_port()  # the port was taken after it was chosen
        addrs = [f"127.0.0.1:{n.port}" for n in self.nodes]
        subprocess.run(
            [
                "redis-cli",
                "--cluster",
                "create",
                *addrs,
                "--cluster-replicas",
                "1",
                "--cluster-yes",
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        self.wait_healthy()

    def stop(self) -> None:
        """Kill every node."""
        for node in self.nodes:
            node.stop(signal.SIGKILL)

    def node_by_port(self, port: int) -> ClusterNode:
        """The node listening on `port`."""
        return next(n for n in self.nodes if n.port == port)

    def command(self, *args: object) -> Any:
        """A command's reply from the first live node that answers it."""
        for node in self.nodes:
            if node.alive:
                try:
                    return node.command(*args)
                except redis.RedisError:
                    continue
        raise RuntimeError("no cluster node answers")

    def _view(self) -> list[dict[str, object]]:
        """CLUSTER NODES as seen by some live node: one dict per node (id, port, flags, slots)."""
        return [
            {
                "id": v["node_id"],
                "port": int(addr.split("@")[0].rsplit(":", 1)[1]),
                "flags": v["flags"].split(","),
                "slots": v["slots"],
            }
            for addr, v in self.command("CLUSTER NODES").items()
        ]

    def master_ports(self) -> list[int]:
        """Ports of the live masters (that hold slots)."""
        return [
            int(str(n["port"]))
            for n in self._view()
            if "master" in n["flags"] and "fail" not in n["flags"] and n["slots"]
        ]

    def node_id(self, port: int) -> str:
        """The cluster id of the node on `port`."""
        return next(str(n["id"]) for n in self._view() if n["port"] == port)

    def master_of_slot(self, slot: int) -> int:
        """Port of the master serving `slot` (as a live node sees it)."""
        for start, end, master, *_ in self.command("CLUSTER SLOTS"):
            if int(start) <= slot <= int(end):
                return int(master[1])
        raise RuntimeError(f"no node knows slot {slot}")

    def wait_healthy(self, timeout: float = 60.0) -> None:
        """Until every live node reports cluster_state:ok, every slot covered, and the
        replicas of live masters are in sync."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._healthy():
                    return
            except (redis.RedisError, RuntimeError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError("the local cluster did not become healthy")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        for node in self.nodes:
            if not node.alive:
                continue
            info = node.command("CLUSTER INFO")
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_ok") != "16384":
                return False
            repl = node.info("replication")
            if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                return False
        return len(self.master_ports()) == self.masters

    def kill_master_of(self, slot: int) -> ClusterNode:
        """SIGKILL the master serving `slot`; its replica takes over after the node timeout."""
        node = self.node_by_port(self.master_of_slot(slot))
        node.stop(signal.SIGKILL)
        return node

    def wait_failover(self, slot: int, old_port: int, timeout: float = 30.0) -> int:
        """Until another node serves `slot`; returns its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                port = self.master_of_slot(slot)
                if port != old_port:
                    return port
            except (redis.RedisError, RuntimeError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"slot {slot} was not failed over")

    def restart(self, node: ClusterNode) -> None:
        """Start a killed node again: it rejoins as a replica of the master that replaced it."""
        node.start()
        self.wait_healthy()

    def migrate_slot(self, slot: int, to_port: int, *, pause: float = 0.0) -> int:
        """Move `slot` to the master on `to_port` the way `redis-cli --cluster reshard` does:
        IMPORTING/MIGRATING, then MIGRATE key by key (`pause` seconds between keys, so clients
        meet ASK redirections), then SETSLOT NODE everywhere (MOVED from then on). Returns how
        many keys moved."""
        src_port = self.master_of_slot(slot)
        src, dst = self.node_by_port(src_port).client(), self.node_by_port(to_port).client()
        src_id, dst_id = self.node_id(src_port), self.node_id(to_port)
        moved = 0
        try:
            dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)
            src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)
            while keys := src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1):
                src.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000, "KEYS", *keys)
                moved += len(keys)
                time.sleep(pause)
            for node in self.nodes:
                if node.alive and node.port in self.master_ports():
                    c = node.client()
                    try:
                        c.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)
                    finally:
                        c.close()
        finally:
            src.close()
            dst.close()
        return moved
