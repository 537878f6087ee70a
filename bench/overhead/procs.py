"""Process helpers: free loopback ports, CPU pinning, readiness waits and certain clean-up."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A currently unused TCP port on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cores() -> tuple[int, int]:
    """(proxy core, load-generator core): the two cores this process may run on."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        return allowed[0], allowed[0]
    return allowed[0], allowed[1]


def wait_http(
    url: str, proc: subprocess.Popen[bytes], log: Path | None = None, timeout: float = 30.0
) -> None:
    """Poll `url` until it answers 200, failing early (with the log's tail) if `proc` dies."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise RuntimeError(f"process exited with {proc.returncode}: {err}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{url} did not become ready in {timeout:.0f}s")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process (all its threads) has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """CPU seconds all cores have spent busy since boot (user, nice, system, irq, softirq, steal):
    the difference around a run, less what the bench's own processes used, is other work."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def spawned(pids: list[int]) -> list[int]:
    """The uvicorn workers among `pids`: the processes multiprocessing's `spawn_main` runs (not
    its resource tracker, not the supervisor)."""
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                out.append(pid)
    return out


def tcp_sockets(port: int, state: str = "01") -> set[int]:
    """Inodes of the TCP sockets whose local port is `port`, in `state` (/proc/net/tcp's hex
    code: 01 established, 0A listening): a server's ends of its connections."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == state:
                    inodes.add(int(fields[9]))
    return inodes


def connections_per_worker(port: int, pids: list[int]) -> list[int]:
    """How many of the established connections to `port` each process in `pids` holds."""
    ours = {f"socket:[{inode}]" for inode in tcp_sockets(port)}
    counts = []
    for pid in pids:
        fds = Path(f"/proc/{pid}/fd")
        held = 0
        with contextlib.suppress(OSError):
            for fd in fds.iterdir():
                with contextlib.suppress(OSError):
                    held += os.readlink(fd) in ours
        counts.append(held)
    return counts


def autogroup_nice(pid: int) -> int | None:
    """The priority of `pid`'s scheduler autogroup ("/autogroup-110 nice 0"), None without one."""
    try:
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(pid: int, nice: int) -> bool:
    """Give the scheduler autogroup of `pid`'s session the priority `nice`; False where there is
    none (no /proc/PID/autogroup, or autogrouping off) or it was refused.

    With `kernel.sched_autogroup_enabled`, CPU time is shared out between sessions first and a
    process's own nice value only counts inside its session: every server here runs in a session
    of its own, and other people's work on a shared machine in theirs, so `--nice` must be set on
    the autogroups as well to mean anything."""
    enabled = Path("/proc/sys/kernel/sched_autogroup_enabled")
    if not enabled.exists() or enabled.read_text().strip() != "1":
        return False
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except OSError:
        return False
    return True


@contextlib.contextmanager
def niced(nice: int) -> Iterator[None]:
    """Run at scheduling priority `nice` (0: unchanged): this process's (children inherit it)
    and its session's autogroup (see `set_autogroup_nice`), which is put back afterwards (it
    holds the shell that started the bench too)."""
    before = autogroup_nice(os.getpid())
    if nice:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
        if before is not None:
            set_autogroup_nice(os.getpid(), nice)
    try:
        yield
    finally:
        if nice and before is not None:
            set_autogroup_nice(os.getpid(), before)


class PinnedServer:
    """A server subprocess pinned to one core with taskset, in its own process group."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        port: int,
        core: int | str,
        env: dict[str, str] | None = None,
        health_path: str = "/healthz",
    ) -> None:
        self.name = name
        self.port = port
        self._argv = ["taskset", "-c", str(core), *argv] if shutil.which("taskset") else [*argv]
        self._env = {**os.environ, **(env or {})}
        self._health = f"http://127.0.0.1:{port}{health_path}"
        self.proc: subprocess.Popen[bytes] | None = None
        # A file, not a pipe: a chatty server must never block on a full stderr pipe.
        self.log = Path(tempfile.mkstemp(prefix=f"compactd-bench-{name}-", suffix=".log")[1])

    @property
    def url(self) -> str:
        """Base URL of the server (no path)."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> PinnedServer:
        self.proc = subprocess.Popen(
            self._argv,
            env=self._env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("wb"),
            start_new_session=True,
        )
        try:
            wait_http(self._health, self.proc, self.log)
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def worker_pids(self) -> list[int]:
        """The server's own pid and its children (uvicorn workers), for profiling."""
        assert self.proc is not None
        pids = [self.proc.pid]
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        if children.exists():
            pids += [int(p) for p in children.read_text().split()]
        return pids

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            self.log.unlink(missing_ok=True)
            return
        # The server runs in its own session, so its group id is its pid: this ends only it
        # and the workers it spawned.
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.log.unlink(missing_ok=True)
