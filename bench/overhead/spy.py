"""Sampling profiles of a server under load with py-spy, summarised as hot-spot tables."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path


def py_spy() -> str | None:
    """Path of the py-spy binary (the venv's first), or None when it is not installed."""
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.exists() else shutil.which("py-spy")


def start_record(pid: int, out: Path, seconds: float) -> subprocess.Popen[bytes] | None:
    """Start `py-spy record` on `pid` writing collapsed stacks to `out`; None without py-spy."""
    exe = py_spy()
    if exe is None:
        return None
    argv = [exe, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds)))]
    argv += ["--rate", "250", "--format", "raw", "--nonblocking", "--gil", "--output", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _frame(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/file.py:123)": keep function and file.
    name, _, loc = frame.partition(" (")
    path = loc.rstrip(")").rsplit(":", 1)[0]
    for marker in ("site-packages/", "/proxy/", "lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            if marker == "/proxy/":
                path = "proxy/" + path
            break
    return f"{name} ({path})"


def summarise(collapsed: Path, top: int = 15) -> str:
    """Self-time and inclusive-time hot spots of a py-spy raw (collapsed) profile, as markdown."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        frames = [_frame(f) for f in stack.split(";") if f.strip()]
        if not frames:
            continue
        total += count
        self_time[frames[-1]] += count
        for f in set(frames):
            inclusive[f] += count
    if not total:
        return f"(no samples in {collapsed.name})\n"
    lines = [f"samples: {total}", "", "| self % | function |", "|---:|---|"]
    lines += [f"| {100 * n / total:.1f} | `{f}` |" for f, n in self_time.most_common(top)]
    ours = [(f, n) for f, n in inclusive.most_common() if "(proxy/" in f][:top]
    lines += ["", "| incl. % | compactd function |", "|---:|---|"]
    lines += [f"| {100 * n / total:.1f} | `{f}` |" for f, n in ours]
    return "\n".join(lines) + "\n"
