"""One listening socket per worker for `compactd serve --workers N` (Linux, SO_REUSEPORT).

uvicorn's supervisor binds one socket and hands that same socket to every worker. asyncio's
accept loop takes up to `backlog` connections per wake-up, so when a client opens many
connections at once the first worker to wake takes them all: bench/overhead saw one of two
workers holding all 32 of wrk's connections while the other idled. Here every worker listens on
a socket of its own, all bound to the same address with SO_REUSEPORT, and the kernel spreads new
connections over them by a hash of the connection's addresses and ports.

It keeps uvicorn's supervisor (restart of a dead worker, SIGINT/SIGTERM/SIGHUP, health checks) by
changing only what the supervisor hands its workers: a `PortClaim` pickles as an instruction to
bind, so every worker uvicorn spawns, a replacement included, opens a socket of its own. The
parent's claim is bound but never listens: it gets no connections, and holds the port for the
server's lifetime while workers come and go. A worker listens only once its app has started
(uvicorn's `startup`), so no connection is queued at a worker that cannot answer yet, and a dead
worker's socket closes with it, so new connections go to the live ones.

The price: a worker that stops (SIGHUP's rolling restart, a crash) takes with it the connections
the kernel had queued on its socket and it had not accepted yet (reset; Linux >= 5.14 hands them
to another listener with `net.ipv4.tcp_migrate_req = 1`). Workers accept as soon as they can, so
that queue is short; with one shared socket they waited for the next worker instead.
"""

from __future__ import annotations

import socket
import sys
from typing import Any

from uvicorn.config import STARTUP_FAILURE, Config
from uvicorn.supervisors.multiprocess import Multiprocess

SUPPORTED = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")
"""Linux balances connections over SO_REUSEPORT listeners; elsewhere the option means other
things (BSD, macOS: the last socket bound gets them), so workers share one socket there."""


def _bound(family: int, address: tuple[Any, ...]) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def worker_socket(family: int, address: tuple[Any, ...]) -> socket.socket:
    """In a worker, as it unpickles its arguments: its own socket on the claimed address (uvicorn
    makes it listen after the app's startup)."""
    try:
        return _bound(family, address)
    except OSError as exc:
        # Would fail the same way on every restart: uvicorn stops the server on this exit code.
        print(f"compactd worker cannot bind {address}: {exc}", file=sys.stderr)
        raise SystemExit(STARTUP_FAILURE) from None


class PortClaim(socket.socket):
    """The parent's bound, never listening socket; each worker gets a fresh one in its place."""

    def __reduce_ex__(self, protocol: object) -> tuple[Any, ...]:
        return worker_socket, (int(self.family), self.getsockname())


def claim(host: str, port: int) -> PortClaim:
    """Bind `host:port` for the workers (port 0: one free port, the same for all of them)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    plain = _bound(family, (host, port))
    # socket.socket cannot change class in place; take over its descriptor.
    return PortClaim(family, socket.SOCK_STREAM, socket.IPPROTO_TCP, fileno=plain.detach())


def run_workers(config: Config) -> None:
    """Run `config.workers` worker processes under uvicorn's supervisor, each with its own
    listening socket where the kernel balances them (`SUPPORTED`), else sharing one."""
    sock = claim(config.host, config.port) if SUPPORTED else config.bind_socket()
    try:
        Multiprocess(config, sockets=[sock]).run()
    except KeyboardInterrupt:  # as uvicorn.run: ^C is how a server is meant to stop
        pass
    finally:
        sock.close()
