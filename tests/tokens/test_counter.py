"""Token counting: OpenAI cookbook vectors, caching, special tokens, images, tools, audio."""

from __future__ import annotations

import base64
import random
import string
import struct
from typing import Any

import pytest
import tiktoken

from proxy.errors import EncodingUnavailableError
from proxy.tokens.budget import ModelTable
from proxy.tokens.counter import TokenCounter, Tokenizers, pieces
from proxy.tokens.encodings import load_encoding
from proxy.tokens.media import IMAGE_UNKNOWN, ImageRule, data_url_size, image_tokens

# The OpenAI cookbook "How to count tokens with tiktoken"
# (openai/openai-cookbook, examples/How_to_count_tokens_with_tiktoken.ipynb): its example messages
# and tools, and the prompt_tokens the OpenAI API reported for them.
COOKBOOK_MESSAGES: list[dict[str, Any]] = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate "
        "jargon into plain English.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "New synergies will help drive top-line growth.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Things working well together will increase revenue.",
    },
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities "
        "for increased leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client "
        "deliverable.",
    },
]
COOKBOOK_TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {
                        "type": "string",
                        "description": "The city and state, e.g. San Francisco, CA",
                    },
                    "unit": {
                        "type": "string",
                        "description": "The unit of temperature to return",
                        "enum": ["celsius", "fahrenheit"],
                    },
                },
                "required": ["location"],
            },
        },
    }
]
COOKBOOK_TOOL_MESSAGES: list[dict[str, Any]] = [
    {
        "role": "system",
        "content": "You are a helpful assistant that can answer to questions about the weather.",
    },
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]


class CountingEncoder:
    """A real encoding that records every string it is asked to encode."""

    def __init__(self, encoding: tiktoken.Encoding) -> None:
        self._encoding = encoding
        self.calls: list[str] = []

    @property
    def name(self) -> str:
        return self._encoding.name

    def encode_ordinary(self, text: str) -> list[int]:
        self.calls.append(text)
        return self._encoding.encode_ordinary(text)


@pytest.fixture(scope="module")
def tokenizers() -> Tokenizers:
    return Tokenizers(cache_size=1000)


@pytest.fixture(scope="module")
def table() -> ModelTable:
    return ModelTable.load()


@pytest.fixture
def o200k() -> TokenCounter:
    return TokenCounter(load_encoding("o200k_base"), cache_size=1000)


def _counter_for(model: str, tokenizers: Tokenizers, table: ModelTable) -> TokenCounter:
    return tokenizers.for_model(table.lookup(model))


@pytest.mark.parametrize(
    ("model", "expected"),
    [("gpt-3.5-turbo", 129), ("gpt-4-0613", 129), ("gpt-4", 129), ("gpt-4o", 124),
     ("gpt-4o-mini", 124)],
)  # fmt: skip
def test_chat_messages_match_the_cookbooks_api_counts(
    model: str, expected: int, tokenizers: Tokenizers, table: ModelTable
) -> None:
    counter = _counter_for(model, tokenizers, table)
    assert counter.count_messages(COOKBOOK_MESSAGES) == expected
    assert counter.count_request({"model": model, "messages": COOKBOOK_MESSAGES}) == expected


@pytest.mark.parametrize(
    ("model", "expected"),
    [("gpt-3.5-turbo", 105), ("gpt-4", 105), ("gpt-4o", 101), ("gpt-4o-mini", 101)],
)
def test_function_calling_request_matches_the_cookbooks_api_counts(
    model: str, expected: int, tokenizers: Tokenizers, table: ModelTable
) -> None:
    body = {"model": model, "messages": COOKBOOK_TOOL_MESSAGES, "tools": COOKBOOK_TOOLS}
    assert _counter_for(model, tokenizers, table).count_request(body) == expected


def test_legacy_functions_field_counts_like_tools(o200k: TokenCounter) -> None:
    legacy = {"functions": [COOKBOOK_TOOLS[0]["function"]]}
    assert o200k.count_tools(legacy) == o200k.count_tools({"tools": COOKBOOK_TOOLS}) > 0


