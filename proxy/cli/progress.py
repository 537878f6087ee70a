"""Progress of long CLI work on a terminal (tqdm), and nothing at all when stderr is piped.

tqdm draws, rate-limits and clears the line, sizes it to the terminal and turns itself off when
its stream is not a terminal (`disable=None`), which is what a command in a pipeline wants.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable
from typing import Any, TextIO, TypeVar

from tqdm import tqdm

T = TypeVar("T")
TICK = 0.2
"""Seconds between redraws of an elapsed-time line."""


def counter(stream: TextIO | None, desc: str, unit: str) -> tqdm[Any]:
    """A running count (no total: the input is a stream), drawn at once, only on a terminal."""
    ncols, nrows = _size()
    return tqdm(
        desc=desc,
        unit=unit,
        ncols=ncols,
        nrows=nrows,
        file=stream,
        disable=None if stream is not None else True,
        mininterval=TICK,
        leave=True,
    )


def _size() -> tuple[int, int]:
    """The terminal's (columns, rows), 80x24 where it reports none (a fresh pseudo-terminal
    says 0x0, and tqdm draws nothing on a terminal with no rows)."""
    size = shutil.get_terminal_size((80, 24))
    return size.columns or 80, size.lines or 24


async def waiting(work: Awaitable[T], stream: TextIO | None, desc: str) -> T:
    """`work`'s result, with the time it has taken shown meanwhile on a terminal."""
    ncols, nrows = _size()
    bar: tqdm[Any] = tqdm(
        desc=desc,
        ncols=ncols,
        nrows=nrows,
        file=stream,
        disable=None if stream is not None else True,
        bar_format="{desc}: {elapsed}",
        leave=False,
    )
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=TICK)
            if done:
                return task.result()
            bar.refresh()
    finally:
        if not task.done():
            task.cancel()
        bar.close()
