"""A fast local upstream: Debian's nginx serving fixed chat-completion JSON and SSE bodies.

nginx's static handler refuses POST (405), so the chat route rewrites to an internal location
whose `error_page 405 =200 $uri` turns the request into a GET of a fixed file: every POST gets
the same bytes back with a Content-Length, at C speed, on keep-alive connections. A request
carrying `x-bench-stream: 1` gets the SSE file instead (nginx cannot read the JSON body to find
`"stream": true`, and every proxy under test forwards unknown headers).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from procs import free_port, wait_http

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 8192; multi_accept on; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    client_max_body_size 64m;
    client_body_buffer_size 1m;
    keepalive_requests 10000000;
    keepalive_timeout 300s;
    # Two fixed files of a few KB: sendfile would send each head and body as two segments
    # (two wake-ups of the proxy reading them) and every request would open, stat and close
    # the file twice (the internal redirect); held open and copied, nginx costs ~14 µs of CPU
    # a request instead of ~30 (wrk straight at it), CPU taken from the core it shares.
    sendfile off;
    open_file_cache max=16 inactive=3600s;
    open_file_cache_valid 3600s;
    tcp_nodelay on;
    etag off;
    server {{
        listen 127.0.0.1:{port} backlog=4096;
        root {tmp}/www;
        location = /v1/chat/completions {{
            if ($http_x_bench_stream = "1") {{ rewrite ^ /_bench/stream.sse last; }}
            rewrite ^ /_bench/completion.json last;
        }}
        location /_bench/ {{
            internal;
            error_page 405 =200 $uri;
            types {{ application/json json; text/event-stream sse; }}
            add_header x-request-id req_bench always;
        }}
        location = /healthz {{ return 200 "ok"; }}
    }}
}}
"""


class NginxUpstream:
    """Starts nginx on a free loopback port with a generated config; stops it on exit."""

    def __init__(self, completion: bytes, sse: bytes, batch: bool = False) -> None:
        self.completion = completion
        self.sse = sse
        self.batch = batch
        """SCHED_BATCH: nginx never preempts what runs on its core when a request wakes it."""
        self.port = 0
        self._tmp = Path(tempfile.mkdtemp(prefix="compactd-bench-nginx-"))
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        """The upstream base URL, as a proxy's upstream setting expects it."""
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> NginxUpstream:
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        if not Path(nginx).exists():
            raise SystemExit("nginx not found: apt-get install -y nginx-light")
        # nginx workers drop to an unprivileged user when started as root: let them read the files.
        self._tmp.chmod(0o755)
        www = self._tmp / "www" / "_bench"
        www.mkdir(parents=True)
        (www / "completion.json").write_bytes(self.completion)
        (www / "stream.sse").write_bytes(self.sse)
        self.port = free_port()
        conf = self._tmp / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=self._tmp, port=self.port))
        batch = ["chrt", "-b", "0"] if self.batch and shutil.which("chrt") else []
        args = ["-c", str(conf), "-p", str(self._tmp), "-e", str(self._tmp / "error.log")]
        self._proc = subprocess.Popen(
            [*batch, nginx, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_http(f"http://127.0.0.1:{self.port}/healthz", self._proc, self._tmp / "error.log")
        except Exception:
            self.__exit__(None, None, None)
            raise
        return self

    def pids(self) -> list[int]:
        """nginx's master and its worker (their CPU is the upstream's cost)."""
        assert self._proc is not None
        pid = self._proc.pid
        children = Path(f"/proc/{pid}/task/{pid}/children")
        if not children.exists():
            return [pid]
        return [pid, *(int(p) for p in children.read_text().split())]

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        time.sleep(0.05)
        shutil.rmtree(self._tmp, ignore_errors=True)
