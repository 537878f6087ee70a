from __future__ import annotations

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.errors import ProviderLoadError
from proxy.providers.base import CompactionResult, CompressionConfig, ContextProvider, Message
from proxy.providers.chain import run_chain
from proxy.providers.registry import (
    ProviderRegistry,
    get_context_provider,
    list_providers,
    register_provider,
)
from proxy.providers.trim import TrimProvider
from proxy.providers.uncompress import uncompress
from tests.providers.build import agent_run
from tests.providers.tokens import count_tokens, make_config

PLUGIN = Path(__file__).parent.parent / "plugins" / "example_provider"


class Custom(ContextProvider):
    name = "custom"

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        return CompactionResult(messages=list(messages), source_digest="")


def test_builtins_are_found_through_their_entry_points() -> None:
    names = ProviderRegistry().names()
    assert {"trim", "middle-out", "none"} <= set(names)
    assert names == sorted(names)


def test_get_returns_a_new_instance_each_time() -> None:
    registry = ProviderRegistry()
    first, second = registry.get("trim"), registry.get("trim")
    assert isinstance(first, TrimProvider)
    assert first is not second


def test_unknown_provider_names_what_is_available() -> None:
    with pytest.raises(
        ValueError, match=r"Unknown context provider: 'nope'\. Available: \[.*'trim'"
    ):
        ProviderRegistry().get("nope")


def test_register_rejects_what_is_not_a_provider_class() -> None:
    with pytest.raises(TypeError):
        ProviderRegistry().register("bad", dict)  # type: ignore[arg-type]


def test_an_explicit_registration_wins_over_an_entry_point_of_the_same_name() -> None:
    registry = ProviderRegistry()
    registry.register("trim", Custom)
    assert isinstance(registry.get("trim"), Custom)


def test_registering_again_replaces_the_class() -> None:
    registry = ProviderRegistry()
    registry.register("x", TrimProvider)
    registry.register("x", Custom)
    assert isinstance(registry.get("x"), Custom)


def test_seed_style_functions_work_on_an_explicit_registry() -> None:
    registry = ProviderRegistry()
    register_provider("custom", Custom, registry)
    assert "custom" in list_providers(registry)
    assert isinstance(get_context_provider("custom", registry), Custom)


@pytest.fixture
def broken_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """An installed distribution whose provider module fails to import."""
    info = tmp_path / "broken_plugin-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[compactd.providers]\nbroken = broken_plugin:Provider\n"
    )
    (tmp_path / "broken_plugin.py").write_text("raise ImportError('needs libfoo')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("broken_plugin", None)


@pytest.mark.usefixtures("broken_plugin")
def test_a_broken_plugin_does_not_hide_the_others_until_it_is_enabled() -> None:
    registry = ProviderRegistry()
    assert "trim" in registry.names()
    assert "broken" not in registry.names()
    info = {i.name: i for i in registry.describe()}
    assert info["broken"].error == "ImportError: needs libfoo"
    assert info["trim"].source == "proxy.providers.trim:TrimProvider"
    assert set(registry.load_enabled(["trim"])) == {"trim"}


@pytest.mark.usefixtures("broken_plugin")
def test_enabling_a_broken_plugin_stops_start_up_with_its_name_and_error() -> None:
    with pytest.raises(
        ProviderLoadError, match=r"'broken' \(broken_plugin:Provider\).*ImportError: needs libfoo"
    ):
        ProviderRegistry().load_enabled(["trim", "broken"])


def test_enabling_an_unknown_provider_stops_start_up() -> None:
    with pytest.raises(ProviderLoadError, match="Unknown context provider: 'typo'"):
        ProviderRegistry().load_enabled(["typo"])


def test_a_provider_that_cannot_be_created_stops_start_up() -> None:
    class Needy(Custom):
        def __init__(self, required: str) -> None:
            self.required = required

    registry = ProviderRegistry()
    registry.register("needy", Needy)
    with pytest.raises(ProviderLoadError, match="'needy' could not be created: TypeError"):
        registry.load_enabled(["needy"])


def _pip(*args: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        check=True,
        capture_output=True,
    )


@pytest.fixture
def installed_plugin(tmp_path: Path) -> Iterator[None]:
    """tests/plugins/example_provider, pip-installed into this venv for the test's duration."""
    build = tmp_path / "src"
    # Build from a copy so the source folder stays clean.
    subprocess.run(["cp", "-r", str(PLUGIN), str(build)], check=True)
    _pip("install", "--no-index", "--no-deps", str(build))
    importlib.invalidate_caches()
    try:
        yield
    finally:
        _pip("uninstall", "-y", "compactd-example-provider")
        sys.modules.pop("compactd_example_provider", None)
        importlib.invalidate_caches()


@pytest.mark.usefixtures("installed_plugin")
async def test_a_pip_installed_third_party_provider_is_found_and_used() -> None:
    registry = ProviderRegistry()
    assert "short-tools" in registry.names()
    provider = registry.load_enabled(["short-tools"])["short-tools"]
    msgs = agent_run(6, result_tokens=400)
    config = make_config(limit=count_tokens(msgs) // 2, extra_config={"keep_chars": 100})
    outcome = await run_chain(msgs, [provider], config)
    assert outcome.providers == ("short-tools",)
    assert outcome.violations == ()
    assert outcome.tokens_after < outcome.tokens_before
    assert outcome.result is not None
    assert uncompress(outcome.result.messages, outcome.result.verbatim).messages == msgs


@pytest.mark.usefixtures("installed_plugin")
async def test_a_pip_installed_provider_runs_inside_the_proxy(upstream, make_proxy) -> None:
    import httpx

    from proxy.runtime.digest import canonical_message

    fake, base = upstream
    msgs = agent_run(6, result_tokens=400)
    policy = {
        "providers": ["short-tools"],
        "budget_tokens": count_tokens(msgs) * 6 // 10,
        "options": {"short-tools": {"keep_chars": 100}},
    }
    key = {"authorization": "Bearer sk-plugin"}
    async with (
        make_proxy(base, default_policy=policy) as url,
        httpx.AsyncClient(headers=key) as http,
    ):
        r = await http.post(
            f"{url}/v1/chat/completions", json={"model": "gpt-4o", "messages": msgs}
        )
        restored = await http.post(
            f"{url}/compactd/v1/uncompress", json={"messages": fake.last.json()["messages"]}
        )
    assert r.headers["x-compactd-action"] == "compacted"
    assert r.headers["x-compactd-provider"] == "short-tools"
    assert b"shortened" in fake.last.body
    # Messages the proxy forwarded untouched went out in canonical form (nulls dropped).
    assert [canonical_message(m) for m in restored.json()["messages"]] == [
        canonical_message(m) for m in msgs
    ]
