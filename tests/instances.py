"""`compactd serve` as separate processes, the way an operator runs several instances."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx

READY_SECONDS = 60.0


def free_port() -> int:
    """A loopback TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Instance:
    """One `compactd serve` process group (its workers included), logging to a file."""

    def __init__(self, name: str, directory: Path, env: dict[str, str], *args: str) -> None:
        self.name = name
        self.port = free_port()
        self.log = directory / f"{name}.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTD_")}
        self.env = {**base, "COMPACTD_DATA_DIR": str(directory / name), **env}
        self.argv = [sys.executable, "-m", "proxy", "serve", "--port", str(self.port), *args]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Base URL, no path."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        """Start it and wait until /readyz answers (every worker loads the same app)."""
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=log, stderr=log, start_new_session=True
            )
        async with httpx.AsyncClient() as http, asyncio.timeout(READY_SECONDS):
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-2000:]}")
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(f"{self.url}/readyz")).status_code == 200:
                        return
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        """SIGTERM the group (the server and its workers), SIGKILL if it lingers."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc is None or self.proc.poll() is not None:
                return
            os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=20)

    def worker_pids(self) -> list[int]:
        """The server process and its children (uvicorn workers)."""
        assert self.proc is not None
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [self.proc.pid, *(int(p) for p in children.read_text().split())]


@contextlib.asynccontextmanager
async def instances(
    directory: Path, envs: list[dict[str, str]], *args: str
) -> AsyncIterator[list[Instance]]:
    """Several instances started together, stopped (with their workers) afterwards."""
    started = [Instance(f"instance-{i}", directory, env, *args) for i, env in enumerate(envs)]
    try:
        await asyncio.gather(*(i.start() for i in started))
        yield started
    finally:
        for i in started:
            i.stop()
