"""Everything a running compactd needs, built once per process in the app's lifespan."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import orjson

from proxy.app.heavy import HeavyWork
from proxy.chat.compactor import Compactor
from proxy.chat.planner import CompleterFactory
from proxy.chat.policy import PolicyResolver
from proxy.config import Settings, data_dir
from proxy.errors import CompletionError, ConfigError, ProviderLoadError
from proxy.providers.base import Completer, ContextProvider, Message
from proxy.providers.registry import ProviderRegistry, check_options
from proxy.store.base import Store
from proxy.store.factory import open_store
from proxy.telemetry.accounting import Accountant
from proxy.telemetry.caches import CacheWatch
from proxy.telemetry.metrics import MULTIPROC_ENV, Metrics
from proxy.telemetry.storecheck import StoreWarnings, store_warnings
from proxy.tokens.budget import ModelTable
from proxy.tokens.calibration import Calibration
from proxy.tokens.counter import Tokenizers
from proxy.tokens.windows import LearnedWindows
from proxy.wire.forward import Timeouts, Upstream
from proxy.wire.ratelimit import RateLimiter, limiter
from proxy.wire.stale_retry import StaleRetry
from proxy.wire.tenant import ClientKey, Tenancy, load_or_create_secret

log = logging.getLogger("compactd.services")


@dataclass
class Services:
    """The process's resources; the app's lifespan creates and closes them."""

    settings: Settings
    secret: bytes
    tenancy: Tenancy
    upstream: Upstream
    anthropic: Upstream
    """`upstream.anthropic_url` + /v1, on the same connection pool as `upstream`."""
    calibration: Calibration
    store: Store
    tokenizers: Tokenizers
    models: ModelTable
    policies: PolicyResolver
    metrics: Metrics
    compactor: Compactor
    heavy: HeavyWork
    """Savings and stats answers: in threads, a few at once, within a deadline."""
    caches: CacheWatch
    """The in-memory caches' sizes, kept in `compactd_cache_entries`."""
    store_warnings: StoreWarnings
    """The store's risky settings, asked for again while running (`/readyz`)."""
    api_rate: RateLimiter | None = None
    """Requests per minute per tenant on /compactd/v1/* (None: no limit)."""
    accountant: Accountant | None = None
    """Usage aggregates on their way to the store; None with accounting off."""

    async def aclose(self) -> None:
        """Write pending usage, then release connections."""
        self.caches.close()
        await self.compactor.precompute.aclose()
        if self.compactor.quota is not None:
            await self.compactor.quota.aclose()
        self.compactor.close()
        if self.compactor.windows is not None:
            await self.compactor.windows.aclose()
        await self.calibration.aclose()
        if self.accountant is not None:
            await self.accountant.aclose()
        await self.upstream.aclose()
        await self.store.close()


def completer_factory(upstream: Upstream, upstream_key: str) -> CompleterFactory:
    """LLM calls for providers (summarize), with the tenant's own key or the gateway's."""

    def for_key(api_key: str | None) -> Completer:
        key = _summary_key(upstream_key, api_key)

        async def complete(messages: list[Message], model: str, timeout: float) -> str:  # noqa: ASYNC109
            headers = [(b"content-type", b"application/json")]
            if key is not None:
                headers.append(key)
            body = orjson.dumps({"model": model, "messages": messages})
            url = upstream.url(b"/chat/completions", b"")

            async def call() -> bytes:
                response = await upstream.send("POST", url, headers, body)
                try:
                    data = b"".join([c async for c in response.aiter_bytes()])
                finally:
                    await response.aclose()
                if response.status_code != 200:
                    raise CompletionError(f"upstream answered {response.status_code}")
                return data

            data = await asyncio.wait_for(call(), timeout)
            try:
                text = orjson.loads(data)["choices"][0]["message"]["content"]
            except (orjson.JSONDecodeError, KeyError, IndexError, TypeError) as exc:
                raise CompletionError("unexpected completion shape") from exc
            if not isinstance(text, str):
                raise CompletionError("completion has no text")
            return text

        return complete

    return for_key


def _summary_key(upstream_key: str, api_key: str | None) -> tuple[bytes, bytes] | None:
    """The credential header of a summary call: the gateway's key, else the client's own, in
    the header and with the bytes the client sent it (`Bearer` or Azure's `api-key`)."""
    if upstream_key:
        return (b"authorization", b"Bearer " + upstream_key.encode())
    if not api_key:
        return None
    return (api_key if isinstance(api_key, ClientKey) else ClientKey(api_key)).as_header()


