"""Context windows learned from upstream errors: validated, bounded below, scoped, shared, expiring.

When the upstream refuses a request as too long, its message usually states the window ("maximum
context length is 128000 tokens"). That text is not always the upstream's own: a validation error
that echoes client input can carry any figure. So a window is learned only when the error also
states how long the request was, that figure agrees with what compactd counted for the bytes it
actually sent, and the request really exceeded the stated window. A learned window only ever
lowers the model table's, and never below a floor no sane model is under: twice the table's
default output (below that, reserving the output would leave no room for the prompt),
`tokens.min_learned_window`, and 1/32 of the table's window. It is scoped to the upstream and
the model, shared with every worker and instance through the store, and expires
(`tokens.learned_window_seconds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import time
from dataclasses import dataclass
from typing import Protocol

from proxy.config import TokenSettings
from proxy.errors import StoreError
from proxy.store.base import key_name
from proxy.tokens.budget import ModelInfo

log = logging.getLogger("compactd.windows")

TOLERANCE = 0.25
"""How far the upstream's count of the request may be from ours (tokenizers differ)."""
MODEL_CHARS = 128
MAX_ENTRIES = 1024
REFRESH_SECONDS = 30.0

_N = r"([0-9][0-9,]{0,12})"
_LIMIT = re.compile(
    rf"(?:maximum context length is|configured limit of|context window of)\s+{_N}\s+tokens",
    re.IGNORECASE,
)
_RESULTED = re.compile(rf"resulted in\s+{_N}\s+tokens", re.IGNORECASE)
_REQUESTED = re.compile(rf"you requested\s+{_N}\s+tokens\s*\(\s*{_N}\s+in the messages", re.I)
_INPUT = re.compile(rf"request has\s+{_N}\s+input tokens", re.IGNORECASE)
_ANTHROPIC = re.compile(rf"prompt is too long:\s*{_N}\s+tokens\s*>\s*{_N}\s+maximum", re.I)
_ANTHROPIC_TOTAL = re.compile(
    rf"exceed context limit:\s*{_N}\s*\+\s*{_N}\s*>\s*{_N}", re.IGNORECASE
)
# Anthropic's whole message when the input fits the window but not with `max_tokens`.
_ANTHROPIC_TOTAL_WHOLE = re.compile(
    rf"input length and `max_tokens` exceed context limit:\s*{_N}\s*\+\s*{_N}\s*>\s*{_N},"
    r"\s*decrease input length or `max_tokens` and try again",
    re.IGNORECASE,
)
_SCAN_CHARS = 4096  # the figures sit at the start of every known phrasing


def _int(text: str) -> int:
    return int(text.replace(",", ""))


@dataclass(frozen=True)
class Overflow:
    """What a context-length error states: the limit, and the request's length as it saw it."""

    limit: int
    prompt: int | None = None
    """Tokens of the request's input (messages, tools) as the upstream counted them."""
    total: int | None = None
    """Input plus the requested completion, when the upstream says so."""


def parse_overflow(message: str) -> Overflow | None:
    """The figures of an upstream's context-length message, or None without a stated limit."""
    text = message[:_SCAN_CHARS]
    if found := _ANTHROPIC.search(text):
        return Overflow(limit=_int(found.group(2)), prompt=_int(found.group(1)))
    if found := _ANTHROPIC_TOTAL.search(text):  # the input fits, not with `max_tokens`
        prompt = _int(found.group(1))
        return Overflow(_int(found.group(3)), prompt=prompt, total=prompt + _int(found.group(2)))
    stated = _LIMIT.search(text)
    if stated is None:
        return None
    limit = _int(stated.group(1))
    if found := _REQUESTED.search(text):
        return Overflow(limit, prompt=_int(found.group(2)), total=_int(found.group(1)))
    found = _RESULTED.search(text) or _INPUT.search(text)
    return Overflow(limit, prompt=_int(found.group(1)) if found else None)


def counted_prompt(message: str) -> int | None:
    """The request's length as the upstream counted it, for calibration: only from a message
    that is wholly the upstream's own overflow error (`prompt is too long: N tokens > M
    maximum`, N > M, or `input length and `max_tokens` exceed context limit: N + K > M, …`,
    N + K > M). An error that echoes client input (an unknown `tool_use_id`) says more than
    that, and its figures are the client's, not the upstream's count of what we sent."""
    text = message.strip()
    if found := _ANTHROPIC.fullmatch(text):
        prompt, over = _int(found.group(1)), _int(found.group(1)) > _int(found.group(2))
    elif found := _ANTHROPIC_TOTAL_WHOLE.fullmatch(text):
        prompt = _int(found.group(1))
        over = prompt + _int(found.group(2)) > _int(found.group(3))
    else:
        return None
    return prompt if over else None


