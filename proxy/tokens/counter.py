"""Token counts of chat requests, the way OpenAI bills them, cached per message.

Rules (OpenAI cookbook "How to count tokens with tiktoken"): every message costs 3 tokens plus
its role and content, a `name` costs its text plus 1, and every reply is primed with 3 more.
Tool schemas follow the cookbook's function-calling formula. What the cookbook does not cover is
estimated on the safe side: images by the model's published rule, audio by its length, files
by their size. Counts are estimates that match OpenAI on the published examples; the budget's
safety margin absorbs the rest.

A growing conversation resends its whole history every turn, so each message's count is cached
under a hash of its content: a new turn costs only its new messages. Images, audio and files are
estimated in `proxy.tokens.media`, tool schemas in `proxy.tokens.toolschema`.
"""

from __future__ import annotations

import string
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from proxy.errors import EncodingUnavailableError
from proxy.tokens.encodings import BUNDLED, PRELOADED, load_encoding
from proxy.tokens.media import TILES, ImageRule, audio_tokens, file_data_tokens, image_part_tokens
from proxy.tokens.toolschema import dump, tools_tokens

if TYPE_CHECKING:
    from proxy.tokens.budget import ModelInfo

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
REPLY_PRIMING = 3
TOKENS_PER_TOOL_CALL = 3


class Encoder(Protocol):
    """The part of `tiktoken.Encoding` the counter uses."""

    @property
    def name(self) -> str: ...

    def encode_ordinary(self, text: str) -> list[int]: ...


_SHORT = 32
_SHORT_ENTRIES = 4096
# Tool-call arguments counted, by hash (a 64-bit key, as the message cache's): a compacted
# assistant message keeps its calls, and every form of it counts them again. Cleared when full.
_ARGUMENT_ENTRIES = 4096
_PIECE = 1 << 16
_RUN = 1 << 13
_ASCII_LETTERS = frozenset(string.ascii_letters)


def pieces(text: str, size: int = _PIECE, run: int = _RUN) -> Iterator[str]:
    """`text` in pieces of about `size` characters whose token counts add up to the text's.

    Cuts go where the pre-tokenizer of cl100k_base and o200k_base always ends one pre-token and
    starts the next, and BPE never merges across pre-tokens: just after a line break followed
    by neither whitespace nor a slash (only those can join a line break to what follows, the
    slash after punctuation in o200k), or at a single space between a non-space character and
    an ASCII letter (the space always opens the word's pre-token).

    Such a point is looked for only within `run` characters past `size` (a shorter tail
    without one stays whole). Past that the text is one huge run (base64, minified data, a
    repeated character) and is cut at `size` anyway: encoding one multi-megabyte pre-token takes
    seconds, and the search itself would rescan the rest of the text for every piece. A forced
    cut splits one pre-token, so it moves the count by a token or so in `size` characters;
    every other cut keeps it exact."""
    start, n = 0, len(text)
    while n - start > size:
        cut = _cut(text, start + size, start + size + run)
        if cut < 0:
            if n - start <= size + run:
                break  # a tail without a cut point, but a bounded one: keep it whole
            cut = start + size
        yield text[start:cut]
        start = cut
    yield text[start:]


def _cut(text: str, at: int, end: int) -> int:
    """The first safe cut in [at, end) (see `pieces`), or -1."""
    last = min(len(text) - 1, end)
    while at < last:
        newline, space = text.find("\n", at, last), text.find(" ", at, last)
        if newline < 0 and space < 0:
            return -1
        if space < 0 or 0 <= newline < space:
            after = text[newline + 1]
            if after != "/" and not after.isspace():
                return newline + 1
            at = newline + 1
        else:
            if space > 0 and not text[space - 1].isspace() and text[space + 1] in _ASCII_LETTERS:
                return space
            at = space + 1
    return -1


