"""A loopback TCP proxy that can go silent: existing connections stop carrying bytes (but stay open) while
new connections pass. That is how a watch dies quietly behind a load balancer or NAT, the failure kopf's
watches are known to hang on without a client-side timeout."""

from __future__ import annotations

import asyncio
import threading


class SilenceableProxy:
    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = 0
        self._silent: set[int] = set()  # ids of connections currently frozen
        self._conns: set[int] = set()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> "SilenceableProxy":
        self._thread.start()
        self._ready.wait(10)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = id(writer)
        self._conns.add(conn)
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    while conn in self._silent:  # hold the bytes: the peer sees an open, silent socket
                        await asyncio.sleep(0.2)
                    dst.write(data)
                    await dst.drain()
                while conn in self._silent:  # not even the end of the stream gets through
                    await asyncio.sleep(0.2)
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                dst.close()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._conns.discard(conn)

    def silence_existing(self) -> int:
        """Freeze every connection open now; returns how many."""
        frozen = set(self._conns)
        self._silent |= frozen
        return len(frozen)

    def release(self) -> None:
        self._silent.clear()

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