def floor_for(info: ModelInfo, minimum: int) -> int:
    """The smallest window that may be learned for a model with this table entry."""
    table = info.context_window
    return min(table, max(minimum, table // 32, 2 * info.max_output))


def validated_window(
    message: str, *, sent: int, requested_output: int, info: ModelInfo, minimum: int
) -> int | None:
    """The window this error teaches about the model, or None if it is not to be trusted.

    `sent`: our count of the request as sent; `requested_output`: its max (completion) tokens;
    `info`: the model's table entry.
    """
    found = parse_overflow(message)
    if found is None or found.prompt is None or sent <= 0:
        return None
    if abs(found.prompt - sent) > TOLERANCE * sent:
        return None  # not about the request we sent (or not the upstream's own figure)
    total = found.total if found.total is not None else found.prompt + requested_output
    if max(total, found.prompt) <= found.limit:
        return None  # it would have fitted: the figures do not describe an overflow
    if info.max_input and found.limit >= info.max_input:
        return None  # the model's own input limit, which budgets already keep to
    learned = max(found.limit, floor_for(info, minimum))
    if learned >= info.context_window:
        return None  # nothing to learn: only ever lower the table's window
    return learned


def retry_window(message: str, *, sent: int, info: ModelInfo, minimum: int) -> int:
    """The window one refused request is retried under: the stated limit or 70 % of what was
    sent, within the same bounds (used once, never stored). The limit is in the upstream's
    units; when it also states a plausible count of the request (within `TOLERANCE` of ours)
    above ours, the limit is scaled to ours (limit * sent / its count), or a budget of the
    limit in our units would still be too long in its."""
    found = parse_overflow(message)
    guess = found.limit if found is not None else int(sent * 0.7)
    if (
        found is not None
        and found.prompt is not None
        and sent < found.prompt <= sent + TOLERANCE * sent
    ):
        guess = found.limit * sent // found.prompt
    return max(min(guess, info.context_window), floor_for(info, minimum))


class WindowStore(Protocol):
    """The store methods learned windows use (every Store has them)."""

    async def put_window(self, scope: str, model: str, window: int, ttl_seconds: int) -> None:
        """Record a learned window (the latest wins)."""

    async def windows(self, scope: str) -> dict[str, int]:
        """Every unexpired learned window of this scope: model -> window."""


def upstream_scope(upstream_url: str) -> str:
    """The scope windows learned from this upstream are kept under."""
    return hashlib.sha256(upstream_url.rstrip("/").encode()).hexdigest()[:16]


class LearnedWindows:
    """This process's view of the windows learned for one upstream, refreshed from the store."""

    def __init__(
        self, store: WindowStore, upstream_url: str, settings: TokenSettings | None = None
    ) -> None:
        settings = settings or TokenSettings()
        self._store = store
        self.scope = upstream_scope(upstream_url)
        self.ttl_seconds = settings.learned_window_seconds
        self.minimum = settings.min_learned_window
        self.refresh_seconds = REFRESH_SECONDS
        self._local: dict[str, tuple[int, float]] = {}
        self._unshared: set[str] = set()
        """Learned here, not yet in the store: kept by a refresh until they expire."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None

    @staticmethod
    def key(model: str) -> str:
        """The name a model's window is kept under."""
        return key_name(model.lower(), MODEL_CHARS)

    def get(self, model: str) -> int | None:
        """The learned window of `model`, if one is live."""
        entry = self._local.get(self.key(model))
        if entry is None or entry[1] <= time.time():
            return None
        return entry[0]

    def apply(self, model: str, info: ModelInfo) -> ModelInfo:
        """`info` with the learned window of `model`, if one is live (within the bounds)."""
        learned = self.get(model)
        if learned is None or learned >= info.context_window:
            return info
        return info.with_window(max(learned, floor_for(info, self.minimum)))

    def learn(self, model: str, window: int) -> None:
        """Use `window` from now on here, and share it through the store (off the request path)."""
        key = self.key(model)
        if key not in self._local and len(self._local) >= MAX_ENTRIES:
            self._prune()
            if len(self._local) >= MAX_ENTRIES:
                return
        self._local[key] = (window, time.time() + self.ttl_seconds)
        self._unshared.add(key)
        task = asyncio.ensure_future(self._share(key, window))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _share(self, key: str, window: int) -> None:
        try:
            await self._store.put_window(self.scope, key, window, self.ttl_seconds)
        except StoreError as exc:
            log.warning("learned window not shared: %s", exc)
            return
        self._unshared.discard(key)

    def _prune(self) -> None:
        now = time.time()
        self._local = {k: v for k, v in self._local.items() if v[1] > now}

    async def refresh(self) -> None:
        """Adopt what every worker and instance learned (the store's view replaces ours)."""
        try:
            found = await self._store.windows(self.scope)
        except StoreError as exc:
            log.warning("learned windows not refreshed: %s", exc)
            return
        now = time.time()
        # The store says what is live; what it dropped goes at the next refresh at the latest.
        expires = now + self.refresh_seconds * 2
        fresh = {k: (w, expires) for k, w in list(found.items())[:MAX_ENTRIES]}
        mine = {k: v for k, v in self._local.items() if k in self._unshared and v[1] > now}
        self._unshared &= set(mine)
        self._local = {**fresh, **mine}

    def start(self) -> None:
        """Load the shared windows now and then every refresh interval."""
        if self._loop_task is None:
            self._loop_task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            await self.refresh()
            await asyncio.sleep(self.refresh_seconds)

    async def aclose(self) -> None:
        """Stop refreshing; let pending shares finish."""
        if self._loop_task is not None:
            self._loop_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._loop_task
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
