"""Typed, validated settings. One precedence: CLI > environment > file > defaults.

Unknown keys and bad values stop start-up with a message naming the key (and the key it was
probably meant to be), so a misspelled setting fails at load time rather than being silently
ignored. Every problem of a load is reported at once, not one per attempt.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from proxy.config_errors import check as _check
from proxy.config_errors import collecting, did_you_mean, problem, require
from proxy.errors import ConfigError

DEFAULT_UPSTREAM = "https://api.openai.com/v1"
DEFAULT_ANTHROPIC_UPSTREAM = "https://api.anthropic.com"

Mode = Literal["enforce", "shadow", "off"]
APIS = ("chat.completions", "responses", "messages")
"""The compacted APIs, by the names policies (`match_apis`), headers and metrics use."""
StoreErrorMode = Literal["forward-original", "compact-unstored"]
Transport = Literal["aiohttp", "httpx"]


_HEADER_NAME = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+")


MAX_COMPACTION_TIMEOUT_MS = 600_000
"""Ten minutes: a longer chain deadline is a hang by another name (clients gave up long before)."""

KEY_ID = re.compile(r"[0-9a-f]{12}")
"""A key id (`compactd key-id <key>`): the first 12 hex digits of the key's HMAC."""


MIN_ADMIN_KEY_CHARS = 16
"""The shortest admin key `check-config` accepts (it reads every tenant's conversations)."""


def admin_key_weakness(key: str) -> str | None:
    """Why an admin key is too weak to guard every tenant's data, or None (empty: no admin)."""
    if not key:
        return None
    if len(key) < MIN_ADMIN_KEY_CHARS:
        return f"server.admin_key is shorter than {MIN_ADMIN_KEY_CHARS} characters"
    if len(set(key)) < MIN_ADMIN_KEY_CHARS // 2:
        return f"server.admin_key has fewer than {MIN_ADMIN_KEY_CHARS // 2} distinct characters"
    return None


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8787
    workers: int = 1
    max_body_bytes: int = 32 * 1024 * 1024
    max_header_bytes: int = 64 * 1024
    max_api_body_bytes: int = 8 * 1024 * 1024
    max_headers: int = 100
    log_level: str = "info"
    data_dir: str = ""
    secret: str = ""
    admin_key: str = ""
    credential_headers: tuple[str, ...] = ("authorization", "api-key", "x-api-key")
    shared_anonymous_tenant: bool = False
    anonymous_hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "[::1]")
    """`Host` names the shared anonymous tenant answers to (DNS rebinding: a page on another
    name that resolves to 127.0.0.1 must not read it); a port after the name is ignored."""
    allocator: str = "auto"

    def validate(self, p: str) -> None:
        _check(0 < self.port < 65536, f"{p}.port", "must be 1..65535")
        _check(bool(self.credential_headers), f"{p}.credential_headers", "must not be empty")
        for name in self.credential_headers:
            _check(
                _HEADER_NAME.fullmatch(name) is not None,
                f"{p}.credential_headers",
                f"{name!r} is not a lower-case header name",
            )
        _check(self.workers >= 1, f"{p}.workers", "must be >= 1")
        _check(self.max_body_bytes > 0, f"{p}.max_body_bytes", "must be > 0")
        _check(self.max_header_bytes >= 1024, f"{p}.max_header_bytes", "must be >= 1024")
        _check(self.max_headers >= 8, f"{p}.max_headers", "must be >= 8")
        _check(self.max_api_body_bytes > 0, f"{p}.max_api_body_bytes", "must be > 0")
        for name in self.anonymous_hosts:
            _check(
                bool(name) and name == name.strip().lower(),
                f"{p}.anonymous_hosts",
                f"{name!r} is not a lower-case host name",
            )
        levels = ("debug", "info", "warning", "error")
        _check(self.log_level in levels, f"{p}.log_level", f"must be one of {levels}")
        allocators = ("auto", "jemalloc", "system")
        _check(self.allocator in allocators, f"{p}.allocator", f"must be one of {allocators}")


