"""When each request of a replayed session is sent: real timestamps where a corpus has them,
else a seeded gap model per kind of turn.

A request's gap (the seconds since the session's previous request) depends on what the client
waited for, read off the message just before the request's reply:

- `tool`: a tool result (an agent's loop: the model's own latency plus the tool's run):
  log-normal, median 8 s, sigma 0.8 (99.9 % under 2 minutes).
- `human`: a user message typed in a live session: log-normal, median 45 s, sigma 1.0 (95 %
  under 4 minutes); and with probability 0.1 the user comes back later instead: log-normal,
  median 1 hour, sigma 1.5 (10 % under 9 minutes, 10 % over 6.8 hours). Heavy-tailed on purpose:
  chat apps see people return after minutes or hours.
- `day` (real, memorybank): the first user message of a day carries its date (`[YYYY-MM-DD]`);
  that request is sent at 09:00 of its day, the day's others after `human` gaps.
- `session` (memory-tests): a user message opening a new session (`(session N)`); the corpus has
  no times, so a session is taken to start one day after the previous one.
- aider: the sessions' real start times (`started_at`) bound each session: its `human` gaps are
  scaled down to end before the next session starts, when they would not.

IRC help threads had real times in their logs, but bench/corpora.py drops them: `human` gaps.
Every draw comes from a `random.Random` seeded with the seed and the session's id, so a run is
reproducible and every policy of a session sees the same times.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from bench import locations

TOOL = (8.0, 0.8)
"""Median seconds, sigma of the log-normal agent-loop gap."""
HUMAN = (45.0, 1.0)
RETURN = (3600.0, 1.5)
RETURN_SHARE = 0.1
DAY_START = 9 * 3600
_DATE = re.compile(r"^\[(\d{4}-\d{2}-\d{2})\]")
_SESSION = re.compile(r"^\(session (\d+)\)")
KINDS = ("tool", "human", "return", "day", "session")


@dataclass(frozen=True)
class Timing:
    """One session's request times (seconds from its first request) and each gap's kind."""

    times: list[float]
    kinds: list[str]
    """The kind of each request's gap (the first request's: "start")."""


def _lognormal(rng: random.Random, median_sigma: tuple[float, float]) -> float:
    median, sigma = median_sigma
    return float(math.exp(math.log(median) + sigma * rng.gauss(0.0, 1.0)))


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def gap(rng: random.Random, before: dict[str, Any]) -> tuple[float, str]:
    """A drawn gap and its kind, for a request whose last message is `before`."""
    if before.get("role") == "tool":
        return _lognormal(rng, TOOL), "tool"
    if rng.random() < RETURN_SHARE:
        return _lognormal(rng, RETURN), "return"
    return _lognormal(rng, HUMAN), "human"


def timing(
    corpus: str, case_id: str, messages: Sequence[dict[str, Any]], turns: Sequence[int], seed: int
) -> Timing:
    """The send time of each request (`turns`: the index of each request's reply)."""
    rng = random.Random(f"{seed}:{corpus}:{case_id}")
    times, kinds = [0.0], ["start"]
    first_day: dt.date | None = None
    for prev, index in itertools.pairwise(turns):
        before = messages[index - 1]
        said = [_text(m) for m in messages[prev + 1 : index] if m.get("role") == "user"]
        when, kind = times[-1], ""
        dates = [dt.date.fromisoformat(d.group(1)) for t in said if (d := _DATE.match(t))]
        if dates:
            first_day = first_day or _first_date(messages[: turns[0]]) or dates[0]
            start = (dates[-1] - first_day).days * 86400.0 + DAY_START
            if start > when:
                when, kind = start, "day"
        if not kind and any(_SESSION.match(t) for t in said):
            when, kind = when + 86400.0, "session"
        if not kind:
            drawn, kind = gap(rng, before)
            when += drawn
        times.append(when)
        kinds.append(kind)
    if corpus == "aider":
        span = aider_spans().get(case_id)
        if span is not None and times[-1] > span > 0:
            times = [t * span / times[-1] for t in times]
    return Timing(times, kinds)


def _first_date(messages: Sequence[dict[str, Any]]) -> dt.date | None:
    for m in messages:
        found = _DATE.match(_text(m)) if m.get("role") == "user" else None
        if found is not None:
            return dt.date.fromisoformat(found.group(1))
    return None


@functools.cache
def aider_spans() -> dict[str, float]:
    """Each aider session's real length bound: seconds until the next session started."""
    try:
        path = locations.corpus(locations.AIDER_SESSIONS)
        rows = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    except OSError:  # no corpora configured: no bound
        return {}
    starts = sorted(
        (dt.datetime.fromisoformat(r["started_at"]).timestamp(), r["id"])
        for r in rows
        if r.get("started_at")
    )
    return {a_id: b - a for (a, a_id), (b, _) in itertools.pairwise(starts)}
