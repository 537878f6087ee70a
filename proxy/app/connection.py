"""One timer per client connection: the deadline of the request head, then of its body.

A head or a body that never finishes held a connection for as long as the client liked (past
300 s), and 1,100 of them used up a 1,024-descriptor worker. `BoundedHttpToolsProtocol` arms
this timer when a connection opens and when a request's first byte arrives (the head's), again
when the head is complete and at each piece of body (the body's, between two reads, as nginx's
client_body_timeout), and cancels it when the request is complete: the time an app takes to
answer is never the client's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Deadline:
    """A re-armable timer that calls `expire(part)` ("head" or "body") when it runs out."""

    __slots__ = ("_expire", "_handle", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, expire: Callable[[str], None]) -> None:
        self._loop = loop
        self._expire = expire
        self._handle: asyncio.TimerHandle | None = None

    def arm(self, seconds: float, part: str) -> None:
        """Start (or restart) the clock of `part`."""
        self.cancel()
        self._handle = self._loop.call_later(seconds, self._expire, part)

    def cancel(self) -> None:
        """Stop the clock."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
