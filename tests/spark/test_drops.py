"""nsqd connections that break mid-stream: the sink resends, the source reconnects; nothing lost."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from pynsqd_spark.consumer import ConsumerPool
from pynsqd_spark.options import SinkOptions, SourceOptions
from pynsqd_spark.sink import Publisher

from ..waiting import wait_for
from .conftest import NsqdProcess
from .helpers import consume_all


class DroppingProxy:
    """Forwards TCP to nsqd; the first connection is cut after ``cut_after`` bytes."""

    def __init__(self, target: str, cut_after: int, direction: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.cut_after = cut_after
        self.direction = direction  # "up" (client to nsqd) or "down"
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self._stop = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            server = socket.create_connection(self.target)
            limit = self.cut_after if self.connections == 1 else None
            pair = (client, server)
            for src, dst, d in ((client, server, "up"), (server, client, "down")):
                threading.Thread(
                    target=self._pump,
                    args=(src, dst, limit if d == self.direction else None, pair),
                    daemon=True,
                ).start()

    @staticmethod
    def _pump(
        src: socket.socket, dst: socket.socket, limit: int | None, pair: tuple[socket.socket, ...]
    ) -> None:
        sent = 0
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if limit is not None and sent + len(data) >= limit:
                    dst.sendall(data[: limit - sent])
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for s in pair:  # cut both directions
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self._stop = True
        self.listener.close()


@pytest.fixture
def proxies() -> Iterator[list[DroppingProxy]]:
    made: list[DroppingProxy] = []
    yield made
    for p in made:
        p.close()


def test_sink_resends_after_the_connection_breaks(
    nsqd_proc: NsqdProcess, proxies: list[DroppingProxy]
) -> None:
    proxy = DroppingProxy(nsqd_proc.tcp_address, cut_after=150_000, direction="up")
    proxies.append(proxy)
    opts = SinkOptions.parse(
        {"topic": "d", "nsqdTcpAddresses": proxy.address, "retryBackoffMs": "1"}, False
    )
    bodies = [b"%05d" % i + b"x" * 95 for i in range(5000)]
    pub = Publisher(opts)
    for i in range(0, 5000, 500):
        pub.publish("d", [bodies[i : i + 500]])
    pub.flush()
    pub.close()
    assert pub.retries >= 1 and proxy.connections == 2
    n = nsqd_proc.topic_stats("d")["message_count"]  # type: ignore[index]
    got = consume_all(nsqd_proc, "d", n)
    assert set(got) == set(bodies)  # at least once; a cut chunk may have arrived twice


def test_source_reconnects_after_the_connection_breaks(
    nsqd_proc: NsqdProcess, proxies: list[DroppingProxy]
) -> None:
    nsqd_proc.publish("d", [b"%05d" % i for i in range(2000)])
    proxy = DroppingProxy(nsqd_proc.tcp_address, cut_after=30_000, direction="down")
    proxies.append(proxy)
    opts = SourceOptions.parse(
        {
            "topic": "d",
            "channel": "c",
            "nsqdTcpAddresses": proxy.address,
            "maxInFlight": "500",
            "connectionsPerNode": "1",
        }
    )
    pool = ConsumerPool(opts)
    pool.start()
    seen: set[bytes] = set()
    seq = 0
    try:

        def step() -> bool:
            nonlocal seq
            seq += 1
            pool.take(seq, 300, 10**9)
            for p in pool.parts(seq) or []:
                seen.update(p.bodies)
            pool.commit(seq)
            return len(seen) == 2000

        wait_for(step, "every message despite the cut connection", 30)
    finally:
        pool.close()
    assert proxy.connections >= 2 and pool.stats.reconnects >= 1
    nsqd_proc.wait_drained("d", "c")
