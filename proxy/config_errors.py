"""Configuration problems: the error, and every problem of one load collected together.

While `collecting()` is active, `check` notes a failed condition and loading goes on, so one
run of `compactd check-config` (or `serve`) reports every problem of a file, not the first;
outside it, a failed check raises at once. `did_you_mean` names the key a misspelling was
probably meant to be.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from contextvars import ContextVar

from proxy.errors import ConfigError

_PROBLEMS: ContextVar[list[str] | None] = ContextVar("compactd_config_problems", default=None)
"""While a load runs: where every problem goes, so all are reported together."""


@contextlib.contextmanager
def collecting(problems: list[str]) -> Iterator[list[str]]:
    """Note problems into `problems` instead of raising them, for the duration."""
    token = _PROBLEMS.set(problems)
    try:
        yield problems
    finally:
        _PROBLEMS.reset(token)


def check(cond: bool, key: str, why: str) -> None:
    """A validation: a failure is noted while collecting, else raised."""
    if not cond:
        problem(ConfigError(f"{key}: {why}"))


def require(cond: bool, key: str, why: str) -> None:
    """A check the code after it relies on: always raises (the loader notes it and goes on)."""
    if not cond:
        raise ConfigError(f"{key}: {why}")


def problem(exc: ConfigError) -> None:
    """Note a problem while collecting (raise it otherwise)."""
    problems = _PROBLEMS.get()
    if problems is None:
        raise exc
    problems.append(str(exc))


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """` (did you mean X?)` for the closest known name, or nothing."""
    import difflib  # noqa: PLC0415  (only for a misspelling: ~0.2 MB a worker need not hold)

    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""
