"""The model table and the token budget of a request.

A request's budget is what is left of the model's context window once the reply has room:
window - reserved output - safety margin, optionally capped lower by the policy. Compaction starts
above the trigger and aims for the target, well below the budget, so it does not re-trigger on the
next turn (DESIGN.md, promise 2).
"""

from __future__ import annotations

import dataclasses
import threading
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from importlib.resources import files
from pathlib import Path
from typing import Any

import orjson

from proxy.config import PolicySettings
from proxy.errors import ConfigError
from proxy.tokens.encodings import BUNDLED
from proxy.tokens.media import TILES, ImageRule

_FIELDS = (
    "context_window",
    "max_output",
    "encoding",
    "input_price",
    "cached_input_price",
    "output_price",
)
_INT_FIELDS = frozenset({"context_window", "max_output", "max_input"})
_OPTIONAL = frozenset({"cache_write_price", "max_input"})
"""Fields an entry may leave out (a cache write costs the input price unless it says otherwise;
the input is limited by the window alone unless it says otherwise)."""
_IMAGE_KEYS = {
    "tiles": frozenset({"image_base", "image_tile"}),
    "patches": frozenset({"image_multiplier"}),
    "pixels": frozenset(),
}
"""The keys each `image_rule` takes (an entry without one bills images by GPT-4o's tiles)."""

# Model names come from clients, so the lookup memo is bounded.
_MEMO_SIZE = 4096


@dataclass(frozen=True)
class ModelInfo:
    """What compactd knows about one model (prices in USD per 1M tokens)."""

    pattern: str
    context_window: int
    max_output: int
    encoding: str
    input_price: float
    cached_input_price: float
    output_price: float
    cache_write_price: float = -1.0
    """USD per 1M tokens written to the prompt cache (Anthropic: 1.25x input for 5 minutes);
    the input price when the table does not say."""
    max_input: int = 0
    """Most input tokens the model takes whatever output is reserved (GPT-5: 272k of its 400k);
    0: only the window minus the reserved output limits it."""
    image: ImageRule = TILES
    """How the model bills an image (`proxy.tokens.media`)."""

    def __post_init__(self) -> None:
        if self.cache_write_price < 0:
            object.__setattr__(self, "cache_write_price", self.input_price)

    def with_window(self, window: int) -> ModelInfo:
        """A copy with another context window (e.g. one learned from an upstream error)."""
        return dataclasses.replace(self, context_window=window)


def _entry(table: Any, key: str, *, with_pattern: bool) -> ModelInfo:
    if not isinstance(table, dict):
        raise ConfigError(f"{key}: must be a table")
    image = _image_rule(table, key)
    known = {*_FIELDS, *_OPTIONAL, "image_rule", *_IMAGE_KEYS[image.kind]}
    if with_pattern:
        known.add("pattern")
    for name in table:
        if name not in known:
            raise ConfigError(f"{key}.{name}: unknown key (known: {', '.join(sorted(known))})")
    for name in sorted({*_FIELDS, *(["pattern"] if with_pattern else [])}):
        if name not in table:
            raise ConfigError(f"{key}.{name}: missing")
    values: dict[str, Any] = {}
    for name in (*_FIELDS, *(f for f in sorted(_OPTIONAL) if f in table)):
        value = table[name]
        full = f"{key}.{name}"
        if name in _INT_FIELDS:
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ConfigError(f"{full}: must be a positive integer, not {value!r}")
        elif name == "encoding":
            if value not in BUNDLED:
                raise ConfigError(f"{full}: must be one of {BUNDLED}, not {value!r}")
        elif not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{full}: must be a number >= 0, not {value!r}")
        values[name] = float(value) if name.endswith("price") else value
    if values.get("max_input", 0) > values["context_window"]:
        raise ConfigError(f"{key}.max_input: must not exceed context_window")
    pattern = table.get("pattern", "*")
    if not isinstance(pattern, str) or not pattern.strip():
        raise ConfigError(f"{key}.pattern: must be a non-empty string, not {pattern!r}")
    return ModelInfo(pattern=pattern.lower(), image=image, **values)