class TokenCounter:
    """Counts chat requests with one encoding; per-message counts live in a bounded LRU."""

    def __init__(self, encoding: Encoder, cache_size: int, images: ImageRule = TILES) -> None:
        self.encoding_name = encoding.name
        self.images = images
        self._encode = encoding.encode_ordinary
        self._cache: OrderedDict[int, int] = OrderedDict()
        self._cache_size = cache_size
        self._short: dict[str, int] = {}
        self._arguments: dict[int, int] = {}
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def entries(self) -> int:
        """Per-message counts held (at most the cache size)."""
        return len(self._cache)

    def count_text(self, text: str) -> int:
        """Tokens of plain text; special-token strings are counted as ordinary text."""
        if len(text) > _PIECE:
            # tiktoken holds the GIL while it turns its result into a Python list: ~10 ms for
            # a 3 MB log. Pieces cut where a new pre-token always starts count the same.
            return sum(len(self._encode(piece)) for piece in pieces(text))
        if len(text) > _SHORT:
            return len(self._encode(text))
        # Roles, names and tool names recur in every message: remember a bounded few.
        found = self._short.get(text)
        if found is None:
            found = len(self._encode(text))
            if len(self._short) < _SHORT_ENTRIES:
                self._short[text] = found
        return found

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
        # (A message with tool calls holds a list, so hashing its items always fails: it goes
        # to the JSON key directly, without raising and catching a TypeError first, which took
        # half of its key's cost: an agent run's assistant messages are keyed on every count.)
        if isinstance(value, dict) and type(value.get("tool_calls")) is not list:
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
        return REPLY_PRIMING + sum(self.message_counts(messages))

    def message_counts(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        """Each message's tokens, its overhead included (`count_message` of each)."""
        # One pass and one lock for the whole list: a warm 1,000-message history costs ~1 ms.
        keys = [self._key(m) for m in messages]
        values = [0] * len(keys)
        missing: list[int] = []
        with self._lock:
            get, touch = self._cache.get, self._cache.move_to_end
            for i, key in enumerate(keys):
                value = None if key is None else get(key)
                if key is None or value is None:
                    missing.append(i)
                else:
                    values[i] = value
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
            values[i] = value
        if counted:
            with self._lock:
                self._cache.update(counted)
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return values

    def cached_counts(self, messages: Sequence[Mapping[str, Any]]) -> list[int] | None:
        """`message_counts(messages)` if every message's count is cached, else None (without
        counting anything): a caller can count a known history inline and only send the work
        of new messages to a thread."""
        keys = [self._key(m) for m in messages]
        values: list[int] = []
        with self._lock:
            get = self._cache.get
            for key in keys:
                value = None if key is None else get(key)
                if value is None:
                    return None
                values.append(value)
        return values

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
        value = tools_tokens(tools, functions, self.count_text, self.encoding_name)
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
        value = self.count_text(dump(schema))
        self._remember(key, value)
        return value

    def count_request(self, body: Mapping[str, Any]) -> int:
        """Prompt tokens of a whole chat request: messages, tools and response schema."""
        messages = body.get("messages")
        total = self.count_messages(messages) if isinstance(messages, list) else 0
        return total + self.count_tools(body) + self.count_response_format(body)

    def _message(self, message: Any) -> int:
        if not isinstance(message, Mapping):
            return TOKENS_PER_MESSAGE + self.count_text(dump(message))
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
                total += self.count_text(dump(value))
        return total

    def _content(self, content: Any) -> int:
        if isinstance(content, str):
            return self.count_text(content)
        if not isinstance(content, list):
            return self.count_text(dump(content))
        return sum(self._part(part) for part in content)

    def _part(self, part: Any) -> int:
        if not isinstance(part, Mapping):
            return self.count_text(part if isinstance(part, str) else dump(part))
        kind = part.get("type")
        if kind == "text" and isinstance(part.get("text"), str):
            return self.count_text(part["text"])
        if kind == "image_url" and isinstance(part.get("image_url"), Mapping):
            return image_part_tokens(part["image_url"], self.images)
        if kind == "input_audio" and isinstance(part.get("input_audio"), Mapping):
            audio = part["input_audio"]
            return audio_tokens(str(audio.get("data") or ""), str(audio.get("format") or ""))
        if kind == "file" and isinstance(part.get("file"), Mapping):
            file = part["file"]
            name = self.count_text(str(file.get("filename") or ""))
            return name + file_data_tokens(str(file.get("file_data") or ""))
        if kind == "refusal" and isinstance(part.get("refusal"), str):
            return self.count_text(part["refusal"])
        return self.count_text(dump(part))

    def _call(self, call: Any) -> int:
        if not isinstance(call, Mapping):
            return self.count_text(dump(call))
        name = call.get("name")
        args = call.get("arguments", call.get("input"))
        name_tokens = TOKENS_PER_TOOL_CALL + self.count_text(name if isinstance(name, str) else "")
        if not isinstance(args, str):
            return name_tokens + self.count_text(dump(args or ""))
        if len(args) <= _SHORT or self._cache_size <= 0:
            return name_tokens + self.count_text(args)
        key = hash(args)
        found = self._arguments.get(key)
        if found is None:
            found = self.count_text(args)
            if len(self._arguments) >= _ARGUMENT_ENTRIES:
                self._arguments.clear()
            self._arguments[key] = found
        return name_tokens + found

    def _tool_calls(self, calls: Any) -> int:
        if not isinstance(calls, list):
            return self.count_text(dump(calls))
        total = 0
        for call in calls:
            inner = call.get("function", call.get("custom")) if isinstance(call, Mapping) else None
            total += self._call(inner if inner is not None else call)
        return total


class Tokenizers:
    """One counter per encoding and image rule, created once per process; an encoding is loaded
    when first needed (PRELOADED ones up front), so a worker that never sees a GPT-4 model never
    holds cl100k_base."""

    def __init__(
        self,
        cache_dir: Path | None = None,
        cache_size: int = 100_000,
        encodings: Sequence[str] = BUNDLED,
        preload: Sequence[str] = PRELOADED,
    ) -> None:
        self._cache_dir = cache_dir
        self._cache_size = cache_size
        self._known = tuple(encodings)
        # Per-message counts depend on the image rule, so each (encoding, rule) has its counter.
        self._counters: dict[tuple[str, ImageRule], TokenCounter] = {}
        self._encodings: dict[str, Encoder] = {}
        self._lock = threading.Lock()
        for name in preload:
            if name in self._known:
                self.counter(name)

    def counters(self) -> tuple[TokenCounter, ...]:
        """The counters made so far (one per encoding and image rule)."""
        with self._lock:
            return tuple(self._counters.values())

    @property
    def loaded(self) -> tuple[str, ...]:
        """The encodings loaded so far."""
        return tuple(self._encodings)

    def counter(self, encoding: str, images: ImageRule = TILES) -> TokenCounter:
        """The counter for an encoding name and image rule, loading the encoding on first use."""
        key = (encoding, images)
        found = self._counters.get(key)
        if found is not None:
            return found
        if encoding not in self._known:
            raise EncodingUnavailableError(f"encoding {encoding!r} is not loaded")
        with self._lock:  # two threads seeing a new model at once load it once
            found = self._counters.get(key)
            if found is None:
                loaded = self._encodings.get(encoding) or load_encoding(encoding, self._cache_dir)
                self._encodings[encoding] = loaded
                found = self._counters[key] = TokenCounter(loaded, self._cache_size, images)
        return found

    def for_model(self, info: ModelInfo) -> TokenCounter:
        """The counter for a model table entry (its encoding, its image rule)."""
        return self.counter(info.encoding, info.image)
