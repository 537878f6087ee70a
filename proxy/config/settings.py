"""The settings schema: every key, its type, default and bounds, and the checks across keys.

A field's type and `option()` bounds are checked as the file and the environment are parsed
(`proxy.runtime.options.parse`, the validator provider options use too); each section's
`validate` checks what one value alone cannot say (a URL's scheme, one key against another).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.runtime.options import check as _check
from proxy.runtime.options import option

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
    port: int = option(8787, minimum=1, maximum=65535)
    workers: int = option(1, minimum=1)
    max_body_bytes: int = option(32 * 1024 * 1024, minimum=1)
    max_header_bytes: int = option(64 * 1024, minimum=1024)
    max_api_body_bytes: int = option(8 * 1024 * 1024, minimum=1)
    max_headers: int = option(100, minimum=8)
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
        _check(bool(self.credential_headers), f"{p}.credential_headers", "must not be empty")
        for name in self.credential_headers:
            _check(
                _HEADER_NAME.fullmatch(name) is not None,
                f"{p}.credential_headers",
                f"{name!r} is not a lower-case header name",
            )
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
    connect_timeout: float = option(10.0, above=0)
    read_timeout: float = option(0.0, minimum=0)
    """0: no limit."""
    write_timeout: float = 60.0
    pool_timeout: float = 30.0
    max_connections: int = option(1000, minimum=1)
    keepalive_seconds: float = option(30.0, above=0)
    transport: Transport = "aiohttp"
    api_key: str = ""
    allowed_keys: tuple[str, ...] = ()
    retry_context_errors: bool = True
    stream_overflow_wait_ms: int = option(2000, minimum=0)
    """0: never hold a stream."""
    max_response_header_bytes: int = option(16 * 1024, minimum=1024)
    anthropic_url: str = DEFAULT_ANTHROPIC_UPSTREAM
    anthropic_api_key: str = ""

    def validate(self, p: str) -> None:
        _check(self.url.startswith(("http://", "https://")), f"{p}.url", "must be an http(s) URL")
        _check(
            self.anthropic_url.startswith(("http://", "https://")),
            f"{p}.anthropic_url",
            "must be an http(s) URL (without /v1: https://api.anthropic.com)",
        )
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
    timeout_ms: int = option(200, minimum=1)
    over_budget_timeout_ms: int = option(1000, minimum=1)
    """How long the store calls of a request over its trigger (the lookup of its checkpoint,
    the save of its compaction) may take, on a pool of their own on Redis: forwarded as sent,
    such a request is one the upstream would refuse, so they wait longer than other calls."""
    retention_days: int = option(30, minimum=1)
    on_store_error: StoreErrorMode = "forward-original"
    pool_size: int = option(50, minimum=1)
    min_replicas_ack: int = option(0, minimum=0)

    def validate(self, p: str) -> None:
        _check(
            self.url == "" or self.url.startswith(_STORE_SCHEMES),
            f"{p}.url",
            "must be redis://, rediss://, unix://, redis+cluster://h1:p1,h2:p2 or sqlite:///path",
        )
        _check(
            self.min_replicas_ack == 0 or self.url.startswith(("redis", "unix")),
            f"{p}.min_replicas_ack",
            "needs a Redis store.url (SQLite has no replicas)",
        )


@dataclass(frozen=True)
class TokenSettings:
    models_file: str = ""
    safety_margin: int = option(64, minimum=0)
    cache_size: int = option(100_000, minimum=0)
    body_cache_mb: int = option(16, minimum=0)
    """0: off."""
    prefix_cache_mb: int = option(16, minimum=0)
    """0: off."""
    min_learned_window: int = option(8192, minimum=1024)
    learned_window_seconds: int = option(86_400, minimum=60)
    count_tokens_band: float = option(0.0, minimum=0, below=1)
    count_tokens_timeout_ms: int = option(1000, minimum=1)


@dataclass(frozen=True)
class AccountingSettings:
    enabled: bool = True
    request_stream_usage: bool = False
    strip_usage_null: bool = True
    flush_interval_ms: int = option(1000, minimum=1)
    max_pending: int = option(10_000, minimum=1)
    max_model_chars: int = option(128, minimum=16)
    max_sse_event_bytes: int = option(1 << 20, minimum=4096)


@dataclass(frozen=True)
class LimitsSettings:
    """What one client may cost: answers, connections and each tenant's share (docs/security.md)."""

    stats_max_days: int = option(400, minimum=1)
    """The longest period `/compactd/v1/savings` and `/stats` cover: a `since` further back
    is refused with a 400."""
    stats_max_groups: int = option(100, minimum=1)
    """Groups a savings answer lists one by one; the rest are added up as one `(other)` row."""
    api_work_timeout_ms: int = option(10_000, minimum=1)
    """How long an API answer's heavy work (savings, stats) may run in its thread: 503 past it."""
    api_work_concurrency: int = option(2, minimum=1)
    """Heavy API answers computed at once per worker; more wait their turn (within the timeout)."""
    uncompress_max_messages: int = option(10_000, minimum=1)
    """Most messages an uncompress answer restores: 413 past it."""
    uncompress_max_bytes: int = option(16 * 1024 * 1024, minimum=1)
    """Most bytes of restored messages in an uncompress answer: 413 past it."""
    uncompress_max_depth: int = option(4, minimum=1)
    """Most rounds a recursive uncompress expands."""
    head_timeout_seconds: float = option(60.0, above=0, maximum=3600)
    """How long a connection may take to send a request head (from its first byte, or from
    the connection's opening): 408 and closed past it (nginx's client_header_timeout)."""
    body_timeout_seconds: float = option(60.0, above=0, maximum=3600)
    """How long a request body may go without a byte arriving: 408 and closed past it
    (nginx's client_body_timeout)."""
    max_connections: int = option(800, minimum=1)
    """Open client connections per worker; one more is answered 503 and closed at once (keep
    it under the worker's file-descriptor limit, which upstream connections share)."""
    api_rate_per_minute: int = option(300, minimum=0)
    """Requests per minute one tenant may make to /compactd/v1/* (per worker; 0 = no limit)."""
    chat_rate_per_minute: int = option(0, minimum=0)
    """Requests per minute one tenant may make to the compacted APIs (per worker; 0 = none)."""
    list_page_size: int = option(100, minimum=1)
    """Conversations per page of a listing (`?limit=` may ask for fewer, at most this many)."""
    unparsed_anonymous_bytes: int = option(1 << 20, minimum=1)
    """A body without a credential larger than this is forwarded without being parsed (nothing
    of it can be stored, so it is never compacted; it is not counted either)."""
    tenant_quota_mb: int = option(0, minimum=0)
    """Stored originals and checkpoints one tenant may hold (MB; 0 = no quota): past it, its
    new compactions are not stored (the request is forwarded as sent)."""


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
    budget_tokens: int = option(64000, minimum=0)
    budget_fraction: float = option(1.0, above=0, maximum=1)
    cap_apis: tuple[str, ...] = APIS
    """The APIs budget_tokens and budget_fraction apply to; the others are budgeted by the
    model's window alone (on bench/cost the 64k cap made no session dearer under OpenAI's or
    Anthropic's cache rules, so it applies to all three)."""
    trigger_ratio: float = option(1.0, above=0, maximum=1)
    target_ratio: float = option(0.7, above=0, maximum=1)
    min_saving: float = option(0.10, minimum=0, below=1)
    retention_days: int = option(0, minimum=0)
    allow_bypass: bool = True
    selectable: tuple[str, ...] = ()
    keep_head: int = option(0, minimum=0)
    recency_turns: int = option(2, minimum=0)
    max_tool_result_tokens: int = option(2000, minimum=1)
    reasoning_strip_age_threshold: int = option(3, minimum=0)
    lossless: bool = False
    expand_tool: bool = False
    expand_max_calls: int = option(3, minimum=1)
    expand_max_tokens: int = option(4000, minimum=100)
    precompute_ratio: float = option(0.0, minimum=0, below=1)
    cold_budget_tokens: int = option(0, minimum=0)
    """The budget of a turn whose prompt cache has expired (on every API; 0: as any turn)."""
    cold_after_seconds: float = option(0.0, minimum=0)
    """Silence after which the cache counts as expired (0: the model's published lifetime)."""
    compaction_timeout_ms: int = option(60_000, minimum=1, maximum=MAX_COMPACTION_TIMEOUT_MS)
    """How long the provider chain may run; past it the request is forwarded as sent. Above
    summarize's two 20 s model calls (its `timeout` option) and the engine pass after them."""

    def validate(self, p: str) -> None:
        _check(bool(self.name), f"{p}.name", "must not be empty")
        for api in self.match_apis:
            _check(api in APIS, f"{p}.match_apis", f"{api!r} is not one of {', '.join(APIS)}")
        for api in self.cap_apis:
            _check(api in APIS, f"{p}.cap_apis", f"{api!r} is not one of {', '.join(APIS)}")
        _check(
            self.target_ratio <= self.trigger_ratio, f"{p}.target_ratio", "must be <= trigger_ratio"
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
            ("default_policy", self.default_policy),
        ]
