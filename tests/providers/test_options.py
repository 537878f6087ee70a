"""Provider options are typed and checked by the host, from the schema a provider declares."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from proxy.app.services import check_provider_options, check_settings
from proxy.config import load_settings
from proxy.errors import ConfigError
from proxy.providers.base import (
    CompactionResult,
    CompressionConfig,
    ContextProvider,
    Message,
    OptionError,
    option,
    parse_options,
)
from proxy.providers.registry import ProviderRegistry, check_options


@dataclass(frozen=True)
class Inner:
    depth: int = option(2, minimum=0, maximum=5)


@dataclass(frozen=True)
class Schema:
    flag: bool = True
    count: int = option(3, minimum=1)
    ratio: float = option(0.5, above=0, maximum=1)
    label: str = "x"
    roles: tuple[str, ...] = ("system",)
    inner: Inner = Inner()
    raw: Mapping[str, Any] | None = option(None, schema=Inner)


def test_valid_options_come_back_typed_with_defaults_for_the_rest() -> None:
    got = parse_options(Schema, {"ratio": 1, "roles": ["user", "tool"], "inner": {"depth": 4}})
    assert got == Schema(ratio=1.0, roles=("user", "tool"), inner=Inner(depth=4))
    assert isinstance(got.ratio, float)


@pytest.mark.parametrize(
    ("values", "key", "why"),
    [
        ({"flag": "yes"}, "p.flag", "must be true or false, not 'yes'"),
        ({"flag": 1}, "p.flag", "must be true or false, not 1"),
        ({"count": True}, "p.count", "must be an integer, not True"),
        ({"count": 2.5}, "p.count", "must be an integer, not 2.5"),
        ({"count": 0}, "p.count", "must be >= 1, not 0"),
        ({"ratio": 0}, "p.ratio", "must be > 0, not 0.0"),
        ({"ratio": 1.5}, "p.ratio", "must be <= 1, not 1.5"),
        ({"label": 3}, "p.label", "must be a string, not 3"),
        ({"roles": "user"}, "p.roles", "must be a list, not 'user'"),
        ({"roles": ["user", 7]}, "p.roles[1]", "must be a string, not 7"),
        ({"inner": {"depth": 9}}, "p.inner.depth", "must be <= 5, not 9"),
        ({"inner": {"deep": 1}}, "p.inner.deep", "unknown option (known: depth)"),
        ({"raw": {"depth": -1}}, "p.raw.depth", "must be >= 0, not -1"),
        ({"ratoi": 0.2}, "p.ratoi", "unknown option"),
    ],
)
def test_a_bad_option_is_named_by_its_full_key(values: dict[str, Any], key: str, why: str) -> None:
    with pytest.raises(OptionError) as caught:
        parse_options(Schema, values, "p")
    assert caught.value.key == key
    assert caught.value.why.startswith(why)


def test_a_nested_mapping_field_keeps_the_table_as_given() -> None:
    assert parse_options(Schema, {"raw": {"depth": 1}}).raw == {"depth": 1}


class _Loose(ContextProvider):
    name = "loose"

    def compress(self, messages: list[Message], config: CompressionConfig) -> CompactionResult:
        raise NotImplementedError


class _Crashing(_Loose):
    name = "crashing"

    def check_options(self, options: Mapping[str, Any]) -> None:
        raise KeyError("boom")


def test_a_provider_that_declares_no_options_accepts_none() -> None:
    check_options(_Loose(), {}, "default_policy.options.loose")
    with pytest.raises(OptionError) as caught:
        check_options(_Loose(), {"keep": 1}, "default_policy.options.loose")
    assert caught.value.key == "default_policy.options.loose.keep"


def test_a_plugin_whose_own_check_crashes_gives_an_error_not_a_traceback() -> None:
    with pytest.raises(OptionError, match="checking failed \\(KeyError"):
        check_options(_Crashing(), {"x": 1}, "default_policy.options.crashing")


def _settings(toml: str, tmp_path: Any) -> Any:
    path = tmp_path / "c.toml"
    path.write_text(toml)
    return load_settings(path, env={})


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            '[[policies]]\nname = "a"\nmatch_models = ["x*"]\nproviders = ["engine"]\n'
            '[policies.options.engine]\nworking_set = "yes"\n',
            "policies[0].options.engine.working_set: must be a number, not 'yes'",
        ),
        (
            '[default_policy]\nproviders = ["summarize"]\n'
            "[default_policy.options.summarize.engine]\nrelevance = true\n",
            "default_policy.options.summarize.engine.relevance: must be a number, not True",
        ),
        (
            '[default_policy]\nproviders = ["trim"]\n[default_policy.options.trim]\n'
            "preview_chars = 1.5\n",
            "default_policy.options.trim.preview_chars: must be an integer, not 1.5",
        ),
        (
            '[default_policy]\nproviders = ["middle-out"]\n'
            "[default_policy.options.middle-out]\nkeep = 1\n",
            "default_policy.options.middle-out.keep: unknown option",
        ),
    ],
)
def test_built_in_providers_options_are_typed_by_the_host(
    toml: str, message: str, tmp_path: Any
) -> None:
    settings = _settings(toml, tmp_path)
    with pytest.raises(ConfigError) as caught:
        check_settings(settings)
    assert str(caught.value).startswith(message)


def test_every_built_in_provider_declares_a_schema_or_takes_no_options() -> None:
    registry = ProviderRegistry()
    for name in ("trim", "engine", "summarize"):
        assert registry.get(name).option_schema is not None, name
    settings = load_settings(None, env={})
    check_provider_options(settings, registry.load_enabled(list(settings.default_policy.providers)))


def test_the_plugin_api_with_its_validator_and_errors_imports_only_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules); import proxy.providers.base; "
        "new = {m.split('.')[0] for m in set(sys.modules) - before}; "
        "print(sorted(new - set(sys.stdlib_module_names)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, text=True)
    assert out.stdout.strip() == "['proxy']"