def test_plain_text_matches_the_cookbooks_string_example(tokenizers: Tokenizers) -> None:
    assert tokenizers.counter("cl100k_base").count_text("tiktoken is great!") == 6


@pytest.mark.parametrize("special", ["<|endoftext|>", "<|im_start|>", "<|fim_prefix|>"])
def test_special_token_text_is_counted_as_text_not_rejected(
    special: str, o200k: TokenCounter
) -> None:
    text = f"please print {special} literally"
    message = {"role": "user", "content": text}
    expected = len(load_encoding("o200k_base").encode(text, disallowed_special=()))
    assert o200k.count_message(message) == 3 + 1 + expected


def test_second_count_of_the_same_message_does_not_encode_again() -> None:
    encoder = CountingEncoder(load_encoding("o200k_base"))
    counter = TokenCounter(encoder, cache_size=100)
    first = counter.count_message({"role": "user", "content": "hello there"})
    calls = len(encoder.calls)
    # An equal message in a new object (as in the next request's body) is a cache hit.
    assert counter.count_message({"role": "user", "content": "hello there"}) == first
    assert len(encoder.calls) == calls
    assert counter.hits == 1


def test_a_message_with_tool_calls_is_cached_by_its_calls_too() -> None:
    encoder = CountingEncoder(load_encoding("o200k_base"))
    counter = TokenCounter(encoder, cache_size=100)

    def message(arguments: str) -> dict[str, object]:
        call = {
            "id": "c1",
            "type": "function",
            "function": {"name": "bash", "arguments": arguments},
        }
        return {"role": "assistant", "content": "Let me look.", "tool_calls": [call]}

    first = counter.count_message(message('{"command": "ls"}'))
    calls = len(encoder.calls)
    assert counter.count_message(message('{"command": "ls"}')) == first  # an equal copy: a hit
    assert len(encoder.calls) == calls
    assert counter.hits == 1
    # Other arguments are another message: counted, not taken from the cache.
    other = counter.count_message(message('{"command": "ls -la /usr/lib/python3/dist-packages"}'))
    assert other > first
    assert counter.hits == 1


def test_growing_conversation_encodes_only_its_new_messages() -> None:
    encoder = CountingEncoder(load_encoding("o200k_base"))
    counter = TokenCounter(encoder, cache_size=100)
    history = [{"role": "user", "content": f"turn {i}"} for i in range(20)]
    counter.count_messages(history)
    encoder.calls.clear()
    counter.count_messages([*history, {"role": "assistant", "content": "the new reply"}])
    assert encoder.calls == ["assistant", "the new reply"]


def test_a_message_repeated_within_one_request_is_encoded_once() -> None:
    encoder = CountingEncoder(load_encoding("o200k_base"))
    counter = TokenCounter(encoder, cache_size=100)
    pasted = {"role": "user", "content": "the same long log output"}
    total = counter.count_messages([pasted, dict(pasted), dict(pasted)])
    assert total == 3 * counter.count_message(pasted) + 3
    assert encoder.calls == ["user", "the same long log output"]


def test_messages_with_content_parts_are_cached_too() -> None:
    encoder = CountingEncoder(load_encoding("o200k_base"))
    counter = TokenCounter(encoder, cache_size=100)
    message = {"role": "user", "content": [{"type": "text", "text": "look"}]}
    first = counter.count_messages([message])
    encoder.calls.clear()
    assert counter.count_messages([{"role": "user", "content": [{"type": "text", "text": "look"}]}])
    assert counter.count_messages([message]) == first
    assert encoder.calls == []


def test_cache_is_bounded_and_evicts_the_least_recently_used() -> None:
    encoder = CountingEncoder(load_encoding("o200k_base"))
    counter = TokenCounter(encoder, cache_size=2)
    texts = [f"message {name}: long enough not to count as a short string" for name in "abc"]
    a, b, c = ({"role": "user", "content": t} for t in texts)
    for message in (a, b, a, c):  # c evicts b, the least recently used
        counter.count_message(message)
    encoder.calls.clear()
    counter.count_message(a)
    assert encoder.calls == []
    counter.count_message(b)
    assert encoder.calls == [texts[1]]  # the role's count is remembered as a short string


