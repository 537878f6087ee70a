"""Finds compression providers: installed entry points (group `compactd.providers`) and
explicit registrations.

Built-ins are entry points too (declared in pyproject), so a plugin is found exactly like them.
Semantics follow gptme's registry: loading is lazy; entry points never replace a name that was
registered explicitly; `get` returns a new instance per call. A plugin that fails to import is
remembered, not raised, until something asks for it: `load_enabled` (called at start-up with the
configured chain) then stops start-up with the plugin's name and error.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from proxy.errors import OptionError, ProviderLoadError
from proxy.providers.base import ContextProvider, parse_options

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "compactd.providers"


@dataclass(frozen=True)
class ProviderInfo:
    """One installed provider, for `compactd providers`."""

    name: str
    source: str
    """`module:Class` of the entry point, or `registered` for an explicit registration."""
    error: str = ""
    """Why it cannot be loaded; empty when it loads."""


class ProviderRegistry:
    """Provider classes by name; the app creates one in its lifespan."""

    def __init__(self, *, group: str = ENTRY_POINT_GROUP) -> None:
        self._group = group
        self._classes: dict[str, type[ContextProvider]] = {}
        self._sources: dict[str, str] = {}
        self._broken: dict[str, ProviderInfo] = {}
        self._loaded = False

    def register(self, name: str, cls: type[ContextProvider]) -> None:
        """Register (or replace) a provider class under `name`."""
        if not (isinstance(cls, type) and issubclass(cls, ContextProvider)):
            raise TypeError(f"{cls!r} is not a ContextProvider subclass")
        self._classes[name] = cls
        self._sources[name] = "registered"
        self._broken.pop(name, None)

    def get(self, name: str) -> ContextProvider:
        """A new instance of the provider called `name`."""
        self._ensure_loaded()
        if name in self._broken:
            info = self._broken[name]
            raise ProviderLoadError(
                f"provider {name!r} ({info.source}) failed to load: {info.error}"
            )
        if name not in self._classes:
            raise ValueError(f"Unknown context provider: {name!r}. Available: {self.names()}")
        try:
            return self._classes[name]()
        except Exception as exc:
            raise ProviderLoadError(
                f"provider {name!r} could not be created: {type(exc).__name__}: {exc}"
            ) from exc

    def names(self) -> list[str]:
        """Names of the providers that load, sorted."""
        self._ensure_loaded()
        return sorted(self._classes)

    def describe(self) -> list[ProviderInfo]:
        """Every installed provider, loadable or not, sorted by name."""
        self._ensure_loaded()
        infos = [ProviderInfo(n, self._sources[n]) for n in self._classes]
        return sorted([*infos, *self._broken.values()], key=lambda i: i.name)

    def load_enabled(self, names: Iterable[str]) -> dict[str, ContextProvider]:
        """Instances of the enabled providers; ProviderLoadError names the first bad one."""
        out: dict[str, ContextProvider] = {}
        for name in names:
            try:
                out[name] = self.get(name)
            except ValueError as exc:
                raise ProviderLoadError(str(exc)) from exc
        return out

    def _ensure_loaded(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        for ep in sorted(entry_points(group=self._group), key=lambda e: (e.name, e.value)):
            if ep.name in self._classes or ep.name in self._broken:
                continue  # explicit registrations (and the first of duplicate entry points) win
            self._load(ep)

    def _load(self, ep: EntryPoint) -> None:
        try:
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, ContextProvider)):
                raise TypeError(f"{ep.value} is not a ContextProvider subclass")  # noqa: TRY301
        except Exception as exc:  # noqa: BLE001 - a broken plugin only matters if it is enabled
            log.warning("provider plugin %s (%s) failed to load: %r", ep.name, ep.value, exc)
            self._broken[ep.name] = ProviderInfo(ep.name, ep.value, f"{type(exc).__name__}: {exc}")
            return
        self._classes[ep.name] = cls
        self._sources[ep.name] = ep.value


def check_options(provider: ContextProvider, options: Mapping[str, Any], prefix: str) -> None:
    """A policy's options for `provider`, checked by the host against the provider's declared
    `option_schema`, then by the provider's own `check_options`; OptionError names the key
    (dotted from `prefix`, e.g. `policies[0].options.engine`). Never raises anything else."""
    schema = getattr(provider, "option_schema", None)
    own_check = type(provider).check_options is not ContextProvider.check_options
    if schema is None and options and not own_check:
        # Nothing would read or check these: a typo would be silently ignored.
        key = next(iter(options))
        raise OptionError(f"{prefix}.{key}", f"unknown option ({provider.name} declares none)")
    try:
        if schema is not None:
            parse_options(schema, options, prefix)
        provider.check_options(options)
    except OptionError as exc:
        if exc.key.startswith(prefix):
            raise
        raise OptionError(f"{prefix}.{exc.key}", exc.why) from None
    except ValueError as exc:
        raise OptionError(prefix, str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - a plugin's check must not crash check-config
        raise OptionError(prefix, f"checking failed ({type(exc).__name__}: {exc})") from None


@functools.cache
def default_registry() -> ProviderRegistry:
    """The registry the seed-style functions use when none is passed (created on first use)."""
    return ProviderRegistry()


def register_provider(
    name: str, cls: type[ContextProvider], registry: ProviderRegistry | None = None
) -> None:
    """Register a provider class (seed API)."""
    (registry or default_registry()).register(name, cls)


def get_context_provider(
    name: str = "trim", registry: ProviderRegistry | None = None
) -> ContextProvider:
    """A new instance of a provider by name (seed API)."""
    return (registry or default_registry()).get(name)


def list_providers(registry: ProviderRegistry | None = None) -> list[str]:
    """Names of the available providers, sorted (seed API)."""
    return (registry or default_registry()).names()
