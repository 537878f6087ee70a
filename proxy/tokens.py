"""Token counts of chat requests, the way OpenAI bills them, cached per message.

Rules (OpenAI cookbook "How to count tokens with tiktoken"): every message costs 3 tokens plus
its role and content, a `name` costs its text plus 1, and every reply is primed with 3 more.
Tool schemas follow the cookbook's function-calling formula. What the cookbook does not cover is
estimated on the safe side: images by OpenAI's published tile rule, audio by its length, files
by their size. Counts are estimates that match OpenAI on the published examples; the budget's
safety margin absorbs the rest.

A growing conversation resends its whole history every turn, so each message's count is cached
under a hash of its JSON bytes: a new turn costs only its new messages.
"""

from __future__ import annotations

import base64
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from proxy.encodings import BUNDLED, EncodingUnavailableError, load_encoding
from proxy.imagesize import data_url_size

if TYPE_CHECKING:
    from proxy.budget import ModelInfo

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3
TOKENS_PER_TOOL_CALL = 3

# Images (OpenAI vision guide): detail "low" is a flat 85; otherwise the image is scaled to fit
# 2048x2048, then its shortest side to 768, and costs 170 per 512px tile plus 85. An image whose
# size we cannot read (a remote URL) is charged the rule's maximum, 2x4 tiles.
IMAGE_BASE = 85
IMAGE_PER_TILE = 170
IMAGE_UNKNOWN = IMAGE_BASE + IMAGE_PER_TILE * 8
# Audio input is ~10 tokens per second; compressed audio of unknown bitrate is assumed to be a
# low 32 kbit/s, so its duration (and count) errs high.
AUDIO_TOKENS_PER_SECOND = 10
AUDIO_ASSUMED_BYTES_PER_SECOND = 4000
# Files (PDF): text plus a page image, ~1,300 tokens per page at a typical ~8 KB per page.
FILE_BYTES_PER_TOKEN = 6

# Cookbook constants for tool schemas; the per-function start differs by model generation.
FUNC_INIT = {"o200k_base": 7, "cl100k_base": 10}
PROP_INIT = 3
PROP_KEY = 3
ENUM_INIT = -3
ENUM_ITEM = 3
FUNC_END = 12
_PLAIN_PROPERTY_KEYS = frozenset({"type", "description", "enum"})
_PLAIN_PARAMETER_KEYS = frozenset({"type", "properties", "required", "additionalProperties"})


class Encoder(Protocol):
    """The part of `tiktoken.Encoding` the counter uses."""

    @property
    def name(self) -> str: ...

    def encode_ordinary(self, text: str) -> list[int]: ...


def image_tokens(width: int, height: int, detail: str = "auto") -> int:
    """Tokens for one image of the given size by OpenAI's tile rule."""
    if detail == "low":
        return IMAGE_BASE
    w, h = float(width), float(height)
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    return IMAGE_BASE + IMAGE_PER_TILE * math.ceil(w / 512) * math.ceil(h / 512)


def _base64_bytes(data: str) -> int:
    return len(data) * 3 // 4 - data.count("=", max(0, len(data) - 2))


def audio_tokens(data: str, fmt: str) -> int:
    """Tokens for one base64 audio clip, estimated from its duration."""
    size = _base64_bytes(data)
    byte_rate = AUDIO_ASSUMED_BYTES_PER_SECOND
    if fmt == "wav" and len(data) >= 44:
        header = base64.b64decode(data[:44] + "=" * (-len(data[:44]) % 4))
        if header[:4] == b"RIFF" and len(header) >= 32:
            byte_rate = int.from_bytes(header[28:32], "little") or byte_rate
    return math.ceil(size / byte_rate * AUDIO_TOKENS_PER_SECOND)