def test_short_strings_are_encoded_once_and_their_memory_is_bounded() -> None:
    encoder = CountingEncoder(load_encoding("o200k_base"))
    counter = TokenCounter(encoder, cache_size=0)
    first = counter.count_text("assistant")
    assert counter.count_text("assistant") == first == 1
    assert encoder.calls == ["assistant"]
    for n in range(10_000):
        counter.count_text(f"name-{n}")
    assert len(counter._short) <= 4096
    assert counter.count_text("x" * 40) == counter.count_text("x" * 40)
    assert encoder.calls.count("x" * 40) == 2  # long strings are never kept


def test_a_rewritten_message_does_not_count_its_tool_calls_again() -> None:
    encoder = CountingEncoder(load_encoding("o200k_base"))
    counter = TokenCounter(encoder, cache_size=100)
    args = '{"path": "src/module_7.py", "command": "view", "view_range": [1, 80]}'
    calls = [{"id": "c1", "type": "function", "function": {"name": "edit", "arguments": args}}]
    first = counter.count_message(
        {"role": "assistant", "content": "Let me look.", "tool_calls": calls}
    )
    encoder.calls.clear()
    rewritten = {"role": "assistant", "content": "[compacted] looked", "tool_calls": calls}
    assert counter.count_message(rewritten) == first - counter.count_text("Let me look.") + (
        counter.count_text("[compacted] looked")
    )
    assert args not in encoder.calls  # counted once, remembered by hash
    for n in range(5_000):
        counter.count_message({"role": "assistant", "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "f", "arguments": f"{args} {n}"}}
        ]})  # fmt: skip
    assert len(counter._arguments) <= 4096
    uncached = TokenCounter(encoder, cache_size=0)
    encoder.calls.clear()
    uncached.count_message(rewritten)
    uncached.count_message(rewritten)
    assert encoder.calls.count(args) == 2  # nothing kept without a cache


def test_zero_cache_size_still_counts_correctly() -> None:
    counter = TokenCounter(load_encoding("o200k_base"), cache_size=0)
    assert counter.count_messages(COOKBOOK_MESSAGES) == 124
    assert counter.count_messages(COOKBOOK_MESSAGES) == 124


@pytest.mark.parametrize(
    ("width", "height", "detail", "expected"),
    [
        (1024, 1024, "high", 765),  # OpenAI's worked example: 768x768, 4 tiles
        (2048, 4096, "high", 1105),  # -> 1024x2048 -> 768x1536, 6 tiles
        (4096, 8192, "low", 85),
        (512, 512, "auto", 255),  # small images are not scaled up
        (100, 3000, "high", 765),  # -> 68x2048: one tile wide, four high
    ],
)
def test_image_tokens_follow_openais_tile_rule(
    width: int, height: int, detail: str, expected: int
) -> None:
    assert image_tokens(width, height, detail) == expected


