"""Listening addresses as nsqd takes them: ``host:port``, ``[v6]:port``, or a unix socket path."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import ssl
from collections.abc import Callable

log = logging.getLogger("pynsqd")


def is_unix_address(address: str) -> bool:
    """nsqd 1.3.0: an address that is not ``host:port`` is a unix socket path."""
    _host, sep, port = address.rpartition(":")
    return not sep or not port.isdigit()


def split_host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


def format_address(sock: socket.socket) -> str:
    """The bound address as nsqd logs it: ``127.0.0.1:4150``, ``[::1]:4150`` or a path."""
    if sock.family == socket.AF_UNIX:
        name = sock.getsockname()
        return name if isinstance(name, str) else name.decode()
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def listen(
    loop: asyncio.AbstractEventLoop,
    factory: Callable[[], asyncio.BaseProtocol],
    address: str,
    **kwargs: object,
) -> asyncio.Server:
    """Start a server on ``address``; a stale unix socket file is replaced.

    The listen backlog is the system's maximum, as Go's ``net.Listen`` (asyncio's default of 100
    resets a burst of clients connecting at once).
    """
    backlog = listen_backlog()
    try:
        if is_unix_address(address):
            if os.path.exists(address):
                os.unlink(address)
            return await loop.create_unix_server(
                factory,
                address,
                backlog=backlog,
                **kwargs,  # type: ignore[arg-type]
            )
        host, port = split_host_port(address)
        return await loop.create_server(  # type: ignore[call-overload, no-any-return]
            factory, host or None, port, reuse_address=True, backlog=backlog, **kwargs
        )
    except OSError as err:
        raise listen_failed(address, err) from None


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``listen`` could bind ``host:port`` now: bound as it binds, with SO_REUSEADDR,
    so a port left in TIME_WAIT counts as free (scripts/cluster's check before it starts
    anything; the tests' choice of ports)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def listen_failed(address: str, err: OSError) -> OSError:
    """nsqd's words ("listen (0.0.0.0:4150) failed - address already in use"), not a Python
    tuple repr."""
    reason = os.strerror(err.errno).lower() if err.errno else str(err)
    return OSError(f"listen ({address}) failed - {reason}")


def listen_backlog() -> int:
    """``net.core.somaxconn`` where the system says, else ``socket.SOMAXCONN``."""
    try:
        with open("/proc/sys/net/core/somaxconn", "rb") as f:
            value = int(f.read().strip())
    except (OSError, ValueError):
        return socket.SOMAXCONN
    return max(value, socket.SOMAXCONN)


#: A worker that holds more than its share of connections looks again after this long.
ADMIT_AGAIN = 0.002


class SharedListener:
    """Accepts on a socket other workers accept on too: one connection per wake-up, so a
    burst of connections is spread instead of taken by the first worker to wake; with
    ``admit``, a worker that already holds more than its share lets the others take the next
    one (nginx's ``accept_disabled``). The ``asyncio.Server`` methods nsqd uses."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Callable[[], asyncio.BaseProtocol],
        ssl_context: ssl.SSLContext | None = None,
        admit: Callable[[], bool] | None = None,
    ) -> None:
        self.loop = loop
        self.sockets = [sock]
        self._sock = sock
        self._factory = factory
        self._ssl = ssl_context
        self._admit = admit
        self._later: asyncio.TimerHandle | None = None
        self._serving = False
        sock.setblocking(False)

    async def start_serving(self) -> None:
        if not self._serving:
            self._serving = True
            self.loop.add_reader(self._sock.fileno(), self._accept)

    def is_serving(self) -> bool:
        return self._serving

    def _accept(self) -> None:
        if self._admit is not None and not self._admit():
            self.loop.remove_reader(self._sock.fileno())
            if self._later is None:
                self._later = self.loop.call_later(ADMIT_AGAIN, self._resume)
            return
        try:
            conn, _addr = self._sock.accept()
        except (BlockingIOError, InterruptedError):
            return  # another worker took it
        except OSError as err:  # EMFILE and friends: pause, as Go's accept loop does
            log.error("WORKERS: accept failed - %s; retrying in 1s", err)
            self.loop.remove_reader(self._sock.fileno())
            if self._later is None:
                self._later = self.loop.call_later(1.0, self._resume)
            return
        conn.setblocking(False)
        if conn.family in (socket.AF_INET, socket.AF_INET6):
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.loop.create_task(self._connect(conn))

    def _resume(self) -> None:
        self._later = None
        if self._serving:
            self.loop.add_reader(self._sock.fileno(), self._accept)

    async def _connect(self, conn: socket.socket) -> None:
        try:
            await self.loop.connect_accepted_socket(self._factory, conn, ssl=self._ssl)
        except (TimeoutError, OSError, ssl.SSLError) as err:
            log.debug("WORKERS: connection dropped while opening - %s", err)
            conn.close()

    def close(self) -> None:
        """Stop accepting and let this process's copy of the socket go (the supervisor's keeps
        the port open while a worker restarts; with the supervisor gone, the port is free once
        every worker has closed its own)."""
        if self._later is not None:
            self._later.cancel()
            self._later = None
        if self._serving:
            self._serving = False
            self.loop.remove_reader(self._sock.fileno())
        self._sock.close()

    async def wait_closed(self) -> None:
        return None
