"""A private redis-server for tests that stop, pause, kill and restart it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class RedisServer:
    """redis-server on a fixed port and directory, so a restart finds its AOF again."""

    def __init__(
        self, directory: Path, *, appendonly: bool = False, extra: tuple[str, ...] = ()
    ) -> None:
        self.directory = directory
        self.port = free_port()
        self.appendonly = appendonly
        self.extra = extra
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL a store connects to."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start and wait until it answers PING (and has loaded its AOF)."""
        args = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        args += ["--dir", str(self.directory), "--save", "", "--daemonize", "no"]
        args += ["--protected-mode", "no", "--logfile", str(self.directory / "redis.log")]
        if self.appendonly:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        args += list(self.extra)
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2, socket_timeout=1)
        deadline = time.monotonic() + 20
        while True:
            try:
                if client.ping():
                    client.close()
                    return
            except (redis.ConnectionError, redis.BusyLoadingError, redis.TimeoutError):
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    raise RuntimeError(f"redis-server on {self.port} did not start") from None
                time.sleep(0.05)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop it (SIGKILL: a crash, no shutdown fsync) and wait for the process to exit."""
        if self._proc is None:
            return
        if self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGCONT)
            self._proc.send_signal(sig)
            self._proc.wait(timeout=20)
        self._proc = None

    def restart(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop, then start again on the same port and directory."""
        self.stop(sig)
        self.start()

    def pause(self) -> None:
        """Freeze the process (SIGSTOP): connections stay open but nothing answers."""
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Undo pause()."""
        assert self._proc is not None
        os.kill(self._proc.pid, signal.SIGCONT)
