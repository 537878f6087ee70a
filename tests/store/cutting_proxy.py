"""A TCP proxy in front of Redis that cuts the connection in the middle of a write.

Redis runs no command it did not receive whole (and discards a MULTI whose EXEC never arrives);
this lets a test prove that a write cut short half-way leaves nothing acknowledged behind, over
real sockets. The default marker is a compaction's data script: the index writes before it go
through, the data never arrives, as when an instance is killed between the two steps.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

SAVE_SCRIPT_MARKER = b"redis.call('HSETNX', KEYS[3]"


class CuttingProxy:
    """Forwards bytes both ways; once it sees `marker` (after letting `spare` of them through)
    it forwards half of the rest of that chunk and hangs up, or, with `on_cut` (e.g. a SIGKILL
    of the server), calls that and forwards nothing more."""

    def __init__(
        self,
        upstream_port: int,
        marker: bytes = SAVE_SCRIPT_MARKER,
        *,
        spare: int = 0,
        on_cut: Callable[[], None] | None = None,
    ) -> None:
        self.upstream_port = upstream_port
        self.marker = marker
        self.spare = spare
        self.on_cut = on_cut
        self.cuts = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen on a free port and return it."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:  # the server is down (killed): the client sees its connection close
            writer.close()
            return
        back = asyncio.create_task(self._pipe(up_reader, writer))
        try:
            while chunk := await reader.read(1 << 16):
                at = chunk.find(self.marker)
                if at >= 0 and self.spare > 0:
                    self.spare -= 1
                elif at >= 0:
                    self.cuts += 1
                    if self.on_cut is not None:
                        self.on_cut()
                        break
                    up_writer.write(chunk[: at + (len(chunk) - at) // 2])
                    await up_writer.drain()
                    break
                up_writer.write(chunk)
                await up_writer.drain()
        finally:
            for w in (up_writer, writer):
                w.close()
            back.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await back

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(1 << 16):
                writer.write(chunk)
                await writer.drain()

    async def close(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
