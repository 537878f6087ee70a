"""The `compactd` command as a user runs it: real processes, real sockets, the real store."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import openai
import pytest

from tests.inprocess import running
from tests.live.test_compaction_e2e import history

PY = sys.executable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTD_")}
    env["COMPACTD_DATA_DIR"] = str(data)
    env["COMPACTD_SECRET"] = "test-secret"
    return env


@asynccontextmanager
async def serving(config: Path, data: Path, upstream: str, *extra: str) -> AsyncIterator[str]:
    port = _free_port()
    proc = await asyncio.create_subprocess_exec(
        PY,
        "-m",
        "proxy",
        "serve",
        "--config",
        str(config),
        "--port",
        str(port),
        "--upstream",
        upstream,
        *extra,
        env=_env(data),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as http:
            for _ in range(600):
                if proc.returncode is not None:
                    raise RuntimeError((await proc.stderr.read()).decode()[-2000:])
                try:
                    if (await http.get(f"{url}/readyz")).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


def run(*args: str, data: Path, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [PY, "-m", "proxy", *args],
        input=stdin,
        capture_output=True,
        env=_env(data),
        timeout=120,
        check=False,
    )


def run_into_a_closed_pipe(
    *args: str, data: Path, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """`compactd … | head` once head has gone: stdout is a pipe whose reader is closed."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [PY, "-m", "proxy", *args],
            input=stdin,
            stdout=write,
            stderr=subprocess.PIPE,
            env=_env(data),
            timeout=120,
            check=False,
        )
    finally:
        os.close(write)


@pytest.fixture
def small_config(tmp_path: Path) -> Path:
    path = tmp_path / "compactd.toml"
    path.write_text("[default_policy]\nbudget_tokens = 600\n")
    return path


@pytest.mark.parametrize("workers", ["1", "2"])
async def test_serve_relays_chat_with_one_or_more_workers(
    upstream, small_config, tmp_path, workers
) -> None:
    fake, base = upstream
    async with serving(small_config, tmp_path / "data", base, "--workers", workers) as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-cli", max_retries=0)
        raw = await client.chat.completions.with_raw_response.create(
            model="gpt-4o", messages=history(1)
        )
        raw.parse()
        await client.close()
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{url}/metrics")).text
    assert raw.headers["x-compactd-action"] == "passthrough"
    assert fake.last.json()["messages"] == history(1)
    assert "compactd_requests_total" in metrics


async def test_conversations_restore_and_purge_read_what_the_proxy_stored(
    upstream, small_config, tmp_path
) -> None:
    _, base = upstream
    data = tmp_path / "data"
    original = history(6)
    async with serving(small_config, data, base) as url:
        async with httpx.AsyncClient() as http:
            r = await http.post(
                f"{url}/v1/chat/completions",
                json={"model": "gpt-4o", "messages": original},
                headers={"authorization": "Bearer sk-cli"},
            )
    assert r.headers["x-compactd-action"] == "compacted"
    conv = r.headers["x-compactd-conversation"]
    listed = run("conversations", "--config", str(small_config), "--json", data=data)
    assert listed.returncode == 0, listed.stderr
    assert [c["conversation"] for c in json.loads(listed.stdout)] == [conv]
    restored = run("restore", conv, "--config", str(small_config), data=data)
    assert restored.returncode == 0, restored.stderr
    out = json.loads(restored.stdout)
    assert out["missing_ids"] == []
    # Restoring the checkpoint gives back the originals it covers, verbatim.
    assert out["messages"] == original[: out["covered_through"] + 1]
    other = run(
        "restore", conv, "--key", "sk-someone-else", "--config", str(small_config), data=data
    )
    assert other.returncode == 1
    assert run("purge", conv, "--config", str(small_config), data=data).returncode == 0
    assert (
        json.loads(run("conversations", "--json", "--config", str(small_config), data=data).stdout)
        == []
    )


def test_check_config_names_the_bad_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[upstream]\nurl = "ftp://x"\n')
    result = run("check-config", str(bad), data=tmp_path)
    assert result.returncode == 2
    assert b"upstream.url" in result.stderr


def test_key_id_prints_the_fingerprint_policies_match(tmp_path: Path) -> None:
    from proxy.wire.tenant import key_fingerprint

    result = run("key-id", "sk-abc", data=tmp_path)
    assert result.stdout.decode().strip() == key_fingerprint(b"test-secret", "sk-abc")


def test_key_id_ignores_how_the_scheme_is_spelled(tmp_path: Path) -> None:
    from proxy.wire.tenant import Tenancy

    result = run("key-id", "basic\tdXNlcg==", data=tmp_path)
    served = Tenancy(b"test-secret").identify({"authorization": "Basic dXNlcg=="})
    assert result.stdout.decode().strip() == served.fingerprint


