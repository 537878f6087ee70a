"""Prometheus metrics: one `Metrics` object per process, one method per event.

Each `Metrics` owns its own `CollectorRegistry` (nothing is registered in prometheus_client's
global default registry), so tests and several apps in one process never collide.

Several uvicorn workers: prometheus_client decides *when it is imported* whether values live in
process memory or in per-process mmap files under `PROMETHEUS_MULTIPROC_DIR`. So the CLI must set
that variable (an empty directory) before the workers start (`multiprocess_dir()` does this), and
`render()` then merges every worker's files with `MultiProcessCollector`, whichever worker answers
the scrape. Only counters and histograms are used, which merge by summing; no live gauges, so no
`mark_process_dead` bookkeeping is needed when a worker exits.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    values,
)
from prometheus_client.multiprocess import MultiProcessCollector

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
DEFAULT_API = "chat.completions"
"""The `api` label of requests that do not say (see `proxy.dialects.apis`)."""
OTHER_MODEL = "other"
SHADOW = "shadow"
_MAX_LABEL = 100

_FAST = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_SLOW = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


@contextmanager
def multiprocess_dir(path: str | None = None) -> Iterator[str]:
    """Give workers a clean `PROMETHEUS_MULTIPROC_DIR` for the server's lifetime.

    Call in the CLI *before* starting several uvicorn workers (they are spawned, so they inherit
    the environment and import prometheus_client afresh). Stale files from a previous run are
    removed first, or counters would resume from old values; a directory we created is removed
    on exit.
    """
    created = path is None
    root = Path(path or tempfile.mkdtemp(prefix="compactd-metrics-"))
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob("*.db"):
        stale.unlink()
    previous = os.environ.get(MULTIPROC_ENV)
    os.environ[MULTIPROC_ENV] = str(root)
    try:
        yield str(root)
    finally:
        if previous is None:
            os.environ.pop(MULTIPROC_ENV, None)
        else:
            os.environ[MULTIPROC_ENV] = previous
        if created:
            shutil.rmtree(root, ignore_errors=True)


class Metrics:
    """Every compactd metric; call the method named after what happened."""

    def __init__(self, *, multiprocess: str | None = None, max_models: int = 200) -> None:
        path = multiprocess if multiprocess is not None else os.environ.get(MULTIPROC_ENV, "")
        if path and values.ValueClass is values.MutexValue:
            # Values would stay in this process's memory while render() reads the files: every
            # scrape would silently show zeros. Fail at start-up instead.
            raise RuntimeError(f"{MULTIPROC_ENV} must be set before prometheus_client is imported")
        self._multiprocess = path
        self._max_models = max_models
        # Model names come from clients; cap the label set so a client cannot explode it.
        self._models: set[str] = set()
        # labels() validates and locks on every call (~10 calls, ~30 us per request); the label
        # sets are bounded (models are capped above), so each child is looked up once.
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        r = self._registry = CollectorRegistry(auto_describe=True)
        self._requests = Counter(
            "compactd_requests",
            "Compacted-API requests (chat completions, responses, messages) by outcome.",
            ["action", "model", "policy", "api"],
            registry=r,
        )
        self._tokens_before = Counter(
            "compactd_tokens_before",
            "Prompt tokens as the client sent them (tiktoken count).",
            ["model", "policy", "api"],
            registry=r,
        )
        self._tokens_after = Counter(
            "compactd_tokens_after",
            "Prompt tokens as forwarded upstream (tiktoken count).",
            ["model", "policy", "api"],
            registry=r,
        )
        self._tokens_saved = Counter(
            "compactd_tokens_saved",
            "Prompt tokens removed by compaction or replay.",
            ["model", "policy", "api"],
            registry=r,
        )
        self._tokens_would_save = Counter(
            "compactd_tokens_would_save",
            "Prompt tokens shadow-mode policies would have removed (originals were sent).",
            ["model", "policy", "api"],
            registry=r,
        )
        self._overhead = Histogram(
            "compactd_overhead_seconds",
            "Time from receiving a request to sending it upstream.",
            ["action"],
            buckets=_FAST,
            registry=r,
        )
        self._compaction_runs = Counter(
            "compactd_compaction_runs",
            "Provider chain runs, kept or not (kept ones: requests_total{action=compacted}).",
            ["policy", "providers"],
            registry=r,
        )
        self._compaction_seconds = Histogram(
            "compactd_compaction_seconds",
            "Time spent running the provider chain.",
            ["policy"],
            buckets=_SLOW,
            registry=r,
        )
        self._store_seconds = Histogram(
            "compactd_store_seconds",
            "Store operation latency.",
            ["op"],
            buckets=_FAST,
            registry=r,
        )
        self._upstream = Counter(
            "compactd_upstream_responses",
            "Upstream responses by status code.",
            ["status"],
            registry=r,
        )
        self._retries = Counter(
            "compactd_upstream_retries",
            "Requests sent again on a new connection after a reused one closed before answering.",
            ["outcome"],
            registry=r,
        )
        self._ttfb = Histogram(
            "compactd_upstream_ttfb_seconds",
            "Time from sending upstream to its first byte.",
            buckets=_SLOW,
            registry=r,
        )
        self._usage = Counter(
            "compactd_upstream_usage_tokens",
            "Tokens the upstream billed (its `usage`): prompt, cached, cache_write, completion.",
            ["kind", "model", "api"],
            registry=r,
        )
        self._violations = Counter(
            "compactd_invariant_violations",
            "Provider outputs rejected by the validator (and reverted).",
            ["provider"],
            registry=r,
        )
        self._provider_errors = Counter(
            "compactd_provider_errors",
            "Providers that raised during a compaction (their work discarded).",
            ["provider"],
            registry=r,
        )
        self._checkpoints_discarded = Counter(
            "compactd_checkpoints_discarded",
            "Stored checkpoints not replayed: unreadable, another tenant's, or not valid here.",
            ["reason"],
            registry=r,
        )
        self._replay_prefix = Counter(
            "compactd_replay_prefix",
            "Replayed checkpoints' serialized messages: kept (hit), serialized (miss), evicted.",
            ["result"],
            registry=r,
        )
        self._cold_turns = Counter(
            "compactd_cold_turns",
            "Turns budgeted deeper because the conversation's prompt cache had expired.",
            ["policy"],
            registry=r,
        )
        self._fail_open = Counter(
            "compactd_fail_open",
            "Requests forwarded unchanged because something failed.",
            ["reason"],
            registry=r,
        )
        self._expand_calls = Counter(
            "compactd_expand_calls",
            "Calls of the expand tool compactd answered: expanded, unknown, mixed, limit.",
            ["outcome"],
            registry=r,
        )
        self._expand_tokens = Counter(
            "compactd_expand_tokens",
            "Tokens of originals the expand tool brought back.",
            registry=r,
        )
        self._precompute = Counter(
            "compactd_precompute",
            "Checkpoints computed ahead of time: stored, not_worth_it, failed, busy (skipped).",
            ["outcome"],
            registry=r,
        )
        self._count_confirms = Counter(
            "compactd_count_tokens_confirms",
            "Anthropic requests near their trigger counted by the upstream's count_tokens:"
            " confirmed, or failed (the estimate decided).",
            ["result"],
            registry=r,
        )
        self._overflows = Counter(
            "compactd_context_overflows",
            "Upstream refusals of a request as longer than its model's window (in a 400, or in"
            " a Responses stream's opening), and whether compactd retried it compacted.",
            ["where", "outcome"],
            registry=r,
        )
        self._cache_entries = Gauge(
            "compactd_cache_entries",
            "Entries each in-memory cache of this worker holds (bounded: tokens.cache_size,"
            " tokens.body_cache_mb and fixed caps).",
            ["cache"],
            registry=r,
            multiprocess_mode="liveall",
        )
        self._store_warnings = Gauge(
            "compactd_store_config_warnings",
            "Settings of the store that risk losing stored originals (an evicting"
            " maxmemory-policy, no persistence ...), as last checked (every 60 s by /readyz).",
            registry=r,
            multiprocess_mode="max",
        )
        self._rate_limited = Counter(
            "compactd_rate_limited",
            "Requests refused with 429: a tenant past limits.api_rate_per_minute (route api) or"
            " limits.chat_rate_per_minute (route chat).",
            ["route"],
            registry=r,
        )
        self._refused = Counter(
            "compactd_client_requests_refused",
            "x-compactd-policy / x-compactd-bypass headers the policy did not allow.",
            ["header"],
            registry=r,
        )
        self._usage_dropped = Counter(
            "compactd_usage_dropped",
            "Requests whose usage accounting was dropped (pending table full, store down at"
            " shutdown); the requests themselves were served normally.",
            ["reason"],
            registry=r,
        )
        self._usage_flushes = Counter(
            "compactd_usage_flushes",
            "Usage batches written to the store (result ok) or kept for the next try (error).",
            ["result"],
            registry=r,
        )
        self._passthrough_changed = Counter(
            "compactd_passthrough_bytes_changed",
            "Bytes that differed on requests forwarded as passthrough; must stay 0.",
            registry=r,
        )
        self._http = Counter(
            "compactd_http_requests",
            "Every HTTP request compactd answered, by method, route class and status.",
            ["method", "route", "status"],
            registry=r,
        )
        self._http_seconds = Histogram(
            "compactd_http_request_seconds",
            "Time from receiving a request to the end of its response (streams included).",
            ["route"],
            buckets=(0.001, 0.005, *_SLOW),
            registry=r,
        )
        if path:
            self._render_registry = CollectorRegistry()
            MultiProcessCollector(self._render_registry, path=path)  # type: ignore[no-untyped-call]
        else:
            self._render_registry = r

    def _child(self, metric: Any, *labels: str) -> Any:
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def _model(self, model: str) -> str:
        if model in self._models:
            return model
        if len(self._models) >= self._max_models or len(model) > _MAX_LABEL:
            return OTHER_MODEL
        self._models.add(model)
        return model

    def observe_request(
        self,
        *,
        action: str,
        model: str,
        policy: str,
        tokens_before: int,
        tokens_after: int,
        overhead_seconds: float | None = None,
        api: str = DEFAULT_API,
    ) -> None:
        """One chat request decided (its action: passthrough, lossless, replayed, compacted ...).

        For `shadow`, `tokens_after` is what enforce would have sent: the original was
        forwarded, so the difference counts as would-save, not as saved.
        """
        m = self._model(model)
        self._child(self._requests, action, m, policy, api).inc()
        self._child(self._tokens_before, m, policy, api).inc(tokens_before)
        removed = max(tokens_before - tokens_after, 0)
        if action == SHADOW:
            self._child(self._tokens_after, m, policy, api).inc(tokens_before)
            self._child(self._tokens_would_save, m, policy, api).inc(removed)
        else:
            self._child(self._tokens_after, m, policy, api).inc(tokens_after)
            self._child(self._tokens_saved, m, policy, api).inc(removed)
        if overhead_seconds is not None:
            self._child(self._overhead, action).observe(overhead_seconds)

    def observe_compaction(self, *, policy: str, providers: str, seconds: float) -> None:
        """The provider chain ran for `seconds` (whether or not its result was kept)."""
        self._compaction_runs.labels(policy, providers).inc()
        self._compaction_seconds.labels(policy).observe(seconds)

    def observe_store(self, op: str, seconds: float) -> None:
        """One store call (`find_checkpoint`, `save_compaction`, `record_usage`, ...)."""
        self._store_seconds.labels(op).observe(seconds)

    def observe_upstream(self, status: int, ttfb_seconds: float | None = None) -> None:
        """The upstream answered with `status`, its first byte after `ttfb_seconds`."""
        self._child(self._upstream, str(status)).inc()
        if ttfb_seconds is not None:
            self._ttfb.observe(ttfb_seconds)

    def upstream_retry(self, outcome: str) -> None:
        """A request was sent again on a new connection (`proxy.wire.stale_retry`): `ok` or
        `failed`."""
        self._retries.labels(outcome).inc()

    def observe_usage(
        self,
        *,
        model: str,
        prompt_tokens: int,
        cached_tokens: int,
        completion_tokens: int,
        cache_write_tokens: int = 0,
        api: str = DEFAULT_API,
    ) -> None:
        """The upstream's own `usage` for one response (cache writes: Anthropic's)."""
        m = self._model(model)
        self._child(self._usage, "prompt", m, api).inc(prompt_tokens)
        self._child(self._usage, "cached", m, api).inc(cached_tokens)
        self._child(self._usage, "completion", m, api).inc(completion_tokens)
        if cache_write_tokens:
            self._child(self._usage, "cache_write", m, api).inc(cache_write_tokens)

    def invariant_violation(self, provider: str) -> None:
        """A provider's output broke an invariant and was reverted."""
        self._violations.labels(provider).inc()

    def provider_error(self, provider: str) -> None:
        """A provider raised; its work was discarded (the next provider, or none, was used)."""
        self._provider_errors.labels(provider).inc()

    def checkpoint_discarded(self, reason: str) -> None:
        """A stored checkpoint was treated as absent (`unreadable`, `other_tenant`, `invalid`)."""
        self._checkpoints_discarded.labels(reason).inc()

    def replay_prefix(self, *, kept: bool, evicted: int) -> None:
        """A replayed body was spliced around a checkpoint's bytes, kept or serialized now."""
        self._child(self._replay_prefix, "hit" if kept else "miss").inc()
        if evicted:
            self._child(self._replay_prefix, "evicted").inc(evicted)

    def fail_open(self, reason: str) -> None:
        """A request was forwarded unchanged because of a failure (`count`, `store`, ...)."""
        self._fail_open.labels(reason).inc()

    def cold_turn(self, policy: str) -> None:
        """A turn budgeted with `cold_budget_tokens` (`proxy.chat.cold_cache`)."""
        self._cold_turns.labels(policy).inc()

    def expand_call(self, outcome: str, tokens: int) -> None:
        """One call of the expand tool answered by compactd (`proxy.chat.expand`)."""
        self._expand_calls.labels(outcome).inc()
        if tokens:
            self._expand_tokens.inc(tokens)

    def precomputed(self, outcome: str) -> None:
        """One precomputation finished, or was skipped (`proxy.chat.precompute`)."""
        self._precompute.labels(outcome).inc()

    def count_confirmed(self, result: str) -> None:
        """One `count_tokens` confirmation (`proxy.dialects.anthropic_count`): confirmed or
        failed."""
        self._count_confirms.labels(result).inc()

    def context_overflow(self, where: str, outcome: str) -> None:
        """The upstream refused a request as too long (`where`: response or stream); `outcome`:
        retried compacted, or relayed (no retry was due: shadow, bypass, nothing smaller)."""
        self._overflows.labels(where, outcome).inc()

    def cache_entries(self, cache: str, entries: int) -> None:
        """How many entries an in-memory cache holds now."""
        self._cache_entries.labels(cache).set(entries)

    def store_config_warnings(self, count: int) -> None:
        """How many warnings the store's last settings check gave."""
        self._store_warnings.set(count)

    def rate_limited(self, route: str) -> None:
        """A request was refused for its tenant's rate (`api` or `chat`)."""
        self._rate_limited.labels(route).inc()

    def refused(self, header: str) -> None:
        """A client header (`x-compactd-policy` or `x-compactd-bypass`) was not honoured."""
        self._refused.labels(header).inc()

    def usage_dropped(self, reason: str, requests: int) -> None:
        """`requests` requests' accounting was dropped (`full`, `store`, `shutdown`)."""
        self._child(self._usage_dropped, reason).inc(requests)

    def usage_flush(self, *, ok: bool) -> None:
        """One usage batch was written (ok) or failed and was kept."""
        self._child(self._usage_flushes, "ok" if ok else "error").inc()

    def passthrough_bytes_changed(self, n: int) -> None:
        """Bytes differed on a passthrough request: a transparency bug, alert on any increase."""
        self._passthrough_changed.inc(n)

    def observe_http(self, *, method: str, route: str, status: str, seconds: float) -> None:
        """One HTTP request answered (all routes; labels must come from bounded sets)."""
        self._child(self._http, method, route, status).inc()
        self._child(self._http_seconds, route).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        """The scrape body and its content type (every worker's values in multiprocess mode)."""
        return generate_latest(self._render_registry), CONTENT_TYPE_LATEST