@dataclass(frozen=True)
class UpstreamSettings:
    url: str = DEFAULT_UPSTREAM
    connect_timeout: float = 10.0
    read_timeout: float = 0.0
    write_timeout: float = 60.0
    pool_timeout: float = 30.0
    max_connections: int = 1000
    keepalive_seconds: float = 30.0
    transport: Transport = "aiohttp"
    api_key: str = ""
    allowed_keys: tuple[str, ...] = ()
    retry_context_errors: bool = True
    stream_overflow_wait_ms: int = 2000
    max_response_header_bytes: int = 16 * 1024
    anthropic_url: str = DEFAULT_ANTHROPIC_UPSTREAM
    anthropic_api_key: str = ""

    def validate(self, p: str) -> None:
        _check(self.url.startswith(("http://", "https://")), f"{p}.url", "must be an http(s) URL")
        _check(
            self.anthropic_url.startswith(("http://", "https://")),
            f"{p}.anthropic_url",
            "must be an http(s) URL (without /v1: https://api.anthropic.com)",
        )
        _check(self.connect_timeout > 0, f"{p}.connect_timeout", "must be > 0")
        _check(self.read_timeout >= 0, f"{p}.read_timeout", "must be >= 0 (0 = no limit)")
        _check(self.max_connections > 0, f"{p}.max_connections", "must be > 0")
        _check(
            self.stream_overflow_wait_ms >= 0,
            f"{p}.stream_overflow_wait_ms",
            "must be >= 0 (0 = never hold a stream)",
        )
        _check(self.keepalive_seconds > 0, f"{p}.keepalive_seconds", "must be > 0")
        _check(
            self.max_response_header_bytes >= 1024,
            f"{p}.max_response_header_bytes",
            "must be >= 1024",
        )
        _check(self.transport in ("aiohttp", "httpx"), f"{p}.transport", "aiohttp or httpx")
        for i, key in enumerate(self.allowed_keys):
            # Never echo the value: a raw API key pasted here must not reach logs or terminals.
            _check(
                KEY_ID.fullmatch(key.strip().lower()) is not None,
                f"{p}.allowed_keys[{i}]",
                "must be a key id (12 hex digits, printed by `compactd key-id <key>`), "
                "not an API key",
            )


_STORE_SCHEMES = (
    "redis://",
    "rediss://",
    "unix://",
    "redis+cluster://",
    "rediss+cluster://",
    "sqlite://",
)


@dataclass(frozen=True)
class StoreSettings:
    url: str = ""
    timeout_ms: int = 200
    over_budget_timeout_ms: int = 1000
    """How long the store calls of a request over its trigger (the lookup of its checkpoint,
    the save of its compaction) may take, on a pool of their own on Redis: forwarded as sent,
    such a request is one the upstream would refuse, so they wait longer than other calls."""
    retention_days: int = 30
    on_store_error: StoreErrorMode = "forward-original"
    pool_size: int = 50
    min_replicas_ack: int = 0

    def validate(self, p: str) -> None:
        _check(
            self.url == "" or self.url.startswith(_STORE_SCHEMES),
            f"{p}.url",
            "must be redis://, rediss://, unix://, redis+cluster://h1:p1,h2:p2 or sqlite:///path",
        )
        _check(self.min_replicas_ack >= 0, f"{p}.min_replicas_ack", "must be >= 0")
        _check(
            self.min_replicas_ack == 0 or self.url.startswith(("redis", "unix")),
            f"{p}.min_replicas_ack",
            "needs a Redis store.url (SQLite has no replicas)",
        )
        _check(self.timeout_ms > 0, f"{p}.timeout_ms", "must be > 0")
        _check(self.over_budget_timeout_ms > 0, f"{p}.over_budget_timeout_ms", "must be > 0")
        _check(self.retention_days > 0, f"{p}.retention_days", "must be > 0")
        _check(
            self.on_store_error in ("forward-original", "compact-unstored"),
            f"{p}.on_store_error",
            "forward-original or compact-unstored",
        )
        _check(self.pool_size > 0, f"{p}.pool_size", "must be > 0")


@dataclass(frozen=True)
class TokenSettings:
    models_file: str = ""
    safety_margin: int = 64
    cache_size: int = 100_000
    body_cache_mb: int = 16
    prefix_cache_mb: int = 16
    min_learned_window: int = 8192
    learned_window_seconds: int = 86_400
    count_tokens_band: float = 0.0
    count_tokens_timeout_ms: int = 1000

    def validate(self, p: str) -> None:
        _check(self.safety_margin >= 0, f"{p}.safety_margin", "must be >= 0")
        _check(0 <= self.count_tokens_band < 1, f"{p}.count_tokens_band", "must be in [0, 1)")
        _check(self.count_tokens_timeout_ms > 0, f"{p}.count_tokens_timeout_ms", "must be > 0")
        _check(self.min_learned_window >= 1024, f"{p}.min_learned_window", "must be >= 1024")
        _check(self.learned_window_seconds >= 60, f"{p}.learned_window_seconds", "must be >= 60")
        _check(self.cache_size >= 0, f"{p}.cache_size", "must be >= 0")
        _check(self.body_cache_mb >= 0, f"{p}.body_cache_mb", "must be >= 0 (0 = off)")
        _check(self.prefix_cache_mb >= 0, f"{p}.prefix_cache_mb", "must be >= 0 (0 = off)")


