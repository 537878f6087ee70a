"""`serve --workers N` on Linux: a listening socket per worker, so connections are spread."""

from __future__ import annotations

import asyncio
import os
import pickle
import select
import signal
import socket
import sys
from pathlib import Path

import pytest

from proxy.cli.listeners import SUPPORTED, claim
from tests.instances import Instance, instances

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "overhead"))

from procs import connections_per_worker, spawned, tcp_sockets

pytestmark = pytest.mark.skipif(not SUPPORTED, reason="SO_REUSEPORT balancing is Linux's")

ENV = {"COMPACTD_SECRET": "listeners"}
CONNECTIONS = 64


def _workers(server: Instance) -> list[int]:
    """uvicorn's worker processes (not multiprocessing's resource tracker)."""
    return spawned(server.worker_pids()[1:])


def _connections_per_worker(server: Instance) -> dict[int, int]:
    workers = _workers(server)
    return dict(zip(workers, connections_per_worker(server.port, workers), strict=True))


def _open_many(port: int) -> list[socket.socket]:
    """Open CONNECTIONS connections in a tight loop, as wrk does, then have each answered once
    (so every one has been accepted). With one shared listening socket the first worker to wake
    takes nearly all of them (measured: 57-64 of 64 in 7 of 8 bursts)."""
    socks = []
    for _ in range(CONNECTIONS):
        sock = socket.socket()
        sock.setblocking(False)
        sock.connect_ex(("127.0.0.1", port))
        socks.append(sock)
    for sock in socks:
        sock.settimeout(10)
        select.select([], [sock], [], 10)  # connected
        sock.sendall(b"GET /healthz HTTP/1.1\r\nhost: test\r\n\r\n")
    for sock in socks:
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    return socks


def _assert_both_get_a_share(server: Instance) -> None:
    socks = _open_many(server.port)
    try:
        counts = _connections_per_worker(server)
    finally:
        for sock in socks:
            sock.close()
    assert sum(counts.values()) == CONNECTIONS, counts
    # The kernel hashes each connection to a worker: 64 coin flips, so each gets ~32 (a share
    # below 13 has odds of about 1e-6).
    assert len(counts) == 2, counts
    assert min(counts.values()) >= 13, counts


def test_a_claim_gives_each_worker_its_own_socket_on_the_same_port() -> None:
    with claim("127.0.0.1", 0) as parent:
        first = pickle.loads(pickle.dumps(parent))  # what a worker unpickles
        second = pickle.loads(pickle.dumps(parent))
        with first, second:
            assert first.getsockname() == second.getsockname() == parent.getsockname()
            assert first.fileno() != second.fileno()
            assert first.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)


async def _until_both_listen(server: Instance, gone: int = -1) -> None:
    """/readyz answers once one worker is up; a worker listens only after its app started."""
    async with asyncio.timeout(60):
        while (
            Path(f"/proc/{gone}").exists()  # a dying worker may list no cmdline yet hold fds
            or len(_workers(server)) < 2
            or len(tcp_sockets(server.port, "0A")) < 2
        ):
            await asyncio.sleep(0.1)


async def test_two_workers_both_get_connections_a_client_opens_at_once(tmp_path: Path) -> None:
    async with instances(tmp_path, [ENV], "--workers", "2") as (server,):
        await _until_both_listen(server)
        await asyncio.to_thread(_assert_both_get_a_share, server)


async def test_a_killed_worker_is_replaced_with_a_socket_of_its_own(tmp_path: Path) -> None:
    async with instances(tmp_path, [ENV], "--workers", "2") as (server,):
        await _until_both_listen(server)
        victim = _workers(server)[0]
        os.kill(victim, signal.SIGKILL)
        await _until_both_listen(server, gone=victim)
        await asyncio.to_thread(_assert_both_get_a_share, server)


async def test_sigterm_stops_every_worker_and_frees_the_port(tmp_path: Path) -> None:
    async with instances(tmp_path, [ENV], "--workers", "2") as (server,):
        workers = _workers(server)
        assert len(workers) == 2
    for pid in workers:
        assert not Path(f"/proc/{pid}").exists() or "Z" in _state(pid)
    with socket.socket() as plain:  # no SO_REUSEPORT: only binds if nobody holds the port
        plain.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        plain.bind(("127.0.0.1", server.port))


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
