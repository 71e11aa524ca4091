"""A TCP proxy that adds a fixed delay each way, for measuring at production-like round trips.

On the loopback emulator a Datastore round trip costs almost nothing, which
hides what users pay against real Datastore.  This proxy sits between the app
and the emulator and holds every chunk for ``one_way_ms`` in each direction,
**without serialising concurrent calls**: each chunk is scheduled for its
arrival time plus the delay (``loop.call_at``), so calls that overlap on the
wire (NDB's parallel RPCs, gRPC streams multiplexed on one connection) still
overlap, each paying the delay once per direction.  Sleeping per call in a
gRPC interceptor would serialise them and overstate the cost.
"""

from __future__ import annotations

import asyncio
import socket
import threading

CHUNK = 64 * 1024


class DelayingProxy:
    """``127.0.0.1:<port>`` forwarding to ``target`` with ``one_way_ms`` added each way; a context manager."""

    def __init__(self, target_host: str, target_port: int, one_way_ms: float) -> None:
        if one_way_ms < 0:
            raise ValueError("the delay cannot be negative")
        self.target = (target_host, target_port)
        self.delay = one_way_ms / 1000
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._server: asyncio.base_events.Server | None = None
        self._connections: set[asyncio.Task] = set()  # strong references (see _connect)

    @property
    def host(self) -> str:
        """``host:port``, as DATASTORE_EMULATOR_HOST takes it."""
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> DelayingProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc_info: object) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    async def _shutdown(self) -> None:
        """Close the listener and end every connection's tasks, so nothing is left pending."""
        assert self._server is not None, "entering the proxy started it"
        self._server.close()
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.sleep(0)  # the closed transports let their sockets go before the loop closes

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        server = self._server = self.loop.run_until_complete(asyncio.start_server(self._connect, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            self.loop.run_forever()
        finally:
            server.close()
            self.loop.close()

    async def _connect(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        # The event loop holds tasks only weakly, and asyncio's stream protocol drops
        # its reference to this one when the client's side is lost: without one of
        # our own, a connection still relaying can be garbage collected mid-way
        # (GeneratorExit in its pumps, "Task was destroyed but it is pending").
        task = asyncio.current_task()
        assert task is not None, "asyncio runs each connection's callback in a task of its own"
        self._connections.add(task)
        try:
            await self._relay(client_reader, client_writer)
        except asyncio.CancelledError:
            # The proxy is stopping.  Ending normally, not cancelled: Python 3.11's
            # start_server callback calls task.exception() on the task, which raises
            # (and logs a traceback) when the task was cancelled.
            _close(client_writer)
        finally:
            self._connections.discard(task)

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        try:
            for writer in (client_writer, upstream_writer):
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await asyncio.gather(
                self._pump(client_reader, upstream_writer),
                self._pump(upstream_reader, client_writer),
                return_exceptions=True,
            )
            await asyncio.sleep(self.delay)  # the last scheduled chunks go out first
        finally:  # cancelled too, as the proxy stops: neither side is left open
            for writer in (client_writer, upstream_writer):
                _close(writer)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Forward each chunk at its arrival time plus the delay; order is kept (FIFO at equal times)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                chunk = await reader.read(CHUNK)
                due = loop.time() + self.delay
                if not chunk:
                    loop.call_at(due, _end, writer)  # a half-close, passed on after the same delay
                    return
                loop.call_at(due, _write, writer, chunk)
        except (ConnectionError, OSError):
            loop.call_at(loop.time() + self.delay, _close, writer)


def _write(writer: asyncio.StreamWriter, chunk: bytes) -> None:
    if not writer.is_closing():
        writer.write(chunk)


def _end(writer: asyncio.StreamWriter) -> None:
    if writer.is_closing():
        return
    if writer.can_write_eof():
        writer.write_eof()
    else:
        writer.close()


def _close(writer: asyncio.StreamWriter) -> None:
    if not writer.is_closing():
        writer.close()
