"""A TCP proxy in front of Redis that cuts the connection in the middle of a MULTI/EXEC.

Redis discards a transaction whose EXEC never arrives; this lets a test prove that a write cut
short half-way leaves nothing behind, over real sockets.
"""

from __future__ import annotations

import asyncio
import contextlib


class CuttingProxy:
    """Forwards bytes both ways; once it sees MULTI it forwards half of the rest and hangs up."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.cuts = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen on a free port and return it."""
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        back = asyncio.create_task(self._pipe(up_reader, writer))
        try:
            while chunk := await reader.read(1 << 16):
                at = chunk.find(b"MULTI")
                if at >= 0:
                    up_writer.write(chunk[: at + (len(chunk) - at) // 2])
                    await up_writer.drain()
                    self.cuts += 1
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