async def build_services(
    settings: Settings,
    *,
    transport: httpx.AsyncBaseTransport,
    store: Store | None = None,
    registry: ProviderRegistry | None = None,
) -> Services:
    """Create every resource; a bad provider, model table or store URL stops start-up here."""
    directory = data_dir(settings)
    secret = load_or_create_secret(settings.server.secret, directory)
    _keep_private(directory)
    tenancy = Tenancy(
        secret=secret,
        headers=settings.server.credential_headers,
        shared_anonymous=settings.server.shared_anonymous_tenant,
        anonymous_hosts=frozenset(settings.server.anonymous_hosts),
    )
    up = settings.upstream
    timeouts = Timeouts(
        connect=up.connect_timeout,
        read=up.read_timeout or None,
        write=up.write_timeout or None,
        pool=up.pool_timeout or None,
    )
    # Cheap checks first, so a bad config fails before the encodings are loaded.
    policies = PolicyResolver(settings)
    names = {n for p in settings.all_policies() for n in p.providers}
    providers = (registry or ProviderRegistry()).load_enabled(sorted(names))
    check_provider_options(settings, providers)
    models = ModelTable.load(
        Path(settings.tokens.models_file) if settings.tokens.models_file else None
    )
    upstream = Upstream(transport, up.url, timeouts)
    anthropic = Upstream(transport, up.anthropic_url.rstrip("/") + "/v1", timeouts)
    # In this thread: an encoding loaded in a worker thread lands in that thread's malloc arena,
    # which keeps ~4 MB more of what the load freed (start-up blocks nothing yet).
    tokenizers = Tokenizers(None, settings.tokens.cache_size)
    if store is None:
        store = await open_store(settings.store, directory)
    first = await store_warnings(store)
    for warning in first:
        log.warning("store: %s", warning)
    metrics = Metrics(multiprocess=os.environ.get(MULTIPROC_ENV))
    if isinstance(transport, StaleRetry):
        transport.observe = metrics.upstream_retry
    windows = LearnedWindows(store, up.url, settings.tokens)
    windows.start()
    calibration = Calibration(store)
    calibration.start()
    compactor = Compactor(
        settings=settings,
        tokenizers=tokenizers,
        models=models,
        policies=policies,
        providers=providers,
        store=store,
        metrics=metrics,
        tenancy=tenancy,
        completer=completer_factory(upstream, up.api_key),
        windows=windows,
        calibration=calibration,
    )
    accountant = None
    if settings.accounting.enabled:
        acc = settings.accounting
        accountant = Accountant(
            store,
            metrics,
            flush_seconds=acc.flush_interval_ms / 1000,
            max_pending=acc.max_pending,
            max_model_chars=acc.max_model_chars,
            activity_ttl_seconds=settings.store.retention_days * 86400,
        )
        accountant.start()
    checked = StoreWarnings(store, metrics, first)
    caches = CacheWatch(compactor.cache_entries, metrics)
    caches.start()
    return Services(
        settings=settings,
        secret=secret,
        tenancy=tenancy,
        upstream=upstream,
        anthropic=anthropic,
        calibration=calibration,
        store=store,
        tokenizers=tokenizers,
        models=models,
        policies=policies,
        metrics=metrics,
        compactor=compactor,
        heavy=HeavyWork(
            settings.limits.api_work_concurrency, settings.limits.api_work_timeout_ms / 1000
        ),
        caches=caches,
        store_warnings=checked,
        api_rate=limiter(settings.limits.api_rate_per_minute),
        accountant=accountant,
    )


def check_settings(settings: Settings) -> dict[str, ContextProvider]:
    """What start-up builds from the config besides resources (policies, model table, providers
    and their options), so `check-config` and `serve` fail with one line where start-up would."""
    PolicyResolver(settings)
    models_file = settings.tokens.models_file
    ModelTable.load(Path(models_file) if models_file else None)
    try:
        providers = ProviderRegistry().load_enabled(
            sorted({n for p in settings.all_policies() for n in p.providers})
        )
    except ProviderLoadError as exc:
        raise ConfigError(f"providers: {exc}") from None
    check_provider_options(settings, providers)
    return providers


def check_provider_options(settings: Settings, providers: Mapping[str, ContextProvider]) -> None:
    """Every policy's options for every provider in its chain: typed by the provider's schema,
    then checked by the provider; the OptionError (a ConfigError) names the key
    (`policies[0].options.engine.working_set`)."""
    for where, policy in settings.policy_keys():
        for name in policy.providers:
            check_options(providers[name], policy.options.get(name, {}), f"{where}.options.{name}")


def _keep_private(directory: Path) -> None:
    """The data dir holds the secret and the embedded store's originals: owner only (0700)."""
    try:
        info = directory.stat()
        if info.st_mode & 0o077 and info.st_uid == os.getuid():
            directory.chmod(0o700)
    except FileNotFoundError:
        return  # nothing kept on disk (a configured secret and a remote store)
    except OSError as exc:
        log.warning("could not make %s private: %s", directory, exc.strerror)