@dataclass(frozen=True)
class AccountingSettings:
    enabled: bool = True
    request_stream_usage: bool = False
    strip_usage_null: bool = True
    flush_interval_ms: int = 1000
    max_pending: int = 10_000
    max_model_chars: int = 128
    max_sse_event_bytes: int = 1 << 20

    def validate(self, p: str) -> None:
        _check(self.flush_interval_ms > 0, f"{p}.flush_interval_ms", "must be > 0")
        _check(self.max_pending > 0, f"{p}.max_pending", "must be > 0")
        _check(self.max_model_chars >= 16, f"{p}.max_model_chars", "must be >= 16")
        _check(self.max_sse_event_bytes >= 4096, f"{p}.max_sse_event_bytes", "must be >= 4096")


@dataclass(frozen=True)
class LimitsSettings:
    """What one client may cost: answers, connections and each tenant's share (docs/security.md)."""

    stats_max_days: int = 400
    """The longest period `/compactd/v1/savings` and `/stats` cover: a `since` further back
    is refused with a 400."""
    stats_max_groups: int = 100
    """Groups a savings answer lists one by one; the rest are added up as one `(other)` row."""
    api_work_timeout_ms: int = 10_000
    """How long an API answer's heavy work (savings, stats) may run in its thread: 503 past it."""
    api_work_concurrency: int = 2
    """Heavy API answers computed at once per worker; more wait their turn (within the timeout)."""
    uncompress_max_messages: int = 10_000
    """Most messages an uncompress answer restores: 413 past it."""
    uncompress_max_bytes: int = 16 * 1024 * 1024
    """Most bytes of restored messages in an uncompress answer: 413 past it."""
    uncompress_max_depth: int = 4
    """Most rounds a recursive uncompress expands."""
    head_timeout_seconds: float = 60.0
    """How long a connection may take to send a request head (from its first byte, or from
    the connection's opening): 408 and closed past it (nginx's client_header_timeout)."""
    body_timeout_seconds: float = 60.0
    """How long a request body may go without a byte arriving: 408 and closed past it
    (nginx's client_body_timeout)."""
    max_connections: int = 800
    """Open client connections per worker; one more is answered 503 and closed at once (keep
    it under the worker's file-descriptor limit, which upstream connections share)."""
    api_rate_per_minute: int = 300
    """Requests per minute one tenant may make to /compactd/v1/* (per worker; 0 = no limit)."""
    chat_rate_per_minute: int = 0
    """Requests per minute one tenant may make to the compacted APIs (per worker; 0 = none)."""
    list_page_size: int = 100
    """Conversations per page of a listing (`?limit=` may ask for fewer, at most this many)."""
    unparsed_anonymous_bytes: int = 1 << 20
    """A body without a credential larger than this is forwarded without being parsed (nothing
    of it can be stored, so it is never compacted; it is not counted either)."""
    tenant_quota_mb: int = 0
    """Stored originals and checkpoints one tenant may hold (MB; 0 = no quota): past it, its
    new compactions are not stored (the request is forwarded as sent)."""

    def validate(self, p: str) -> None:
        """Every limit positive; timeouts within what a client would wait."""
        for name in (
            "stats_max_days",
            "stats_max_groups",
            "api_work_timeout_ms",
            "api_work_concurrency",
            "uncompress_max_messages",
            "uncompress_max_bytes",
            "uncompress_max_depth",
            "max_connections",
            "list_page_size",
            "unparsed_anonymous_bytes",
        ):
            _check(getattr(self, name) >= 1, f"{p}.{name}", "must be >= 1")
        for name in ("head_timeout_seconds", "body_timeout_seconds"):
            value = getattr(self, name)
            _check(0 < value <= 3600, f"{p}.{name}", "must be in (0, 3600] seconds")
        for name in ("api_rate_per_minute", "chat_rate_per_minute", "tenant_quota_mb"):
            _check(getattr(self, name) >= 0, f"{p}.{name}", "must be >= 0 (0 = no limit)")