def _image_rule(table: Mapping[str, Any], key: str) -> ImageRule:
    kind = table.get("image_rule", "tiles")
    if kind not in _IMAGE_KEYS:
        raise ConfigError(f"{key}.image_rule: must be one of {sorted(_IMAGE_KEYS)}, not {kind!r}")
    if kind == "patches":
        multiplier = table.get("image_multiplier")
        if (
            not isinstance(multiplier, int | float)
            or isinstance(multiplier, bool)
            or multiplier <= 0
        ):
            raise ConfigError(f"{key}.image_multiplier: must be a number > 0, not {multiplier!r}")
        return ImageRule("patches", multiplier=float(multiplier))
    if kind == "pixels":
        return ImageRule("pixels")
    figures = {"image_base": TILES.base, "image_tile": TILES.tile}
    for name, default in figures.items():
        value = table.get(name, default)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{key}.{name}: must be a positive integer, not {value!r}")
        figures[name] = value
    return ImageRule("tiles", base=figures["image_base"], tile=figures["image_tile"])


def _parse(data: Mapping[str, Any]) -> tuple[tuple[ModelInfo, ...], ModelInfo]:
    for name in data:
        if name not in ("default", "models"):
            raise ConfigError(f"{name}: unknown key (known: default, models)")
    if "default" not in data:
        raise ConfigError("default: missing (the entry for models no pattern matches)")
    default = _entry(data["default"], "default", with_pattern=False)
    raw = data.get("models", [])
    if not isinstance(raw, list):
        raise ConfigError("models: must be an array of tables ([[models]])")
    entries: list[ModelInfo] = []
    for i, table in enumerate(raw):
        info = _entry(table, f"models[{i}]", with_pattern=True)
        for j, earlier in enumerate(entries):
            # A pattern that the earlier glob matches as a literal string can never be reached.
            if fnmatchcase(info.pattern, earlier.pattern):
                raise ConfigError(
                    f"models[{i}].pattern: {info.pattern!r} is shadowed by models[{j}] "
                    f"{earlier.pattern!r}; put more specific patterns first"
                )
        entries.append(info)
    return tuple(entries), default


def _packaged_table() -> Path:
    packaged = files("proxy") / "data" / "models.toml"
    if packaged.is_file():
        return Path(str(packaged))
    # Editable install: the repository's config/ sits next to the package.
    return Path(__file__).resolve().parents[2] / "config" / "models.toml"


def _base_model(name: str) -> str:
    """The model a gateway's or a fine-tune's name stands for: "openai/gpt-4o" and
    "azure/gpt-4.1" without the provider, "ft:gpt-4o-mini-2024-07-18:org::id" its base model."""
    bare = name.rsplit("/", 1)[-1]
    return bare.split(":")[1] if bare.startswith("ft:") else bare


def model_names(model: str) -> tuple[str, ...]:
    """The names a model is matched under, in order: the lower-cased name, then the base model
    it stands for (`_base_model`) if that differs. The model table and the policies' globs
    both match these, so a policy applies to exactly the requests the table sees as its model."""
    name = model.lower()
    base = _base_model(name)
    return (name,) if base == name else (name, base)


