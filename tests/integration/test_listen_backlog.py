"""A burst of clients connecting at once is queued by the kernel, not dropped."""

from __future__ import annotations

import socket
import threading

import pytest

from ..conftest import ServerThread


@pytest.mark.parametrize("listener", ["tcp", "http"])
def test_a_burst_of_connections_waits_for_a_busy_server(nsqd: ServerThread, listener: str) -> None:
    address = nsqd.tcp_address if listener == "tcp" else ("127.0.0.1", nsqd.http_port)
    gate = threading.Event()
    nsqd.loop.call_soon_threadsafe(gate.wait, 20)  # the server accepts nothing meanwhile
    socks: list[socket.socket] = []
    try:
        # With asyncio's default backlog of 100 the 102nd SYN is dropped, and its connect waits
        # for a retransmission (a second) past this timeout; with the system's it is queued.
        for _ in range(300):
            socks.append(socket.create_connection(address, timeout=0.5))
    finally:
        gate.set()
    for s in socks:
        s.close()
