"""How far our token estimate is from an upstream's own count, per API and model.

Anthropic's tokenizer is not public: compactd counts its requests with tiktoken and learns, from
the `usage` of real responses, the ratio of the upstream's input count to that estimate. The
budget is then expressed in estimate units (budget / ratio), so a request is compacted when the
upstream would count it over the budget. The ratio is a moving average, bounded, learned only
from requests large enough for the fixed overheads not to dominate, and shared across workers
through the store (`sync`).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from proxy.budget import Budget

MIN_ESTIMATE = 1000
"""Estimates below this many tokens teach nothing (framing and tool prompts dominate them)."""
WEIGHT = 0.25
LOW, HIGH = 0.5, 4.0
_MAX_MODELS = 512


@dataclass
class Calibration:
    """Ratios upstream / estimate per (api, model), for the APIs listed in `apis`."""

    apis: frozenset[str] = frozenset({"messages"})
    _ratios: dict[tuple[str, str], float] = field(default_factory=dict)
    _dirty: set[tuple[str, str]] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ratio(self, api: str, model: str) -> float:
        """The learned ratio (1.0 until something was learned)."""
        return self._ratios.get((api, model.lower()), 1.0) if api in self.apis else 1.0

    def budget(self, api: str, model: str, budget: Budget) -> Budget:
        """`budget` in estimate units for this API and model."""
        ratio = self.ratio(api, model)
        if ratio == 1.0:
            return budget
        return dataclasses.replace(
            budget,
            budget=max(1, int(budget.budget / ratio)),
            trigger=max(1, int(budget.trigger / ratio)),
            target=max(1, int(budget.target / ratio)),
        )

    def observe(self, api: str, model: str, estimate: int, actual: int) -> None:
        """One response: we estimated `estimate` input tokens, the upstream billed `actual`."""
        if api not in self.apis or estimate < MIN_ESTIMATE or actual <= 0 or not model:
            return
        sample = min(HIGH, max(LOW, actual / estimate))
        key = (api, model.lower())
        with self._lock:
            old = self._ratios.get(key)
            if old is None and len(self._ratios) >= _MAX_MODELS:
                return
            self._ratios[key] = sample if old is None else old + WEIGHT * (sample - old)
            self._dirty.add(key)

    def merge(self, stored: Mapping[tuple[str, str], float]) -> None:
        """Ratios other workers stored; ours, where we learned something since, win."""
        with self._lock:
            for key, value in stored.items():
                if key not in self._dirty and LOW <= value <= HIGH:
                    self._ratios[key] = value

    def take_dirty(self) -> Iterable[tuple[tuple[str, str], float]]:
        """The ratios learned since the last call (to store them)."""
        with self._lock:
            out = [(k, self._ratios[k]) for k in self._dirty]
            self._dirty.clear()
        return out
