"""Counting time for a ~100k-token conversation, cold and warm, for both encodings.

Cold: a fresh counter (empty cache) counts the whole request. Warm: every message but the last is
already cached, as on the next turn of a conversation. Prints, over several runs, the median and
best wall time and the median CPU time of the counting thread, with the load average: on a shared
2-core machine other processes inflate wall time, while CPU time is what the counting itself costs.
"tiktoken" is the floor: the CPU time of tiktoken alone encoding the same texts, in the same run.

    .venv/bin/python bench/count.py [--tokens 100000] [--runs 15]

The conversation is built from real aider sessions (under the directory `$BENCH_CORPORA` names;
read in place, never copied).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import tiktoken

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import locations
from proxy.tokens.counter import TokenCounter
from proxy.tokens.encodings import load_encoding


def build_conversation(target_tokens: int, counter: TokenCounter) -> list[dict[str, Any]]:
    """Concatenate real sessions until the conversation holds about `target_tokens`."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are an expert software engineer."}
    ]
    total = counter.count_messages(messages)
    with locations.corpus(locations.AIDER_SESSIONS).open("rb") as fh:
        for line in fh:
            for message in orjson.loads(line)["messages"]:
                if total >= target_tokens:
                    return messages
                messages.append(message)
                total += counter.count_message(message)
    return messages


def timings_ms(runs: int, setup: Callable[[], TokenCounter], body: dict[str, Any]) -> str:
    """Median and best wall time and median CPU time of `count_request` on fresh counters."""
    wall, cpu = [], []
    for _ in range(runs):
        counter = setup()
        start, start_cpu = time.perf_counter(), time.thread_time()
        counter.count_request(body)
        cpu.append((time.thread_time() - start_cpu) * 1000)
        wall.append((time.perf_counter() - start) * 1000)
    return f"{statistics.median(wall):>8.2f} {min(wall):>8.2f} {statistics.median(cpu):>8.2f}"


def tiktoken_floor_ms(runs: int, encoding: tiktoken.Encoding, texts: list[str]) -> float:
    """Median CPU time of tiktoken alone encoding `texts`: what no caching layer can beat cold."""
    cpu = []
    for _ in range(runs):
        start = time.thread_time()
        for text in texts:
            encoding.encode_ordinary(text)
        cpu.append((time.thread_time() - start) * 1000)
    return statistics.median(cpu)


def main() -> None:
    """Print cold and warm counting times per encoding."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()

    sizer = TokenCounter(load_encoding("o200k_base"), cache_size=0)
    messages = build_conversation(args.tokens, sizer)
    body = {"model": "gpt-4o", "messages": messages}
    size = len(orjson.dumps(body))
    source = locations.corpus(locations.AIDER_SESSIONS)
    print(f"conversation: {len(messages)} messages, {size / 1024:.0f} KiB, from {source}")
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    texts = [m["content"] for m in messages if isinstance(m.get("content"), str)]
    print(f"{'':<21} {'cold (ms)':^26} {'warm (ms)':^26} {'tiktoken':>9}   ({args.runs} runs)")
    header = f"{'encoding':<12} {'tokens':>8}" + f" {'median':>8} {'best':>8} {'cpu':>8}" * 2
    header += f" {'cpu':>9}"
    print(header)
    for name in ("o200k_base", "cl100k_base"):
        encoding = load_encoding(name)

        def cold(encoding: Any = encoding) -> TokenCounter:
            return TokenCounter(encoding, cache_size=100_000)

        def warm(encoding: Any = encoding) -> TokenCounter:
            counter = TokenCounter(encoding, cache_size=100_000)
            counter.count_messages(messages[:-1])
            return counter

        tokens = cold().count_request(body)
        cold_ms = timings_ms(args.runs, cold, body)
        warm_ms = timings_ms(args.runs, warm, body)
        floor = tiktoken_floor_ms(args.runs, encoding, texts)
        print(f"{name:<12} {tokens:>8} {cold_ms} {warm_ms} {floor:>9.2f}")


if __name__ == "__main__":
    main()