class ModelTable:
    """Glob-matched model entries (first match wins)."""

    def __init__(self, entries: tuple[ModelInfo, ...], default: ModelInfo) -> None:
        self.entries = entries
        self.default = default
        self._memo: dict[str, ModelInfo] = {}
        self._lock = threading.Lock()

    @classmethod
    def load(cls, path: Path | None = None) -> ModelTable:
        """Load and validate a table; without `path`, the packaged copy (or the repo's config/)."""
        source = path if path is not None else _packaged_table()
        try:
            data = tomllib.loads(source.read_text(encoding="utf-8"))
        except OSError as exc:
            raise ConfigError(f"models file {source}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"models file {source}: {exc}") from None
        try:
            entries, default = _parse(data)
        except ConfigError as exc:
            raise ConfigError(f"models file {source}: {exc}") from None
        return cls(entries, default)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ModelTable:
        """Build a table from already-parsed TOML (validated the same way as `load`)."""
        return cls(*_parse(data))

    def _first_match(self, name: str) -> ModelInfo | None:
        return next((e for e in self.entries if fnmatchcase(name, e.pattern)), None)

    def match(self, model: str) -> ModelInfo:
        """The table's entry for `model` (first glob match, else the default), ignoring overlays."""
        names = model_names(model)
        name = names[0]
        found = self._memo.get(name)
        if found is None:
            found = next(filter(None, map(self._first_match, names)), self.default)
            with self._lock:
                if len(self._memo) >= _MEMO_SIZE:
                    self._memo.clear()
                self._memo[name] = found
        return found

    def lookup(self, model: str) -> ModelInfo:
        """The entry for `model` (windows learned from upstream errors: `proxy.tokens.windows`)."""
        return self.match(model)


LONG_CONTEXT_BETA = "context-1m-"
LONG_CONTEXT_WINDOW = 1_000_000
"""Anthropic's 1M-token context window, opted into per request (`anthropic-beta:
context-1m-2025-08-07`) on models whose own window is smaller."""


def requested_window(info: ModelInfo, anthropic_beta: str) -> ModelInfo:
    """`info` with the window a Messages request opts into through its `anthropic-beta` flags."""
    flags = (flag.strip() for flag in anthropic_beta.split(","))
    if info.context_window < LONG_CONTEXT_WINDOW and any(
        flag.startswith(LONG_CONTEXT_BETA) for flag in flags
    ):
        return info.with_window(LONG_CONTEXT_WINDOW)
    return info


@dataclass(frozen=True)
class Budget:
    """Token figures for one request: compaction runs above `trigger` and aims for `target`."""

    window: int
    reserved_output: int
    margin: int
    budget: int
    trigger: int
    target: int


def requested_output(body: Mapping[str, Any]) -> int | None:
    """The completion tokens a request reserves (`max_completion_tokens`, `max_tokens`, the
    Responses API's `max_output_tokens`)."""
    for key in ("max_completion_tokens", "max_tokens", "max_output_tokens"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def compute_budget(
    info: ModelInfo,
    body: Mapping[str, Any],
    policy: PolicySettings,
    safety_margin: int,
    api: str = "chat.completions",
) -> Budget:
    """Budget = window - reserved output - margin (at most the model's input limit - margin),
    capped by the policy (for the APIs of its `cap_apis`); never below a floor.

    The reserved output is the request's `max_completion_tokens` (or `max_tokens`, or the
    Responses API's `max_output_tokens`), else the model's default max output. When the
    reservation and margin leave less than 1/32 of the window (e.g. `max_tokens` ≥ window), the
    budget is that floor, small but positive: the request is likely to be refused upstream
    anyway, and compaction must still have a target to aim at.
    """
    window = info.context_window
    reserved = requested_output(body) or info.max_output
    margin = max(0, safety_margin)
    floor = max(1, window // 32)
    room = window - reserved
    if info.max_input:
        room = min(room, info.max_input)
    budget = max(room - margin, floor)
    if api in policy.cap_apis:
        if policy.budget_tokens > 0:
            budget = min(budget, policy.budget_tokens)
        budget = max(1, min(budget, int(policy.budget_fraction * window)))
    trigger = max(1, int(budget * policy.trigger_ratio))
    target = max(1, min(trigger, int(budget * policy.target_ratio)))
    return Budget(
        window=window,
        reserved_output=reserved,
        margin=margin,
        budget=budget,
        trigger=trigger,
        target=target,
    )


def context_overflow_message(body: bytes) -> str | None:
    """The error message if this 400 says the context window was exceeded."""
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(error, dict):
        return None
    return overflow_message(error)


def overflow_message(error: Mapping[str, Any]) -> str | None:
    """An API error object's message (its code if it has none) if it says the context window
    was exceeded: a 400's `error`, or a Responses stream's `error` event."""
    message = str(error.get("message") or "")
    code = str(error.get("code") or "")
    lowered = message.lower()
    if (
        code == "context_length_exceeded"
        or "context length" in lowered
        or ("context window" in lowered)
        or "prompt is too long" in lowered  # Anthropic's phrasings
        or "exceed context limit" in lowered
    ):
        return message or code
    return None