@dataclass(frozen=True)
class PolicySettings:
    name: str = "default"
    match_keys: tuple[str, ...] = ()
    match_models: tuple[str, ...] = ()
    match_header: str = ""
    match_header_values: tuple[str, ...] = ()
    match_apis: tuple[str, ...] = ()
    mode: Mode = "enforce"
    providers: tuple[str, ...] = ("engine",)
    options: dict[str, dict[str, Any]] = field(default_factory=dict)
    budget_tokens: int = 32000
    budget_fraction: float = 1.0
    cap_apis: tuple[str, ...] = ("chat.completions", "responses")
    """The APIs budget_tokens and budget_fraction apply to; the others are budgeted by the
    model's window alone (Anthropic bills a cache write at 1.25x, so on bench/cost a cap made
    Messages sessions dearer)."""
    trigger_ratio: float = 1.0
    target_ratio: float = 0.7
    min_saving: float = 0.10
    retention_days: int = 0
    allow_bypass: bool = True
    selectable: tuple[str, ...] = ()
    keep_head: int = 0
    recency_turns: int = 2
    max_tool_result_tokens: int = 2000
    reasoning_strip_age_threshold: int = 3
    lossless: bool = False
    expand_tool: bool = False
    expand_max_calls: int = 3
    expand_max_tokens: int = 4000
    precompute_ratio: float = 0.0
    compaction_timeout_ms: int = 60_000
    """How long the provider chain may run; past it the request is forwarded as sent. Above
    summarize's two 20 s model calls (its `timeout` option) and the engine pass after them."""

    def validate(self, p: str) -> None:
        _check(bool(self.name), f"{p}.name", "must not be empty")
        _check(self.mode in ("enforce", "shadow", "off"), f"{p}.mode", "enforce, shadow or off")
        for api in self.match_apis:
            _check(api in APIS, f"{p}.match_apis", f"{api!r} is not one of {', '.join(APIS)}")
        for api in self.cap_apis:
            _check(api in APIS, f"{p}.cap_apis", f"{api!r} is not one of {', '.join(APIS)}")
        _check(self.budget_tokens >= 0, f"{p}.budget_tokens", "must be >= 0 (0 = no cap)")
        _check(0 < self.budget_fraction <= 1, f"{p}.budget_fraction", "must be in (0, 1]")
        _check(0 < self.trigger_ratio <= 1, f"{p}.trigger_ratio", "must be in (0, 1]")
        _check(0 < self.target_ratio <= 1, f"{p}.target_ratio", "must be in (0, 1]")
        _check(
            self.target_ratio <= self.trigger_ratio, f"{p}.target_ratio", "must be <= trigger_ratio"
        )
        _check(0 <= self.min_saving < 1, f"{p}.min_saving", "must be in [0, 1)")
        _check(self.retention_days >= 0, f"{p}.retention_days", "must be >= 0 (0 = store's)")
        _check(self.recency_turns >= 0, f"{p}.recency_turns", "must be >= 0")
        _check(self.keep_head >= 0, f"{p}.keep_head", "must be >= 0")
        _check(self.max_tool_result_tokens >= 1, f"{p}.max_tool_result_tokens", "must be >= 1")
        _check(
            self.reasoning_strip_age_threshold >= 0,
            f"{p}.reasoning_strip_age_threshold",
            "must be >= 0",
        )
        _check(
            bool(self.providers),
            f"{p}.providers",
            'must name at least one provider ("none" compacts nothing)',
        )
        header = self.match_header.strip().lower()
        _check(
            not header or _HEADER_NAME.fullmatch(header) is not None,
            f"{p}.match_header",
            f"{self.match_header!r} is not a header name",
        )
        _check(self.expand_max_calls >= 1, f"{p}.expand_max_calls", "must be >= 1")
        _check(
            0 <= self.precompute_ratio < 1, f"{p}.precompute_ratio", "must be in [0, 1) (0 = off)"
        )
        _check(self.expand_max_tokens >= 100, f"{p}.expand_max_tokens", "must be >= 100")
        _check(
            1 <= self.compaction_timeout_ms <= MAX_COMPACTION_TIMEOUT_MS,
            f"{p}.compaction_timeout_ms",
            f"must be in 1..{MAX_COMPACTION_TIMEOUT_MS} (milliseconds)",
        )
        for opt in self.options:
            _check(
                opt in self.providers, f"{p}.options.{opt}", "options for a provider not in chain"
            )


