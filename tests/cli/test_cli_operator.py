"""What an operator reads from the `compactd` command: which store a command opened (and in
every "not found"), every config-file problem at once with a suggestion, help for every flag, and
progress on a terminal that stays out of a pipe."""

from __future__ import annotations

import argparse
import json
import os
import pty
import select
import subprocess
from pathlib import Path

from proxy.cli.main import build_parser
from tests.cli.test_cli import PY, _env, run
from tests.live.test_compaction_e2e import history


def store_line(data: Path) -> str:
    return f"store sqlite {data / 'compactd.db'} (data dir {data})"


def test_store_commands_name_the_store_they_opened_and_say_so_when_nothing_is_there(
    tmp_path: Path,
) -> None:
    data = tmp_path / "elsewhere"
    listed = run("conversations", data=data)
    assert listed.returncode == 0
    err = listed.stderr.decode()
    assert f"compactd: {store_line(data)}" in err
    assert f"compactd: no conversations in {store_line(data)}" in err
    restore = run("restore", "conv-1", data=data)
    assert restore.returncode == 1
    assert f"no compacted conversation 'conv-1' in {store_line(data)}" in restore.stderr.decode()
    purge = run("purge", "conv-1", data=data)
    assert purge.returncode == 1
    assert purge.stdout == b"not found\n"
    assert f"no conversation 'conv-1' in {store_line(data)}" in purge.stderr.decode()
    stats = run("stats", "--json", data=data)
    assert stats.returncode == 0
    assert json.loads(stats.stdout)["rows"] == []
    assert "no usage since" in stats.stderr.decode()
    assert store_line(data) in stats.stderr.decode()


def test_every_config_file_problem_is_reported_at_once_with_suggestions(tmp_path: Path) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(
        '[server]\nprot = 9000\nworkers = 0\n[upstream]\nurl = "ftp://x"\n'
        '[tokenz]\nsafety_margin = 1\n[[policies]]\nname = "p"\nmode = "enforcee"\n'
    )
    result = run("check-config", str(config), data=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.decode().splitlines()
    assert lines[0] == "compactd: configuration errors:"
    assert sorted(line.strip() for line in lines[1:]) == sorted(
        [
            "server.prot: unknown key (did you mean port?)",
            "tokenz: unknown key (did you mean tokens?)",
            "policies[0].mode: must be one of ('enforce', 'shadow', 'off'), not 'enforcee'",
            "server.workers: must be >= 1, not 0",
            "upstream.url: must be an http(s) URL",
        ]
    )
    # One problem stays one line, as before.
    config.write_text("[server]\nprot = 9000\n")
    one = run("check-config", str(config), data=tmp_path).stderr.decode()
    assert one == "compactd: configuration error: server.prot: unknown key (did you mean port?)\n"


def test_every_flag_of_every_command_has_help() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [
        f"{name} {action.dest}"
        for name, command in sub.choices.items()
        for action in command._actions
        if not isinstance(action, argparse._HelpAction) and not action.help
    ]
    assert missing == []
    assert set(sub.choices) >= {"serve", "compress", "conversations", "stats", "restore"}


def read_until(fd: int, wanted: bytes, proc: subprocess.Popen[bytes]) -> bytes:
    """What the terminal shows, up to `wanted` (or everything, once the command is done)."""
    shown = b""
    while wanted not in shown:
        ready, _, _ = select.select([fd], [], [], 60)
        assert ready, shown  # a minute without a byte: the command is stuck
        try:
            chunk = os.read(fd, 4096)
        except OSError:
            break
        if not chunk:
            break
        shown += chunk
    del proc
    return shown


def test_compress_shows_its_count_before_the_first_line_is_done(tmp_path: Path) -> None:
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [PY, "-m", "proxy", "compress"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=follower,
        env=_env(tmp_path),
    )
    os.close(follower)
    try:
        # Nothing sent yet: the terminal already says the command is at work.
        assert b"compress: 0 lines" in read_until(leader, b"compress: 0 lines", proc)
        lines = [json.dumps({"id": str(i), "messages": history(6)}) for i in range(2)]
        out, _ = proc.communicate(("\n".join(lines) + "\n").encode(), timeout=120)
        shown = read_until(leader, b"\n", proc)
    finally:
        os.close(leader)
    assert len(out.splitlines()) == 2
    assert b"compress: 2 lines" in shown
    assert b"tokens" in shown


def test_stats_shows_progress_on_a_terminal_and_nothing_in_a_pipe(tmp_path: Path) -> None:
    piped = run("stats", data=tmp_path)
    assert b"reading usage" not in piped.stderr
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [PY, "-m", "proxy", "stats"],
        stdout=subprocess.PIPE,
        stderr=follower,
        env=_env(tmp_path),
    )
    os.close(follower)
    try:
        shown = read_until(leader, b"reading usage", proc)
        proc.communicate(timeout=120)
    finally:
        os.close(leader)
    assert b"reading usage" in shown
    assert proc.returncode == 0
