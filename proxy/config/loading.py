"""Loading the settings: one precedence, CLI > environment > file > defaults.

The TOML file, the `COMPACTD_*` environment variables and the CLI's overrides are merged into
one table, which `proxy.runtime.options.parse` checks against the schema (`settings.py`). An
unknown key or variable, a bad value: start-up stops with a message naming the key (and the key
it was probably meant to be). Every problem of a load is reported at once, not one per attempt.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from proxy.config.settings import (
    AccountingSettings,
    LimitsSettings,
    PolicySettings,
    ServerSettings,
    Settings,
    StoreSettings,
    TokenSettings,
    UpstreamSettings,
)
from proxy.errors import ConfigError
from proxy.runtime.options import collecting, did_you_mean, parse

# Environment variables that set one key each; COMPACTD_<SECTION>_<KEY> works for every scalar.
ENV_ALIASES: dict[str, str] = {
    "COMPACTD_UPSTREAM_URL": "upstream.url",
    "COMPACTD_UPSTREAM_API_KEY": "upstream.api_key",
    "COMPACTD_SECRET": "server.secret",
    "COMPACTD_ADMIN_KEY": "server.admin_key",
    "COMPACTD_DATA_DIR": "server.data_dir",
    "REDIS_URL": "store.url",
    "COMPACTD_STORE_URL": "store.url",
}


CONFIG_FILE_ENV = "COMPACTD_CONFIG_FILE"
"""The config file when no --config is given (the CLI also hands it to its workers this way)."""

ENV_PREFIX = "COMPACTD_"
# Not settings, but ours: the test suite's own variables.
_ENV_IGNORED_PREFIXES = ("COMPACTD_TEST_",)


_SECTION_TYPES: dict[str, type[Any]] = {
    "server": ServerSettings,
    "upstream": UpstreamSettings,
    "store": StoreSettings,
    "tokens": TokenSettings,
    "accounting": AccountingSettings,
    "limits": LimitsSettings,
    "default_policy": PolicySettings,
}


def _set_dotted(table: dict[str, Any], dotted: str, value: Any) -> None:
    section, key = dotted.split(".", 1)
    table.setdefault(section, {})[key] = value


def env_overrides(env: Mapping[str, str]) -> dict[str, Any]:
    """Settings given by environment variables, as a nested table."""
    table: dict[str, Any] = {}
    for section, cls in _SECTION_TYPES.items():
        for f in dataclasses.fields(cls):
            name = f"COMPACTD_{section.upper()}_{f.name.upper()}"
            if name in env:
                _set_dotted(table, f"{section}.{f.name}", env[name])
    for name, dotted in ENV_ALIASES.items():
        if env.get(name):
            _set_dotted(table, dotted, env[name])
    return table


def known_env_names() -> frozenset[str]:
    """Every COMPACTD_* environment variable compactd reads."""
    names = {
        f"COMPACTD_{section.upper()}_{f.name.upper()}"
        for section, cls in _SECTION_TYPES.items()
        for f in dataclasses.fields(cls)
    }
    return frozenset({*names, *ENV_ALIASES, CONFIG_FILE_ENV})


def unknown_env(env: Mapping[str, str]) -> list[str]:
    """One message per COMPACTD_* variable that sets nothing (a misspelling), with a suggestion."""
    known = known_env_names()
    problems = []
    for name in sorted(env):
        if not name.startswith(ENV_PREFIX) or name in known:
            continue
        if name.startswith(_ENV_IGNORED_PREFIXES):
            continue
        problems.append(f"{name}: unknown environment variable{did_you_mean(name, known)}")
    return problems


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def load_settings(
    path: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Load and validate settings: `overrides` (CLI) > `env` > the TOML file > defaults."""
    table: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as fh:
                table = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"config file {path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path}: {exc}") from None
    environ = os.environ if env is None else env
    # A misspelled variable is a misspelled key: it stops start-up instead of being ignored.
    problems = unknown_env(environ)
    table = _merge(table, env_overrides(environ))
    if overrides:
        table = _merge(table, overrides)
    with collecting(problems):
        try:
            settings = parse(Settings, table, strings=True)
            settings.validate()
        except (TypeError, ValueError):
            if not problems:  # a check that trusted an earlier one that failed: those explain it
                raise
    if problems:
        raise ConfigError("; ".join(problems), problems)
    return settings


def data_dir(settings: Settings) -> Path:
    """Where the embedded store, the server secret and the encodings live."""
    if settings.server.data_dir:
        return Path(settings.server.data_dir).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "compactd"
