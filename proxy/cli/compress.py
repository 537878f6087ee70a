"""`compactd compress`: the proxy's compaction pipeline over JSONL, without a server or store."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TextIO

import orjson

from proxy.chat.planner import compression_config
from proxy.cli.progress import counter
from proxy.config import PolicySettings, Settings
from proxy.errors import LineError
from proxy.providers.bound import bound_chain
from proxy.providers.chain import run_chain
from proxy.providers.registry import ProviderRegistry
from proxy.runtime.exactjson import holds_wide_int
from proxy.tokens.budget import ModelTable
from proxy.tokens.counter import Tokenizers

_MAX_BUDGET = 2**63 - 1
"""More tokens than any request has; past it the budget would not even serialize (1e300), and
the line's failure would end the run instead of being that line's error."""


@dataclass(frozen=True)
class Defaults:
    """Flags that fill in what a line leaves out."""

    model: str = "gpt-4o"
    provider: str = ""
    budget: float = 0.5
    """Tokens the whole request must fit; a value <= 1 is a fraction of the line's own count."""
    target_ratio: float = 1.0


class OfflineCompressor:
    """Compresses one JSONL object at a time with the configured providers."""

    def __init__(self, settings: Settings, defaults: Defaults) -> None:
        self.settings = settings
        self.defaults = defaults
        self.tokenizers = Tokenizers(None, settings.tokens.cache_size)
        models_file = settings.tokens.models_file
        self.models = ModelTable.load(Path(models_file) if models_file else None)
        self.registry = ProviderRegistry()
        self.policy: PolicySettings = settings.default_policy

    async def compress(self, line: dict[str, Any]) -> dict[str, Any]:
        """One output object for one input object."""
        messages = line.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise LineError("'messages' must be a list of message objects")
        model = str(line.get("model") or self.defaults.model)
        provider = str(line.get("provider") or self.defaults.provider)
        names = (provider,) if provider else self.policy.providers
        try:
            instances = {n: self.registry.get(n) for n in names}
        except ValueError as exc:
            raise LineError(str(exc)) from None
        counter = self.tokenizers.for_model(self.models.lookup(model))
        body = {"messages": messages, "tools": line.get("tools")}
        fixed = counter.count_tools(body)
        before = fixed + counter.count_messages(messages)
        raw_budget = line.get("budget", self.defaults.budget)
        if (
            not isinstance(raw_budget, int | float)
            or isinstance(raw_budget, bool)
            or not 0 < raw_budget <= _MAX_BUDGET
        ):
            raise LineError("'budget' must be a positive number (of tokens, below 2**63)")
        budget = int(raw_budget * before) if raw_budget <= 1 else int(raw_budget)
        chain = bound_chain(names, instances, self.policy.options)
        config = compression_config(
            self.policy,
            counter=counter,
            fixed=fixed,
            limit=max(1, int(budget * self.defaults.target_ratio)),
            budget=budget,
        )
        config = dataclasses.replace(config, model=model)
        t0 = time.perf_counter()
        outcome = await run_chain(messages, chain, config)
        ms = (time.perf_counter() - t0) * 1000
        result = outcome.result
        after = outcome.tokens_after if result is not None else before
        return {
            "id": line.get("id"),
            "messages": result.messages if result is not None else messages,
            "verbatim": result.verbatim if result is not None else {},
            "stats": {
                "tokens_before": before,
                "tokens_after": after,
                "budget": budget,
                "fits": after <= budget,
                "ratio": round(after / before, 4) if before else 1.0,
                "provider": "+".join(outcome.providers) or "none",
                "ms": round(ms, 3),
                "violations": list(outcome.violations),
            },
        }


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    while True:
        line = stream.readline()
        if not line:
            return
        yield line


class Progress:
    """A running count on a terminal (stderr): lines, errors and tokens before -> after.

    Drawn by tqdm as soon as the run starts (so a long first line does not look like a hang),
    and not at all without a stream (stderr piped)."""

    def __init__(self, stream: TextIO | None) -> None:
        self.lines = 0
        self.failures = 0
        self.tokens_before = 0
        self.tokens_after = 0
        self._bar = counter(stream, "compress", " lines") if stream is not None else None

    def add(self, result: dict[str, Any]) -> None:
        """Count one output line."""
        self.lines += 1
        stats = result.get("stats")
        if isinstance(stats, dict):
            self.tokens_before += int(stats["tokens_before"])
            self.tokens_after += int(stats["tokens_after"])
        else:
            self.failures += 1
        if self._bar is not None:
            self._bar.set_postfix_str(self.summary(), refresh=False)
            self._bar.update(1)

    def summary(self) -> str:
        """`N errors, before -> after tokens (ratio)`."""
        ratio = self.tokens_after / self.tokens_before if self.tokens_before else 1.0
        return (
            f"{self.failures:,} errors, "
            f"{self.tokens_before:,} -> {self.tokens_after:,} tokens ({ratio:.0%})"
        )

    def done(self) -> None:
        """The final count, left on its line."""
        if self._bar is not None:
            self._bar.set_postfix_str(self.summary(), refresh=False)
            self._bar.close()


async def run(
    compressor: OfflineCompressor,
    lines: Iterable[bytes],
    out: IO[bytes],
    progress: Progress | None = None,
) -> int:
    """Write exactly one JSONL line per input line, in order, flushed as it goes."""
    progress = progress or Progress(None)
    failures = 0
    for raw in lines:
        line_id: Any = None
        try:
            if not raw.strip():
                # Answered like any bad line: line n of the output stays line n's answer.
                raise LineError("a blank line: each line must be a JSON object")  # noqa: TRY301
            line = orjson.loads(raw)
            if not isinstance(line, dict):
                raise LineError("each line must be a JSON object")  # noqa: TRY301
            line_id = line.get("id")
            if holds_wide_int(raw):
                # As the proxy: its messages could not be written back with the same numbers.
                raise LineError("an integer beyond 64 bits: not compacted")  # noqa: TRY301
            result = await compressor.compress(line)
        except (orjson.JSONDecodeError, LineError) as exc:
            failures += 1
            result = {"id": line_id, "error": str(exc)}
        out.write(orjson.dumps(result) + b"\n")
        out.flush()
        progress.add(result)
    progress.done()
    return failures


def main(
    settings: Settings,
    defaults: Defaults,
    stdin: IO[bytes],
    stdout: IO[bytes],
    progress: TextIO | None = None,
) -> int:
    """Run the filter; exit status 0 even when single lines fail (they say so themselves).

    With `progress` (stderr, when it is a terminal), a running count is drawn on one line.
    """
    compressor = OfflineCompressor(settings, defaults)
    asyncio.run(run(compressor, _lines(stdin), stdout, Progress(progress)))
    return 0