@dataclass(frozen=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    tokens: TokenSettings = field(default_factory=TokenSettings)
    accounting: AccountingSettings = field(default_factory=AccountingSettings)
    limits: LimitsSettings = field(default_factory=LimitsSettings)
    default_policy: PolicySettings = field(default_factory=PolicySettings)
    policies: tuple[PolicySettings, ...] = ()

    def validate(self) -> None:
        """Check every section and the policies' cross-references."""
        self.server.validate("server")
        self.upstream.validate("upstream")
        self.store.validate("store")
        self.tokens.validate("tokens")
        self.accounting.validate("accounting")
        self.limits.validate("limits")
        self.default_policy.validate("default_policy")
        names = {self.default_policy.name}
        for i, pol in enumerate(self.policies):
            pol.validate(f"policies[{i}]")
            _check(pol.name not in names, f"policies[{i}].name", f"duplicate name {pol.name!r}")
            names.add(pol.name)
        for pol in self.all_policies():
            for sel in pol.selectable:
                _check(sel in names, f"policy {pol.name!r}.selectable", f"unknown policy {sel!r}")

    def all_policies(self) -> tuple[PolicySettings, ...]:
        """Every policy, the default last."""
        return (*self.policies, self.default_policy)

    def policy_keys(self) -> list[tuple[str, PolicySettings]]:
        """Every policy with the key that names it in errors (`policies[0]`, `default_policy`)."""
        return [
            *((f"policies[{i}]", p) for i, p in enumerate(self.policies)),
            (
                "default_policy",
                self.default_policy,
            ),
        ]


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


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    origin = get_origin(tp)
    if origin is Literal:
        require(value in get_args(tp), key, f"must be one of {get_args(tp)}, not {value!r}")
        return value
    if origin in (Union, types.UnionType):
        return value
    if dataclasses.is_dataclass(tp):
        require(isinstance(value, dict), key, "must be a table")
        return _build(tp, value, key)  # type: ignore[arg-type]
    if origin is tuple:
        (item_tp, _) = get_args(tp)
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        require(isinstance(value, list), key, "must be a list")
        return tuple(_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value))
    if origin is dict:
        require(isinstance(value, dict), key, "must be a table")
        return dict(value)
    if tp is bool:
        if isinstance(value, str) and value.lower() in (
            "1",
            "true",
            "yes",
            "on",
            "0",
            "false",
            "no",
            "off",
        ):
            return value.lower() in ("1", "true", "yes", "on")
        require(isinstance(value, bool), key, f"must be true or false, not {value!r}")
        return value
    if tp is int:
        if isinstance(value, str):
            try:
                value = int(value)
            except ValueError:
                raise ConfigError(f"{key}: must be an integer, not {value!r}") from None
        require(isinstance(value, int) and not isinstance(value, bool), key, "must be an integer")
        return value
    if tp is float:
        if isinstance(value, str):
            try:
                value = float(value)
            except ValueError:
                raise ConfigError(f"{key}: must be a number, not {value!r}") from None
        require(
            isinstance(value, int | float) and not isinstance(value, bool), key, "must be a number"
        )
        return float(value)
    if tp is str:
        require(isinstance(value, str), key, f"must be a string, not {value!r}")
        return value
    raise ConfigError(f"{key}: unsupported type {tp!r}")  # pragma: no cover


def _build(cls: type[Any], table: Mapping[str, Any], prefix: str) -> Any:
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in table.items():
        full = f"{prefix}.{key}" if prefix else key
        try:
            if key not in names:
                hint = did_you_mean(key, names) or f" (known: {', '.join(sorted(names))})"
                raise ConfigError(f"{full}: unknown key{hint}")  # noqa: TRY301
            if key == "policies":
                if not isinstance(value, list):
                    raise ConfigError(f"{full}: must be an array of tables")  # noqa: TRY301
                kwargs[key] = tuple(
                    _coerce(v, PolicySettings, f"{full}[{i}]") for i, v in enumerate(value)
                )
            else:
                kwargs[key] = _coerce(value, hints[key], full)
        except ConfigError as exc:
            problem(exc)  # the default stands in, so the rest is still checked
    return cls(**kwargs)


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
            settings: Settings = _build(Settings, table, "")
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