@pytest.mark.parametrize(
    ("model", "width", "height", "detail", "expected"),
    [
        # OpenAI vision guide, "Calculating costs", patch rule: 1024x1024 is 1024 patches; 1800x2400
        # is scaled to 1056x1408, 33x44 = 1452 patches; then the model's multiplier.
        ("gpt-4.1-mini", 1024, 1024, "high", 1659),  # 1024 x 1.62 = 1658.88
        ("gpt-4.1-mini", 1800, 2400, "high", 2353),  # 1452 x 1.62 = 2352.24
        ("gpt-4.1-nano", 1024, 1024, "high", 2520),  # 1024 x 2.46 = 2519.04
        ("o4-mini", 1800, 2400, "low", 2498),  # 1452 x 1.72 = 2497.44: no low detail for patches
        ("gpt-5-mini", 1024, 1024, "high", 1659),
        # The same guide's tile figures (its worked 1024x1024 = 4 tiles, 2048x4096 = 6 tiles).
        ("gpt-4o-mini", 1024, 1024, "high", 2833 + 4 * 5667),
        ("gpt-4o-mini", 2048, 4096, "low", 2833),
        ("gpt-5", 1024, 1024, "high", 70 + 4 * 140),
        ("o3", 2048, 4096, "high", 75 + 6 * 150),
        ("computer-use-preview", 1024, 1024, "high", 65 + 4 * 129),
        ("gpt-4.1", 1024, 1024, "high", 765),
        # Anthropic vision docs: tokens = (width x height) / 750; 200x200 ~54, 1000x1000 ~1334,
        # 1092x1092 ~1590 (its largest unscaled square); a long edge over 1568 px is scaled down.
        ("claude-sonnet-4-5", 200, 200, "auto", 54),
        ("claude-sonnet-4-5", 1000, 1000, "low", 1334),
        ("claude-opus-4-5", 1092, 1092, "high", 1590),
        ("claude-haiku-4-5", 784, 1568, "auto", 1640),  # its table's largest 1:2, unscaled
        ("claude-haiku-4-5", 1568 * 2, 784 * 2, "auto", 1640),  # scaled to 1568x784
    ],
)
def test_images_count_by_each_models_documented_rule(
    table: ModelTable, model: str, width: int, height: int, detail: str, expected: int
) -> None:
    assert image_tokens(width, height, detail, table.lookup(model).image) == expected


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-4o", 1445),  # 85 + 8 x 170
        ("gpt-4o-mini", 2833 + 8 * 5667),
        ("gpt-4.1-mini", 2489),  # the 1536-patch cap x 1.62
        ("claude-sonnet-4-5", 1640),
    ],
)
def test_a_remote_image_counts_as_its_models_maximum(
    tokenizers: Tokenizers, table: ModelTable, model: str, expected: int
) -> None:
    counter = _counter_for(model, tokenizers, table)
    text_only = counter.count_message({"role": "user", "content": "what is this"})
    remote = _image_message("https://example.com/cat.png")
    assert counter.count_message(remote) == text_only + expected


def test_one_message_counts_its_image_per_model_however_often_it_was_counted(
    tokenizers: Tokenizers, table: ModelTable
) -> None:
    message = _image_message(_data_url("image/png", _png(1024, 1024)))
    text_only = {"role": "user", "content": "what is this"}
    costs = {}
    for model in ("gpt-4o", "gpt-4.1-mini", "gpt-4o-mini", "gpt-4o", "gpt-4.1-mini"):
        counter = _counter_for(model, tokenizers, table)
        costs[model] = counter.count_message(message) - counter.count_message(text_only)
    assert costs == {"gpt-4o": 765, "gpt-4.1-mini": 1659, "gpt-4o-mini": 25501}
    assert _counter_for("gpt-4o", tokenizers, table) is not _counter_for(
        "gpt-4.1-mini", tokenizers, table
    )


def test_a_rule_with_no_low_detail_counts_a_low_detail_image_by_its_size() -> None:
    patches = ImageRule("patches", multiplier=1.0)
    assert image_tokens(1024, 1024, "low", patches) == image_tokens(1024, 1024, "high", patches)


def _png(width: int, height: int) -> bytes:
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + b"\0" * 64


def _jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0" + b"\0" * 9
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + sof + b"\xff\xd9"


def _data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


@pytest.mark.parametrize(
    ("url", "size"),
    [
        (_data_url("image/png", _png(1024, 1024)), (1024, 1024)),
        (_data_url("image/jpeg", _jpeg(2048, 4096)), (2048, 4096)),
        (_data_url("image/gif", b"GIF89a" + struct.pack("<HH", 300, 200) + b"\0" * 8), (300, 200)),
        (
            _data_url(
                "image/webp",
                b"RIFF\0\0\0\0WEBPVP8X"
                + b"\0" * 8
                + (639).to_bytes(3, "little")
                + (479).to_bytes(3, "little"),
            ),
            (640, 480),
        ),
        ("https://example.com/cat.png", None),
        ("data:image/png;base64,not-base64!!", None),
    ],
)
def test_inline_image_size_is_read_from_its_header(url: str, size: tuple[int, int] | None) -> None:
    assert data_url_size(url) == size