@pytest.mark.parametrize("given", ["argument", "stdin"])
async def test_key_id_of_a_non_ascii_key_is_the_one_the_server_computes(
    tmp_path: Path, given: str
) -> None:
    key = "sk-clé-ü"
    if given == "argument":
        result = run("key-id", key, data=tmp_path)
    else:
        result = run("key-id", "-", data=tmp_path, stdin=key.encode() + b"\n")
    async with running(tmp_path, server={"secret": "test-secret"}) as proxy:
        sent = [(b"authorization", b"Bearer " + key.encode())]  # the bytes a client sends
        me = (await proxy.client.get("/compactd/v1/me", headers=sent)).json()

    assert result.stdout.decode().strip() == me["key_id"]


def test_providers_lists_the_builtins(tmp_path: Path) -> None:
    out = run("providers", data=tmp_path).stdout.decode()
    for name in ("trim", "engine", "summarize", "middle-out", "none"):
        assert name in out


def test_compress_writes_one_line_per_input_line_in_order(tmp_path: Path) -> None:
    lines = [
        json.dumps({"id": "a", "messages": history(6), "budget": 0.5}),
        "not json",
        json.dumps({"id": "c", "messages": history(2), "budget": 100000}),
    ]
    result = run("compress", data=tmp_path, stdin=("\n".join(lines) + "\n").encode())
    out = [json.loads(x) for x in result.stdout.decode().splitlines()]
    assert [o.get("id") for o in out] == ["a", None, "c"]
    assert out[0]["stats"]["fits"] is True
    assert out[0]["stats"]["tokens_after"] <= out[0]["stats"]["budget"]
    assert "error" in out[1]
    assert out[2]["messages"] == history(2)


def test_compress_answers_a_blank_line_with_an_error_line_in_its_place(tmp_path: Path) -> None:
    lines = [
        json.dumps({"id": "a", "messages": history(2), "budget": 100000}),
        "",
        "   ",
        json.dumps({"id": "d", "messages": history(2), "budget": 100000}),
    ]
    result = run("compress", data=tmp_path, stdin=("\n".join(lines) + "\n").encode())
    assert result.returncode == 0, result.stderr
    out = [json.loads(x) for x in result.stdout.decode().splitlines()]
    # Line n of the output answers line n of the input (paste, join and diff rely on it).
    assert [o.get("id") for o in out] == ["a", None, None, "d"]
    assert "blank line" in out[1]["error"]
    assert "blank line" in out[2]["error"]


def compress_lines(lines: list[str], tmp_path: Path) -> list[dict[str, object]]:
    """`compactd compress` over these lines: its output lines, read."""
    result = run("compress", data=tmp_path, stdin=("\n".join(lines) + "\n").encode())
    assert result.returncode == 0, result.stderr
    return [json.loads(x) for x in result.stdout.decode().splitlines()]


def test_compress_answers_a_line_holding_an_integer_beyond_64_bits_with_an_error(
    tmp_path: Path,
) -> None:
    wide = [*history(6), {"role": "user", "content": "go", "n": 2**64}]
    lines = [
        json.dumps({"id": "wide", "messages": wide, "budget": 0.5}),
        json.dumps({"id": "next", "messages": history(2), "budget": 100000}),
    ]
    out = compress_lines(lines, tmp_path)
    # Its messages would have come back with 1.8446744073709552e+19 in them.
    assert [o.get("id") for o in out] == ["wide", "next"]
    assert "64 bits" in out[0]["error"]


def test_compress_into_a_reader_that_has_gone_stops_quietly(tmp_path: Path) -> None:
    line = json.dumps({"messages": history(2), "budget": 100000})
    result = run_into_a_closed_pipe("compress", data=tmp_path, stdin=(line + "\n").encode() * 50)
    # As a Unix tool ended by SIGPIPE: no error message, the shell's 128 + SIGPIPE status.
    assert result.stderr == b""
    assert result.returncode == 141


def test_compress_answers_a_budget_past_any_token_count_with_an_error_line_and_goes_on(
    tmp_path: Path,
) -> None:
    lines = [
        json.dumps({"id": "huge", "messages": history(2), "budget": 1e300}),
        json.dumps({"id": "next", "messages": history(2), "budget": 100000}),
    ]
    out = compress_lines(lines, tmp_path)
    assert [o.get("id") for o in out] == ["huge", "next"]
    assert "budget" in out[0]["error"]
    assert out[1]["messages"] == history(2)


def test_check_config_rejects_a_misspelled_provider_option(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[default_policy]\nproviders = ["trim", "engine"]\n[default_policy.options.engine]\nfuzy_dedup = true\n'
    )
    result = run("check-config", str(bad), data=tmp_path)
    assert result.returncode == 2
    assert b"options.engine" in result.stderr
    assert b"fuzy_dedup" in result.stderr
