"""Fixed request and response bodies for the overhead benchmark.

Every body is deterministic so that runs compare like with like, and the SSE body is split into
events here once so the load generator can check each relayed event against the original bytes.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import locations

MODEL_SMALL = "gpt-4o-mini"
# A 1M-token context window keeps the ~100k-token body far under budget, so nothing is compacted
# and the figure measures counting + forwarding only.
MODEL_LARGE = "gpt-4.1"


_PROSE = (
    "The customer wants to change the return flight of reservation ZFA04Y from Newark to "
    "Seattle, keeping the same cabin class, and asks whether the travel insurance still covers "
    "the new dates. Check the fare rules first, then list the options with their price "
    "differences before changing anything. "
)


def _dumps(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def chat_body(stream: bool = False) -> bytes:
    """A ~2 KB chat request: system prompt, a short exchange, and a new user turn."""
    messages = [
        {"role": "system", "content": "You are a careful airline support agent. " + _PROSE},
        {"role": "user", "content": _PROSE * 2},
        {"role": "assistant", "content": "Certainly. " + _PROSE},
        {"role": "user", "content": "Please go ahead and list the options. " + _PROSE * 2},
    ]
    body: dict[str, object] = {"model": MODEL_SMALL, "messages": messages, "temperature": 0.2}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return _dumps(body)


def _corpus_messages(corpus: Path | None) -> list[dict[str, object]]:
    """Real aider coding sessions (`corpus`, JSON lines of {"messages": [...]}), or Python's own
    stdlib sources when the corpora are absent (or `$BENCH_CORPORA` is not set: None)."""
    if corpus is not None and corpus.exists():
        out: list[dict[str, object]] = []
        with corpus.open(encoding="utf-8") as fh:
            for line in fh:
                out.extend(json.loads(line)["messages"])
        return out
    # Fallback: real code text that is always present, Python's own json package sources.
    text = "".join(p.read_text() for p in sorted(Path(json.__file__).parent.glob("*.py")))
    return [
        {"role": "user" if i % 2 == 0 else "assistant", "content": text[: 2000 + 50 * i]}
        for i in range(400)
    ]


def _aider_sessions() -> Path | None:
    try:
        return locations.corpus(locations.AIDER_PLAIN)
    except locations.CorporaUnsetError:
        return None


def large_body(target_bytes: int = 400_000, corpus: Path | None = None) -> bytes:
    """A ~400 KB (~100k-token) chat request of real conversation turns, ending on a user turn
    (`corpus`: the aider sessions under `$BENCH_CORPORA` by default)."""
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "You are an expert software engineer. Make minimal edits."}
    ]
    size = 0
    for msg in _corpus_messages(corpus or _aider_sessions()):
        if size >= target_bytes:
            break
        messages.append({"role": msg["role"], "content": msg["content"]})
        size += len(_dumps(messages[-1]))
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "Now run the tests and fix what fails."})
    return _dumps({"model": MODEL_LARGE, "messages": messages, "max_tokens": 4096})


def completion_response() -> bytes:
    """A fixed non-streamed chat.completion body as OpenAI returns it."""
    return _dumps(
        {
            "id": "chatcmpl-bench0000000000000000000001",
            "object": "chat.completion",
            "created": 1760000000,
            "model": "gpt-4o-mini-2024-07-18",
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "Here are the options for your return flight. " * 6,
                        "refusal": None,
                        "annotations": [],
                    },
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 412, "completion_tokens": 61, "total_tokens": 473},
            "service_tier": "default",
            "system_fingerprint": "fp_bench",
        }
    )


def sse_events(chunks: int = 32) -> list[bytes]:
    """The SSE response as `chunks` events: role, deltas, finish with usage, `[DONE]`."""
    base = {
        "id": "chatcmpl-bench0000000000000000000002",
        "object": "chat.completion.chunk",
        "created": 1760000000,
        "model": "gpt-4o-mini-2024-07-18",
        "system_fingerprint": "fp_bench",
    }
    words = ("Here", " are", " the", " options", " for", " your", " return", " flight", ".")
    events = [
        b"data: "
        + _dumps({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        + b"\n\n"
    ]
    for i in range(chunks - 3):
        delta = {"content": words[i % len(words)]}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        events.append(b"data: " + _dumps({**base, "choices": [choice]}) + b"\n\n")
    usage = {"prompt_tokens": 412, "completion_tokens": chunks - 3, "total_tokens": 409 + chunks}
    last = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    events.append(b"data: " + _dumps({**base, "choices": [last], "usage": usage}) + b"\n\n")
    events.append(b"data: [DONE]\n\n")
    return events