def _image_message(url: str, detail: str | None = None) -> dict[str, Any]:
    image: dict[str, Any] = {"url": url}
    if detail:
        image["detail"] = detail
    parts = [{"type": "text", "text": "what is this"}, {"type": "image_url", "image_url": image}]
    return {"role": "user", "content": parts}


def test_image_parts_are_counted_by_size_detail_or_a_conservative_default(
    o200k: TokenCounter,
) -> None:
    text_only = o200k.count_message({"role": "user", "content": "what is this"})
    inline = _image_message(_data_url("image/png", _png(1024, 1024)))
    assert o200k.count_message(inline) == text_only + 765
    remote = _image_message("https://example.com/cat.png")
    assert o200k.count_message(remote) == text_only + IMAGE_UNKNOWN == text_only + 1445
    assert o200k.count_message(_image_message("https://x/y.png", "low")) == text_only + 85


def test_input_audio_is_estimated_from_its_duration(o200k: TokenCounter) -> None:
    rate = 16000 * 2  # 16 kHz, 16-bit mono
    header = (
        b"RIFF" + b"\0" * 4 + b"WAVEfmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, rate, 2, 16)
    )
    wav = header + b"data" + struct.pack("<I", rate * 3) + b"\0" * (rate * 3)
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav).decode(),
                                                   "format": "wav"}}  # fmt: skip
    count = o200k.count_message({"role": "user", "content": [part]})
    assert count - (3 + 1) == 31  # three seconds at 10 tokens/s, rounded up for the header


def test_tool_calls_count_function_names_and_arguments(o200k: TokenCounter) -> None:
    args = '{"location": "San Francisco, CA", "unit": "celsius"}'
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_current_weather", "arguments": args}}  # fmt: skip
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    expected = 3 + 1 + 3 + o200k.count_text("get_current_weather") + o200k.count_text(args)
    assert o200k.count_message(message) == expected
    twice = {**message, "tool_calls": [call, {**call, "id": "call_2"}]}
    assert o200k.count_message(twice) == expected + expected - 4


def test_tool_results_count_their_content_not_their_call_id(o200k: TokenCounter) -> None:
    result = {"role": "tool", "tool_call_id": "call_abcdefghijklmnop", "content": "22 degrees"}
    assert o200k.count_message(result) == 3 + 1 + o200k.count_text("22 degrees")


def test_nested_tool_schemas_cost_more_than_flat_ones(o200k: TokenCounter) -> None:
    flat = {"type": "object", "properties": {"q": {"type": "object", "description": "query"}}}
    nested = {"type": "object", "properties": {"q": {
        "type": "object", "description": "query",
        "properties": {"text": {"type": "string"}, "limit": {"type": "integer"}}}}}  # fmt: skip

    def tools(params: dict[str, Any]) -> dict[str, Any]:
        return {"tools": [{"type": "function", "function": {"name": "f", "parameters": params}}]}

    assert o200k.count_tools(tools(nested)) > o200k.count_tools(tools(flat))


def test_custom_tools_count_their_name_description_and_grammar(o200k: TokenCounter) -> None:
    plain = {"type": "custom", "custom": {"name": "sql", "description": "Run a query"}}
    grammar = {"type": "grammar", "grammar": {"syntax": "lark", "definition": "start: SELECT"}}
    with_grammar = {"type": "custom", "custom": {**plain["custom"], "format": grammar}}
    assert o200k.count_tools({"tools": [plain]}) == 7 + o200k.count_text("sql:Run a query") + 12
    assert o200k.count_tools({"tools": [with_grammar]}) > o200k.count_tools({"tools": [plain]})


def test_json_schema_response_format_adds_its_schema(o200k: TokenCounter) -> None:
    body: dict[str, Any] = {"messages": COOKBOOK_MESSAGES}
    schema = {"name": "answer", "schema": {"type": "object",
              "properties": {"plain": {"type": "string"}}}}  # fmt: skip
    with_schema = {**body, "response_format": {"type": "json_schema", "json_schema": schema}}
    assert o200k.count_request(with_schema) > o200k.count_request(body) == 124
    json_mode = {**body, "response_format": {"type": "json_object"}}
    assert o200k.count_request(json_mode) == 124