def _dump(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


class TokenCounter:
    """Counts chat requests with one encoding; per-message counts live in a bounded LRU."""

    def __init__(self, encoding: Encoder, cache_size: int) -> None:
        self.encoding_name = encoding.name
        self._encode = encoding.encode_ordinary
        self._func_init = FUNC_INIT.get(encoding.name, max(FUNC_INIT.values()))
        self._cache: OrderedDict[int, int] = OrderedDict()
        self._cache_size = cache_size
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def count_text(self, text: str) -> int:
        """Tokens of plain text; special-token strings are counted as ordinary text."""
        return len(self._encode(text))

    def _cached(self, key: int | None) -> int | None:
        if key is None:
            return None
        with self._lock:
            value = self._cache.get(key)
            if value is None:
                self.misses += 1
            else:
                self.hits += 1
                self._cache.move_to_end(key)
        return value

    def _remember(self, key: int | None, value: int) -> None:
        if key is None:
            return
        with self._lock:
            self._cache[key] = value
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)

    def _key(self, value: Any) -> int | None:
        if self._cache_size <= 0:
            return None
        # Plain text messages hash their items directly (no serialization); others hash their
        # JSON. A 64-bit SipHash key in a bounded cache makes collisions negligible.
        if isinstance(value, dict):
            try:
                return hash(tuple(value.items()))
            except TypeError:
                pass
        try:
            return hash(orjson.dumps(value))
        except (TypeError, orjson.JSONEncodeError):
            return None

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one message, its 3-token overhead included (cached by content)."""
        key = self._key(message)
        cached = self._cached(key)
        if cached is not None:
            return cached
        value = self._message(message)
        self._remember(key, value)
        return value

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of a message list, the reply priming included."""
        # One pass and one lock for the whole list: a warm 1,000-message history costs ~1 ms.
        keys = [self._key(m) for m in messages]
        total = REPLY_PRIMING
        missing: list[int] = []
        with self._lock:
            get, touch = self._cache.get, self._cache.move_to_end
            for i, key in enumerate(keys):
                value = None if key is None else get(key)
                if key is None or value is None:
                    missing.append(i)
                else:
                    total += value
                    touch(key)
            self.hits += len(keys) - len(missing)
            self.misses += len(missing)
        counted: dict[int, int] = {}  # a message repeated within this request is encoded once
        for i in missing:
            key = keys[i]
            value = counted.get(key) if key is not None else None
            if value is None:
                value = self._message(messages[i])
                if key is not None:
                    counted[key] = value
            total += value
        if counted:
            with self._lock:
                self._cache.update(counted)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return total

    def count_tools(self, body: Mapping[str, Any]) -> int:
        """Tokens of the request's tool (or legacy function) definitions (cached)."""
        tools = body.get("tools")
        functions = body.get("functions")
        if not tools and not functions:
            return 0
        key = self._key(("tools", tools, functions))
        cached = self._cached(key)
        if cached is not None:
            return cached
        value = self._tools(tools if isinstance(tools, list) else [], functions)
        self._remember(key, value)
        return value

    def count_response_format(self, body: Mapping[str, Any]) -> int:
        """Tokens of a `json_schema` response format, which OpenAI adds to the prompt."""
        fmt = body.get("response_format")
        if not isinstance(fmt, Mapping) or fmt.get("type") != "json_schema":
            return 0
        schema = fmt.get("json_schema")
        key = self._key(("response_format", schema))
        cached = self._cached(key)
        if cached is not None:
            return cached
        value = self.count_text(_dump(schema))
        self._remember(key, value)
        return value

    def count_request(self, body: Mapping[str, Any]) -> int:
        """Prompt tokens of a whole chat request: messages, tools and response schema."""
        messages = body.get("messages")
        total = self.count_messages(messages) if isinstance(messages, list) else 0
        return total + self.count_tools(body) + self.count_response_format(body)

    def _message(self, message: Any) -> int:
        if not isinstance(message, Mapping):
            return TOKENS_PER_MESSAGE + self.count_text(_dump(message))
        total = TOKENS_PER_MESSAGE
        for key, value in message.items():
            if value is None or key == "tool_call_id":  # ids are not rendered into the prompt
                continue
            if key == "content":
                total += self._content(value)
            elif key == "tool_calls":
                total += self._tool_calls(value)
            elif key == "function_call":
                total += self._call(value)
            elif isinstance(value, str):
                total += self.count_text(value)
                if key == "name":
                    total += TOKENS_PER_NAME
            elif key != "audio":  # a reference to an earlier audio reply; its size is unknown
                total += self.count_text(_dump(value))
        return total

    def _content(self, content: Any) -> int:
        if isinstance(content, str):
            return self.count_text(content)
        if not isinstance(content, list):
            return self.count_text(_dump(content))
        return sum(self._part(part) for part in content)

    def _part(self, part: Any) -> int:
        if not isinstance(part, Mapping):
            return self.count_text(part if isinstance(part, str) else _dump(part))
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            return self.count_text(part["text"])
        if kind == "image_url" and isinstance(part.get("image_url"), Mapping):
            image = part["image_url"]
            detail = image.get("detail") or "auto"
            if detail == "low":
                return IMAGE_BASE
            size = data_url_size(image.get("url") or "")
            return IMAGE_UNKNOWN if size is None else image_tokens(*size, detail)
        if kind == "input_audio" and isinstance(part.get("input_audio"), Mapping):
            audio = part["input_audio"]
            return audio_tokens(str(audio.get("data") or ""), str(audio.get("format") or ""))
        if kind == "file" and isinstance(part.get("file"), Mapping):
            file = part["file"]
            name = self.count_text(str(file.get("filename") or ""))
            return name + _base64_bytes(str(file.get("file_data") or "")) // FILE_BYTES_PER_TOKEN
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return self.count_text(part["refusal"])
        return self.count_text(_dump(part))

    def _call(self, call: Any) -> int:
        if not isinstance(call, Mapping):
            return self.count_text(_dump(call))
        name = call.get("name")
        args = call.get("arguments", call.get("input"))
        return (
            TOKENS_PER_TOOL_CALL
            + self.count_text(name if isinstance(name, str) else "")
            + self.count_text(args if isinstance(args, str) else _dump(args or ""))
        )

    def _tool_calls(self, calls: Any) -> int:
        if not isinstance(calls, list):
            return self.count_text(_dump(calls))
        total = 0
        for call in calls:
            inner = call.get("function", call.get("custom")) if isinstance(call, Mapping) else None
            total += self._call(inner if inner is not None else call)
        return total

    def _function(self, fn: Mapping[str, Any], extra: Any = None) -> int:
        desc = str(fn.get("description") or "").removesuffix(".")
        total = self._func_init + self.count_text(f"{fn.get('name') or ''}:{desc}")
        if extra is not None:
            total += self.count_text(_dump(extra))
        params = fn.get("parameters")
        if not isinstance(params, Mapping):
            return total
        unusual = {k: v for k, v in params.items() if k not in _PLAIN_PARAMETER_KEYS}
        if unusual:  # $defs and the like are sent to the model too
            total += self.count_text(_dump(unusual))
        props = params.get("properties")
        if not isinstance(props, Mapping) or not props:
            return total
        total += PROP_INIT
        for name, schema in props.items():
            total += PROP_KEY
            prop = schema if isinstance(schema, Mapping) else {}
            enum = prop.get("enum")
            if isinstance(enum, list):
                total += ENUM_INIT
                for item in enum:
                    total += ENUM_ITEM + self.count_text(str(item))
            kind = prop.get("type", "")
            kind = "|".join(map(str, kind)) if isinstance(kind, list) else str(kind)
            desc = str(prop.get("description") or "").removesuffix(".")
            total += self.count_text(f"{name}:{kind}:{desc}")
            nested = {k: v for k, v in prop.items() if k not in _PLAIN_PROPERTY_KEYS}
            if nested:  # the cookbook's examples are flat; nested schemas are counted as JSON
                total += self.count_text(_dump(nested))
        return total

    def _tools(self, tools: list[Any], functions: Any) -> int:
        total = 0
        defs: list[Any] = list(functions) if isinstance(functions, list) else []
        for tool in tools:
            if not isinstance(tool, Mapping):
                total += self.count_text(_dump(tool))
            elif isinstance(tool.get("function"), Mapping):
                defs.append(tool["function"])
            elif isinstance(tool.get("custom"), Mapping):
                custom = tool["custom"]
                total += self._function(custom, custom.get("format"))
            else:
                total += self.count_text(_dump(tool))
        for fn in defs:
            total += self._function(fn) if isinstance(fn, Mapping) else self.count_text(_dump(fn))
        return total + FUNC_END if (defs or total) else total


class Tokenizers:
    """The loaded encodings and one counter per encoding; created once per process."""

    def __init__(
        self,
        cache_dir: Path | None = None,
        cache_size: int = 100_000,
        encodings: Sequence[str] = BUNDLED,
    ) -> None:
        self._counters = {
            name: TokenCounter(load_encoding(name, cache_dir), cache_size) for name in encodings
        }

    def counter(self, encoding: str) -> TokenCounter:
        """The counter for an encoding name."""
        try:
            return self._counters[encoding]
        except KeyError:
            raise EncodingUnavailableError(f"encoding {encoding!r} is not loaded") from None

    def for_model(self, info: ModelInfo) -> TokenCounter:
        """The counter for a model table entry."""
        return self.counter(info.encoding)
