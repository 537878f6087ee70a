"""Typed, validated settings: the schema (`settings.py`) and how it is loaded (`loading.py`).

One precedence: CLI > environment > file > defaults. Unknown keys and bad values stop start-up
with a message naming the key, so a misspelled setting fails at load time rather than being
silently ignored. The names below are the package's public face; import them from here.
"""

from __future__ import annotations

from proxy.config.loading import (
    CONFIG_FILE_ENV,
    ENV_ALIASES,
    data_dir,
    env_overrides,
    known_env_names,
    load_settings,
    unknown_env,
)
from proxy.config.settings import (
    APIS,
    DEFAULT_ANTHROPIC_UPSTREAM,
    DEFAULT_UPSTREAM,
    KEY_ID,
    MAX_COMPACTION_TIMEOUT_MS,
    MIN_ADMIN_KEY_CHARS,
    AccountingSettings,
    LimitsSettings,
    Mode,
    PolicySettings,
    ServerSettings,
    Settings,
    StoreErrorMode,
    StoreSettings,
    TokenSettings,
    Transport,
    UpstreamSettings,
    admin_key_weakness,
)

__all__ = [
    "APIS",
    "CONFIG_FILE_ENV",
    "DEFAULT_ANTHROPIC_UPSTREAM",
    "DEFAULT_UPSTREAM",
    "ENV_ALIASES",
    "KEY_ID",
    "MAX_COMPACTION_TIMEOUT_MS",
    "MIN_ADMIN_KEY_CHARS",
    "AccountingSettings",
    "LimitsSettings",
    "Mode",
    "PolicySettings",
    "ServerSettings",
    "Settings",
    "StoreErrorMode",
    "StoreSettings",
    "TokenSettings",
    "Transport",
    "UpstreamSettings",
    "admin_key_weakness",
    "data_dir",
    "env_overrides",
    "known_env_names",
    "load_settings",
    "unknown_env",
]
