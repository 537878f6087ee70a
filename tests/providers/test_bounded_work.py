"""No regex in a provider ever runs over more than a bounded piece of text, whatever its shape.

A regex call holds the GIL for as long as it runs: one over a multi-megabyte message with no
sentence breaks stalled the event loop for seconds. Every compiled pattern of the provider
modules is wrapped to record how much text each call is handed (pos to endpos), and the
providers compress messages of a few shapes that defeat sentence and line splitting.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

from proxy.providers import engine, markers, pieces, rendering, salience, trim_plan, units
from proxy.providers.base import CompactionResult, Message
from proxy.providers.engine import EngineProvider
from proxy.providers.trim import TrimProvider
from proxy.providers.validate import check_result
from proxy.text import extractive_summary, facts, prose
from tests.providers.build import assistant, system, tool, user
from tests.providers.tokens import count_tokens, make_config

MODULES: tuple[ModuleType, ...] = (
    engine, facts, markers, pieces, prose, rendering, salience, extractive_summary, trim_plan,
    units,
)  # fmt: skip
# scan_spans cuts pieces of SCAN_CHARS to twice that; nothing else may see more.
BOUND = 2 * facts.SCAN_CHARS
SIZE = 600_000


class _Recording:
    """A compiled pattern that records how many characters each call may scan."""

    def __init__(self, pattern: re.Pattern[str], seen: list[tuple[int, str]]) -> None:
        self._pattern = pattern
        self._seen = seen

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._pattern, name)
        if name in ("search", "findall", "finditer", "fullmatch"):
            return self._ranged(attr)
        if name == "split":
            return self._whole(attr, 0)
        if name in ("sub", "subn"):
            return self._whole(attr, 1)
        return attr

    def _ranged(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(string: str, pos: int = 0, endpos: int | None = None) -> Any:
            end = len(string) if endpos is None else min(endpos, len(string))
            self._seen.append((end - pos, self._pattern.pattern[:40]))
            return method(string, pos) if endpos is None else method(string, pos, endpos)

        return call

    def _whole(self, method: Callable[..., Any], at: int) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self._seen.append((len(args[at]), self._pattern.pattern[:40]))
            return method(*args, **kwargs)

        return call


@pytest.fixture
def scanned(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    seen: list[tuple[int, str]] = []
    for module in MODULES:
        for name, value in vars(module).items():
            if isinstance(value, re.Pattern):
                monkeypatch.setattr(module, name, _Recording(value, seen))
    return seen


def _shapes() -> dict[str, str]:
    return {
        "words, no sentence end": "lorem ipsum dolor sit amet " * (SIZE // 27),
        "one token": "x" * SIZE,
        "ids and names": "alpha_1 Beta, gamma/delta.py (call( " * (SIZE // 36),
        "dots": "a." * (SIZE // 2),
    }


def _conversation(big: str) -> list[Message]:
    return [
        system(),
        user(big),
        assistant("Noted.", "c0"),
        tool("c0", big),
        assistant("Looked at it."),
        user("What now?"),
    ]


@pytest.mark.parametrize("provider", [TrimProvider(), EngineProvider()], ids=["trim", "engine"])
@pytest.mark.parametrize("shape", list(_shapes()))
def test_no_regex_sees_more_than_a_piece_of_a_huge_message(
    scanned: list[tuple[int, str]], provider: Any, shape: str
) -> None:
    messages = _conversation(_shapes()[shape])
    limit = count_tokens(messages) // 2
    config = make_config(limit)
    result = provider.compress(messages, config)
    assert scanned, "the recording reached the providers' patterns"
    longest = max(scanned)
    assert longest[0] <= BOUND, f"{longest[1]!r} scanned {longest[0]:,} characters at once"
    assert isinstance(result, CompactionResult)
    assert check_result(messages, result, config) == []
    assert count_tokens(result.messages) <= limit


TEXT_OPERATIONS: dict[str, Callable[[str], object]] = {
    "summary": lambda text: extractive_summary.summarize_text(text, 0.4),
    "condense": lambda text: prose.condense(text, 0.5),
    "facts": facts.all_matches,
    "names": facts.name_matches,
    "fact tokens": prose.fact_tokens,
    "paths": prose.paths_in,
    "pieces": pieces.split,
    "terms": salience.terms,
    "edges": lambda text: salience.edges(text, 32),
}


@pytest.mark.parametrize("operation", list(TEXT_OPERATIONS))
def test_every_text_operation_works_a_piece_at_a_time(
    scanned: list[tuple[int, str]], operation: str
) -> None:
    for text in _shapes().values():
        TEXT_OPERATIONS[operation](text)
    longest = max(scanned, default=(0, ""))
    assert longest[0] <= BOUND, f"{longest[1]!r} scanned {longest[0]:,} characters at once"