@pytest.mark.parametrize(
    "body",
    [
        {"messages": ["just a string", 42, None]},
        {"messages": [{"role": "user", "content": 7}]},
        {"messages": [{"role": "user", "content": [1, "two", {"type": "mystery", "x": 1}]}]},
        {"messages": [{"role": "assistant", "tool_calls": "oops"}], "tools": ["bad", 3]},
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}]},
        {"messages": "not a list", "tools": [{"type": "function", "function": {"name": 1}}]},
        {"messages": [{"role": "user", "content": "x", "weird": {"nested": [1, 2]}}]},
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_audio", "input_audio": {"data": "!" * 64, "format": "wav"}},
                        {"type": "file", "file": {"file_data": "%%%", "filename": 3}},
                    ],
                }
            ]
        },
        {"messages": [], "tools": [{"type": "web_search"}, {"type": "custom", "custom": "x"}]},
    ],
)
def test_malformed_requests_are_counted_without_raising(
    body: dict[str, Any], o200k: TokenCounter
) -> None:
    assert o200k.count_request(body) >= 0


def test_tokenizers_hand_out_one_counter_per_encoding(
    tokenizers: Tokenizers, table: ModelTable
) -> None:
    assert tokenizers.for_model(table.lookup("gpt-4o")) is tokenizers.counter("o200k_base")
    assert tokenizers.for_model(table.lookup("gpt-4")).encoding_name == "cl100k_base"
    with pytest.raises(EncodingUnavailableError, match="p50k_base"):
        tokenizers.counter("p50k_base")


_TRICKY = [
    " a", " Z", "  b", "\t c", " 1", " /", "a", "Z", "1", "/", ";", "\n", "\n\n", " ", "\t",
    "\r\n", "é", "\u2019", "'s", "x/y", "\n/", ";\n", "  \n", "(", "…", "😀", "def f(x):", '{"k": 1}',
]  # fmt: skip


@pytest.mark.parametrize("name", ["o200k_base", "cl100k_base"])
def test_pieces_of_a_long_text_count_the_same_tokens_as_the_whole(name: str) -> None:
    # Long texts are counted a piece at a time (tiktoken holds the GIL while it builds a result
    # list); the cuts must never change the count.
    encoding = load_encoding(name)
    rnd = random.Random(7)
    for _ in range(300):
        text = "".join(rnd.choice(_TRICKY) for _ in range(rnd.randint(1, 3000)))
        for size in (40, 300, 5000):
            parts = list(pieces(text, size))
            assert "".join(parts) == text
            counted = sum(len(encoding.encode_ordinary(p)) for p in parts)
            assert counted == len(encoding.encode_ordinary(text))


def test_a_long_text_is_cut_near_the_piece_size_and_counted_whole() -> None:
    text = "word " * 40_000 + "\nnext line " * 10_000
    parts = list(pieces(text, 1 << 16))
    assert len(parts) > 3
    assert all(len(p) <= (1 << 16) + 20 for p in parts)
    counter = TokenCounter(load_encoding("o200k_base"), cache_size=0)
    assert counter.count_text(text) == len(load_encoding("o200k_base").encode_ordinary(text))


def test_a_huge_run_without_cut_points_is_counted_in_bounded_pieces() -> None:
    # Base64 and minified data have no safe cut for megabytes; counted whole, 20 MB took >10 s.
    encoding = load_encoding("o200k_base")
    rnd = random.Random(3)
    blob = "".join(rnd.choice(string.ascii_letters + string.digits + "+/") for _ in range(400_000))
    parts = list(pieces(blob, 1 << 16))
    counter = TokenCounter(encoding, cache_size=0)

    assert "".join(parts) == blob
    assert max(len(p) for p in parts) <= (1 << 16) + (1 << 13)  # the tail may stay whole
    exact = len(encoding.encode_ordinary(blob))
    assert exact <= counter.count_text(blob) <= exact + 2 * len(parts)
    assert counter.count_text("a" * 1_000_000) == len(encoding.encode_ordinary("a" * 1_000_000))
