"""The start-up banner: one structured record, a readable block on a terminal, real warnings."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import time
from pathlib import Path

import httpx

from proxy.cli.banner import describe, masked_url, render
from proxy.config import load_settings
from tests.cli.test_cli import PY, _env, _free_port
from tests.cli.test_cli_use import serving_with
from tests.store.redis_server import RedisServer


def test_the_banner_names_everything_an_operator_asks_about_first(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[server]\nworkers = 2\nadmin_key = "adm"\nshared_anonymous_tenant = true\n[upstream]\nurl = "http://llm.internal:8000/v1"\n'
        '[[policies]]\nname = "search"\nmatch_header = "x-team"\nmode = "shadow"\n'
        'providers = ["engine", "trim"]\n'
    )
    settings = load_settings(config, env={"COMPACTD_DATA_DIR": str(tmp_path / "d")})
    banner = describe(settings, str(config), ["redis is evicting"], env={})
    text = render(banner)
    assert text.startswith("compactd 0.1.0 on http://127.0.0.1:8787 (2 workers)\n")
    for expected in (
        "upstream   http://llm.internal:8000/v1 (clients' own keys)",
        f"store      sqlite {tmp_path / 'd' / 'compactd.db'}",
        f"data dir   {tmp_path / 'd'}",
        f"secret     file {tmp_path / 'd' / 'secret'} (new: generated at start-up)",
        f"config     {config}",
        "policy     search: shadow, engine+trim, header x-team",
        "policy     default: enforce, engine",
        "dashboard  http://127.0.0.1:8787/compactd/ui/ (sign in with the admin key or a client key)",
        "warning    anonymous mode (server.shared_anonymous_tenant):",
        "warning    redis is evicting",
    ):
        assert expected in text, expected
    record = banner.record()
    assert record["store"] == "sqlite"
    assert record["policies"][0] == {
        "name": "search",
        "mode": "shadow",
        "providers": ["engine", "trim"],
        "matches": "header x-team",
    }


def test_the_default_upstream_without_a_key_is_a_warning_and_passwords_never_show() -> None:
    settings = load_settings(None, env={"REDIS_URL": "redis://user:hunter2@cache:6380/1"})
    banner = describe(settings, None, env={})
    assert banner.store_location == "redis://user:***@cache:6380/1"
    assert "hunter2" not in render(banner)
    assert any("upstream.url is the default" in w for w in banner.warnings)
    assert masked_url("https://api.example.com/v1") == "https://api.example.com/v1"


def test_upstream_key_mode_without_allowed_keys_is_a_warning() -> None:
    env = {"COMPACTD_UPSTREAM_API_KEY": "sk-real", "COMPACTD_UPSTREAM_URL": "http://x/v1"}
    banner = describe(load_settings(None, env=env), None, env={})
    assert banner.upstream_key_mode
    assert any("every request gets 401" in w for w in banner.warnings)
    assert not any("anonymous" in w for w in banner.warnings)
    assert "sk-real" not in render(banner)


def test_every_upstream_is_named_and_the_split_case_is_a_warning() -> None:
    split = {"COMPACTD_UPSTREAM_URL": "http://llm.internal/v1"}
    banner = describe(load_settings(None, env=split), None, env={})
    assert banner.upstreams == {
        "openai": "http://llm.internal/v1",
        "anthropic": "https://api.anthropic.com",
    }
    text = render(banner)
    assert "  anthropic  https://api.anthropic.com (clients' own keys)\n" in text
    assert (
        "upstream.url is http://llm.internal/v1 but Anthropic traffic (/v1/messages, Claude "
        "Code) still goes to https://api.anthropic.com" in text
    )
    both = {**split, "COMPACTD_UPSTREAM_ANTHROPIC_URL": "http://claude.internal"}
    banner = describe(load_settings(None, env=both), None, env={})
    assert banner.upstreams["anthropic"] == "http://claude.internal"
    assert not any("Anthropic traffic" in w for w in banner.warnings)
    # The defaults for both are not a split: nothing is sent anywhere unexpected.
    assert not any(
        "Anthropic traffic" in w
        for w in describe(load_settings(None, env={}), None, env={}).warnings
    )


def test_a_cap_that_never_applies_is_a_warning() -> None:
    claude = {
        "name": "claude",
        "match_apis": ["messages"],
        "budget_tokens": 50000,
        "cap_apis": ["chat.completions", "responses"],
    }
    sized = {"name": "sized", "match_apis": ["messages"]}  # the built-in cap applies: no warning
    env = {"COMPACTD_UPSTREAM_URL": "http://x/v1"}
    settings = load_settings(None, env=env, overrides={"policies": [claude, sized]})
    warned = [w for w in describe(settings, None, env={}).warnings if "cap_apis" in w]
    assert warned == [
        "policies[0] (claude): budget_tokens / budget_fraction never apply, none of its "
        "match_apis is in its cap_apis"
    ]


async def test_serve_writes_one_startup_record_with_an_evicting_redis_warning(
    tmp_path: Path, upstream: tuple[object, str]
) -> None:
    server = RedisServer(tmp_path, extra=("--maxmemory-policy", "allkeys-lru"))
    server.start()
    try:
        env = {
            **_env(tmp_path / "data"),
            "REDIS_URL": server.url,
            "COMPACTD_SERVER_SHARED_ANONYMOUS_TENANT": "true",
        }
        _, url = upstream
        async with serving_with(env, url) as (proxy, logs), httpx.AsyncClient() as http:
            assert (await http.get(f"{proxy}/healthz")).status_code == 200
    finally:
        server.stop()
    startup = [r for r in logs if r.get("logger") == "compactd.startup"]
    assert len(startup) == 1
    record = startup[0]
    assert record["level"] == "warning"
    assert record["store"] == "redis"
    assert record["store_location"] == server.url
    assert record["upstreams"] == {"openai": url, "anthropic": "https://api.anthropic.com"}
    assert any("Anthropic traffic" in w for w in record["warnings"])
    assert record["workers"] == 1
    assert record["secret"] == "environment variable COMPACTD_SECRET"
    assert any("allkeys-lru" in w for w in record["warnings"])
    assert any("anonymous mode" in w for w in record["warnings"])
    assert not any("***" in w for w in record["warnings"])  # redaction left the text alone
    # JSON lines carry no terminal colour codes (uvicorn's `color_message`).
    assert not any("color_message" in r for r in logs)


def test_serve_on_a_terminal_prints_the_readable_block(tmp_path: Path) -> None:
    port = _free_port()
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [PY, "-m", "proxy", "serve", "--port", str(port), "--upstream", "http://127.0.0.1:9/v1"],
        stdout=subprocess.DEVNULL,
        stderr=follower,
        env=_env(tmp_path),
    )
    os.close(follower)
    shown = io.BytesIO()
    deadline = time.monotonic() + 60
    try:
        while b"Application startup complete" not in shown.getvalue():
            assert time.monotonic() < deadline, shown.getvalue().decode()
            ready, _, _ = select.select([leader], [], [], 0.5)
            if ready:
                shown.write(os.read(leader, 65536))
    finally:
        proc.terminate()
        proc.wait(30)
        os.close(leader)
    text = shown.getvalue().decode()
    assert f"compactd 0.1.0 on http://127.0.0.1:{port} (1 worker)" in text
    assert "  upstream   http://127.0.0.1:9/v1 (clients' own keys)" in text
    assert "  anthropic  https://api.anthropic.com (clients' own keys)" in text
    assert "  warning    upstream.url is http://127.0.0.1:9/v1 but Anthropic traffic" in text
    assert f"  store      sqlite {tmp_path / 'compactd.db'}" in text
    assert "\x1b[" not in text  # neither the block nor the JSON lines carry colour codes


async def test_a_response_through_serve_has_exactly_one_date_header(
    tmp_path: Path, upstream: tuple[object, str]
) -> None:
    _, url = upstream
    async with serving_with(_env(tmp_path), url) as (proxy, _), httpx.AsyncClient() as http:
        relayed = await http.get(f"{proxy}/v1/models")
        chat = await http.post(
            f"{proxy}/v1/chat/completions",
            json={"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]},
        )
        own = await http.get(f"{proxy}/healthz")
        missing = await http.get(f"{proxy}/nowhere")
    for response in (relayed, chat, own, missing):
        assert len(response.headers.get_list("date")) == 1, response.headers
        assert len(response.headers.get_list("server")) <= 1
