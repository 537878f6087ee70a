"""Everyday use of the `compactd` command: one-line errors, the secret it uses, clean output."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pty
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.store.sqlite.store import SqliteStore
from proxy.wire.tenant import key_fingerprint
from tests.cli.test_cli import PY, _env, _free_port, run
from tests.live.test_compaction_e2e import history
from tests.store.test_contract import compaction
from tests.store.test_contract import history as short_history


@contextlib.asynccontextmanager
async def serving_with(
    env: dict[str, str], upstream: str, *args: str
) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """`compactd serve` with this environment; the JSON log records fill in when it stops."""
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        PY, "-m", "proxy", "serve", "--port", str(port), "--upstream", upstream, *args,
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    logs: list[dict[str, Any]] = []
    try:
        async with httpx.AsyncClient() as http:
            for _ in range(600):
                if proc.returncode is not None:
                    break
                with contextlib.suppress(httpx.TransportError):
                    if (await http.get(f"{url}/readyz")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        yield url, logs
    finally:
        proc.terminate()
        assert proc.stderr is not None
        err = await proc.stderr.read()
        await asyncio.wait_for(proc.wait(), 30)
        logs.extend(json.loads(line) for line in err.decode().splitlines() if line.startswith("{"))


def _one_line_error(result: subprocess.CompletedProcess[bytes], code: int) -> str:
    err = result.stderr.decode()
    assert result.returncode == code, err
    assert "Traceback" not in err
    # Warnings and the line naming the store a command opened are not the error.
    lines = [
        line for line in err.splitlines() if not line.startswith(("warning:", "compactd: store "))
    ]
    assert len(lines) == 1, err
    return lines[0]


def test_a_bad_since_is_one_line_and_exit_code_two(tmp_path: Path) -> None:
    line = _one_line_error(run("stats", "--since", "yesterday", data=tmp_path), 2)
    assert line.startswith("compactd: --since:")
    assert "'yesterday'" in line


@pytest.mark.parametrize("since", ["99999999d", "9999999999w"])
def test_a_since_too_far_back_is_one_line_and_exit_code_two(tmp_path: Path, since: str) -> None:
    line = _one_line_error(run("stats", "--since", since, data=tmp_path), 2)
    assert line.startswith("compactd: --since:")


@pytest.mark.parametrize("command", ["restore", "purge"])
@pytest.mark.parametrize("conversation", ["caf\u00e9", "a{b}", "x" * 300])
def test_an_impossible_conversation_id_is_one_line_and_exit_code_two(
    tmp_path: Path, command: str, conversation: str
) -> None:
    line = _one_line_error(run(command, conversation, data=tmp_path), 2)
    assert line.startswith("compactd: invalid conversation id")


def test_a_misspelled_environment_variable_stops_check_config_and_serve(tmp_path: Path) -> None:
    env = {**_env(tmp_path), "COMPACTD_UPSTREAM_ULR": "http://x"}
    for args in (["check-config"], ["serve", "--port", "1"]):
        result = subprocess.run(
            [PY, "-m", "proxy", *args], capture_output=True, env=env, timeout=60, check=False
        )
        line = _one_line_error(result, 2)
        assert "COMPACTD_UPSTREAM_ULR: unknown environment variable" in line
        assert "did you mean COMPACTD_UPSTREAM_URL?" in line


def test_an_api_key_in_allowed_keys_is_refused_without_being_echoed(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text('[upstream]\nallowed_keys = ["0123456789ab", "sk-live-abcdef123456"]\n')
    line = _one_line_error(run("check-config", str(config), data=tmp_path), 2)
    assert "upstream.allowed_keys[1]: must be a key id" in line
    assert "sk-live" not in line


def test_a_bad_provider_option_in_serve_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[default_policy]\nproviders = ["engine"]\n[default_policy.options.engine]\nworking_set = "no"\n'
    )
    line = _one_line_error(run("serve", "--config", str(config), "--port", "1", data=tmp_path), 2)
    assert "default_policy.options.engine.working_set: must be a number, not 'no'" in line


def test_compress_reads_the_configured_models_file(tmp_path: Path) -> None:
    models = tmp_path / "models.toml"
    models.write_text("[default]\ncontext_window = 1000\n")  # missing keys: must be reported
    config = tmp_path / "c.toml"
    config.write_text(f'[tokens]\nmodels_file = "{models}"\n')
    line = _one_line_error(run("compress", "--config", str(config), data=tmp_path, stdin=b""), 2)
    assert f"models file {models}" in line


def test_compress_shows_progress_on_a_terminal_and_nothing_in_a_pipe(tmp_path: Path) -> None:
    lines = [json.dumps({"id": str(i), "messages": history(6)}) for i in range(3)]
    stdin = ("\n".join(lines) + "\n").encode()
    piped = run("compress", data=tmp_path, stdin=stdin)
    assert piped.stderr == b""
    leader, follower = pty.openpty()
    try:
        result = subprocess.run(
            [PY, "-m", "proxy", "compress"],
            input=stdin,
            stdout=subprocess.PIPE,
            stderr=follower,
            env=_env(tmp_path),
            timeout=120,
            check=True,
        )
        os.close(follower)
        shown = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(leader)
    assert len(result.stdout.splitlines()) == 3
    assert b"compress: 3 lines" in shown
    assert b"0 errors" in shown


async def test_key_id_names_the_secret_serve_uses_and_matches_its_tenants(
    tmp_path: Path, upstream: tuple[object, str]
) -> None:
    data = tmp_path / "data"
    env = {k: v for k, v in _env(data).items() if k != "COMPACTD_SECRET"}
    key_id = subprocess.run(
        [PY, "-m", "proxy", "key-id", "-"],
        input=b"sk-team-a\n",
        capture_output=True,
        env=env,
        timeout=60,
        check=True,
    )
    printed = key_id.stdout.decode().strip()
    said = key_id.stderr.decode()
    assert f"secret: file {data / 'secret'}" in said
    assert "created now" in said
    # `serve` with the same data dir writes that key id on the key's request lines.
    _, url = upstream
    async with serving_with(env, url) as (proxy, logs), httpx.AsyncClient() as http:
        await http.post(
            f"{proxy}/v1/chat/completions",
            headers={"authorization": "Bearer sk-team-a"},
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
        )
    tenants = [r.get("tenant") for r in logs if r.get("logger") == "compactd.request"]
    assert tenants == [printed]


def test_key_id_says_when_the_secret_comes_from_the_environment(tmp_path: Path) -> None:
    result = run("key-id", "sk-abc", data=tmp_path)
    assert result.stdout.decode().strip() == key_fingerprint(b"test-secret", "sk-abc")
    assert "secret: environment variable COMPACTD_SECRET" in result.stderr.decode()


async def test_conversations_json_has_no_empty_placeholder_fields(tmp_path: Path) -> None:
    store = await SqliteStore.open(tmp_path / "compactd.db")
    try:
        await store.save_compaction(compaction("t1", "conv-1", short_history(6), 3), 3600)
    finally:
        await store.close()
    result = run("conversations", "--json", data=tmp_path)
    # stdout stays JSON; stderr names the store it read, once.
    assert result.stderr.decode() == (
        f"compactd: store sqlite {tmp_path / 'compactd.db'} (data dir {tmp_path})\n"
    )
    listed = json.loads(result.stdout)
    assert [c["conversation"] for c in listed] == ["conv-1"]
    assert not {"checkpoints", "originals", "refs"} & set(listed[0])  # a listing loads none
    assert listed[0]["tenant"] == "t1"
    assert listed[0]["checkpoint_count"] == 1
    assert listed[0]["size_bytes"] > 0
    table = run("conversations", data=tmp_path).stdout.decode()
    assert "last used (UTC)" in table
    assert "conv-1" in table


@pytest.mark.parametrize("key", ["", "Bearer "])
async def test_an_empty_key_is_refused_instead_of_meaning_every_tenant(
    tmp_path: Path, key: str
) -> None:
    # `compactd purge "$CONV" --key "$KEY"` with $KEY unset must not purge every tenant's.
    store = await SqliteStore.open(tmp_path / "compactd.db")
    try:
        await store.save_compaction(compaction("t1", "conv-1", short_history(6), 3), 3600)
    finally:
        await store.close()
    for args in (["purge", "conv-1"], ["restore", "conv-1"], ["conversations"], ["stats"]):
        line = _one_line_error(run(*args, "--key", key, data=tmp_path), 2)
        assert line.startswith("compactd: --key:")
    result = run("conversations", "--json", data=tmp_path)
    # stdout stays JSON; stderr names the store it read, once.
    assert result.stderr.decode() == (
        f"compactd: store sqlite {tmp_path / 'compactd.db'} (data dir {tmp_path})\n"
    )
    listed = json.loads(result.stdout)
    assert [c["conversation"] for c in listed] == ["conv-1"]


@pytest.mark.parametrize("command", ["conversations", "stats", "purge"])
def test_an_unreachable_redis_is_one_line_and_exit_code_one(command: str, tmp_path: Path) -> None:
    env = {**_env(tmp_path), "REDIS_URL": "redis://127.0.0.1:1/0"}
    args = [command, "x"] if command == "purge" else [command]
    result = subprocess.run(
        [PY, "-m", "proxy", *args], capture_output=True, env=env, timeout=60, check=False
    )
    line = _one_line_error(result, 1)
    assert line.startswith("compactd: ")
