"""Unmodified NSQ client libraries as independent oracles: pynsq (tornado) and gnsq (gevent).

A Writer publishes N messages with PUB, MPUB and DPUB; a Reader receives all N: none lost,
none duplicated. Each library's event loop runs in the test thread under a hard timeout. The
same tests run against five kinds of node (the ``node`` fixture): a plain nsqd (in this
process, on its own loop in a background thread), a node of a replicated cluster (three
processes and a real etcd, every topic retained with three copies: publishes are answered once
committed), such a node whose peer is killed with kill -9 in the middle of the test,
``nsqd --workers 4`` (one node over four processes: the clients' connections land on any), and
the same with every topic retained (its log kept by one worker, publishes passed to it). What
the tests check of the server they read from its ``/stats``, as any client could.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ServerThread, make_options
from tests.integration.replication_harness import Cluster, Etcd
from tests.processes import NsqdProcess
from tests.real_clients import gnsq_running, gnsq_wait, run_tornado
from tests.waiting import wait_for, wait_for_async, wait_progress_async

N = 300  # messages per publishing method

#: The real clients run under their own guard (``real_clients.HARD_TIMEOUT``, 120 s); a
#: replicated node's three processes start first.
pytestmark = pytest.mark.timeout(300)


def expected_bodies(prefix: str) -> list[bytes]:
    return [
        f"{prefix}-{method}-{i}".encode() for method in ("pub", "mpub", "dpub") for i in range(N)
    ]


def assert_exactly_once(received: list[bytes], expected: list[bytes]) -> None:
    counts = Counter(received)
    dups = {b: n for b, n in counts.items() if n > 1}
    assert not dups, f"duplicated: {list(dups)[:5]}"
    missing = set(expected) - set(counts)
    assert not missing, f"{len(missing)} lost, e.g. {sorted(missing)[:5]}"
    assert set(counts) == set(expected)


class Node:
    """The node the clients use, and what its ``/stats`` says."""

    def __init__(
        self, tcp_port: int, http_port: int, midway: Callable[[], None], replicated: bool
    ) -> None:
        self.tcp_port, self.http_port = tcp_port, http_port
        self._midway = midway
        self.replicated = replicated
        #: The node's members of the cluster (``--workers``: one each).
        self.members = 1

    def midway(self) -> None:
        """Called by a test while its traffic flows: a peer dies here, in that variant."""
        self._midway()

    def topic(self, topic: str) -> dict[str, Any] | None:
        url = f"http://127.0.0.1:{self.http_port}/stats?format=json&topic={topic}"
        with urllib.request.urlopen(url, timeout=10) as r:
            doc = json.loads(r.read())
        # nsqd answers ``"topics": null`` for a topic it does not have (yet).
        return next((t for t in doc["topics"] or [] if t["topic_name"] == topic), None)

    def channel(self, topic: str, channel: str) -> dict[str, Any]:
        t = self.topic(topic)
        assert t is not None, f"no topic {topic}"
        return next(c for c in t["channels"] if c["channel_name"] == channel)

    def settled(self, topic: str, channel: str) -> tuple[int, int, int]:
        """(depth, in flight, deferred) of a channel, once the FINs sent have arrived."""
        c: dict[str, Any] = {}

        def empty() -> bool:
            c.update(self.channel(topic, channel))
            return c["in_flight_count"] == 0

        wait_for(empty, f"{topic}/{channel}'s in-flight messages to be finished", 10)
        if self.replicated:  # the topic really was replicated: its partition has three copies
            url = f"http://127.0.0.1:{self.http_port}/topic/replication?topic={topic}"
            with urllib.request.urlopen(url, timeout=10) as r:
                doc = json.loads(r.read())
            # (one partition a member: a node of two workers leads one or two)
            own = [q for q in doc["partitions"] if q["role"] == "leader"]
            assert doc["replicas"] == 3 and 1 <= len(own) <= self.members, doc
        return c["depth"], c["in_flight_count"], c["deferred_count"]


@pytest.fixture(
    params=[
        "plain",
        "replicated",
        "replicated, a peer killed",
        "replicated, 2 workers",
        "4 workers",
        "4 workers, retained",
    ]
)
def node(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Node]:
    if request.param.startswith("4 workers"):  # nsqd --workers 4: one node over four processes
        (tmp_path / "data").mkdir()
        # ", retained": every topic keeps a log, a partition per worker: each worker appends
        # the clients' publishes it takes to its own.
        retained = ["--retention-time=1h"] if request.param.endswith("retained") else []
        proc = NsqdProcess(tmp_path / "data", tmp_path / "nsqd.log", "--workers=4", *retained)
        try:
            wait_for(lambda: "WORKERS: ready:" in proc.output(), "every worker to serve")
            yield Node(proc.port, proc.http_port, lambda: None, replicated=False)
        finally:
            proc.stop()
        return
    if request.param == "plain":
        server = ServerThread(make_options(tmp_path))
        try:
            yield Node(server.tcp_port, server.http_port, lambda: None, replicated=False)
        finally:
            server.stop()
        return
    etcd = Etcd(tmp_path)
    # A lease that outlives a starved machine's gaps (the suite beside a busy loop on each
    # core held a node's refresh past the fault tests' 2 s, and it stepped down mid-test):
    # these tests are about the clients, the lease's expiry is the fault tests'. So is the
    # commit's timeout (5 s): a first publish waits for followers to find the new partition,
    # which a loaded suite once stretched past it ("replication timeout (committed below 0")).
    # ", 2 workers": each node's workers are members of the cluster of their own.
    workers = ["--workers=2"] if request.param.endswith("2 workers") else []
    cluster = Cluster(
        tmp_path,
        etcd,
        3,
        "--replicas=3",
        "--etcd-lease-ttl=10s",
        "--replication-timeout=60s",
        *workers,
    )
    try:
        n1 = cluster.node(1)
        assert n1.proc is not None
        killed = request.param.endswith("killed")
        midway = cluster.node(3).kill if killed else (lambda: None)
        node = Node(n1.proc.port, n1.proc.http_port, midway, replicated=True)
        node.members = len(n1.member_ids)
        yield node
    finally:
        cluster.stop()
        etcd.stop()


# -- pynsq (tornado) ---------------------------------------------------------------------


def test_pynsq_writer_and_reader(node: Node) -> None:
    import nsq

    addr = f"127.0.0.1:{node.tcp_port}"
    expected = expected_bodies("pynsq")

    async def main() -> None:
        received: list[bytes] = []
        errors: list[Any] = []
        responses: list[Any] = []

        def on_message(msg: nsq.Message) -> bool:
            assert msg.attempts == 1
            received.append(msg.body)
            return True  # FIN

        def on_pub(conn: Any, data: Any) -> None:
            (errors if isinstance(data, Exception) else responses).append(data)

        writer = nsq.Writer([addr], reconnect_interval=60)
        reader = nsq.Reader(
            topic="clients",
            channel="pynsq",
            message_handler=on_message,
            nsqd_tcp_addresses=[addr],
            max_in_flight=100,
        )
        try:
            await wait_for_async(lambda: bool(writer.conns), "the writer to connect")
            pub_bodies = expected[:N]
            mpub_bodies = expected[N : 2 * N]
            dpub_bodies = expected[2 * N :]
            for body in pub_bodies:
                writer.pub("clients", body, callback=on_pub)
            node.midway()
            for i in range(0, N, 50):
                writer.mpub("clients", mpub_bodies[i : i + 50], callback=on_pub)
            for body in dpub_bodies:
                writer.dpub("clients", 300, body, callback=on_pub)
            n_cmds = N + N // 50 + N
            # Each publish to a replicated node waits for its commit before the next is read:
            # on a loaded machine the whole takes longer, which is no hang (2 full runs here
            # timed out at 126 and 221 of 903 answers, each still coming).
            await wait_progress_async(lambda: len(responses) + len(errors), n_cmds, "every OK")
            assert not errors
            assert all(r == b"OK" for r in responses)
            await wait_progress_async(lambda: len(received), len(expected), "every message")
            await asyncio.sleep(0.5)  # a duplicate would show up here
            assert_exactly_once(received, expected)
        finally:
            reader.close()
            for conn in list(writer.conns.values()):
                conn.close()

    run_tornado(main)
    assert node.settled("clients", "pynsq") == (0, 0, 0)


def test_pynsq_requeue_competing_readers_and_fan_out(node: Node) -> None:
    import nsq

    addr = f"127.0.0.1:{node.tcp_port}"
    expected = [b"m-%d" % i for i in range(200)]

    def channels() -> int:
        t = node.topic("fan")
        return len(t["channels"]) if t is not None else 0

    async def main() -> None:
        attempts: dict[str, list[tuple[bytes, int]]] = {"a": [], "b": [], "other": []}
        finished: list[bytes] = []

        def handler(name: str) -> Callable[[nsq.Message], bool | None]:
            def on_message(msg: nsq.Message) -> bool | None:
                attempts[name].append((msg.body, msg.attempts))
                if name == "other":
                    return True
                msg.enable_async()
                msg.touch()
                if msg.attempts == 1:
                    msg.requeue(backoff=False, delay=0)  # REQ <id> 0
                else:
                    finished.append(msg.body)
                    msg.finish()
                return None

            return on_message

        readers = [
            nsq.Reader(
                topic="fan",
                channel=channel,
                message_handler=handler(name),
                nsqd_tcp_addresses=[addr],
                max_in_flight=50,
            )
            for name, channel in (("a", "work"), ("b", "work"), ("other", "audit"))
        ]
        writer = nsq.Writer([addr], reconnect_interval=60)
        try:
            await wait_for_async(lambda: bool(writer.conns), "the writer to connect")
            await wait_for_async(lambda: channels() == 2, "both channels")
            oks: list[Any] = []
            writer.mpub("fan", expected[:100], callback=lambda c, d: oks.append(d))
            node.midway()
            for body in expected[100:]:
                writer.pub("fan", body, callback=lambda c, d: oks.append(d))
            await wait_progress_async(lambda: len(oks), 101, "every OK")
            assert all(d == b"OK" for d in oks)
            await wait_progress_async(
                lambda: len(finished), len(expected), "every message finished"
            )
            await wait_for_async(
                lambda: len(attempts["other"]) >= len(expected), "the audit channel"
            )
            await asyncio.sleep(0.5)
            assert_exactly_once(finished, expected)
            assert_exactly_once([b for b, _ in attempts["other"]], expected)
            work = attempts["a"] + attempts["b"]
            assert sorted(work) == sorted([(b, 1) for b in expected] + [(b, 2) for b in expected])
        finally:
            for r in readers:
                r.close()
            for conn in list(writer.conns.values()):
                conn.close()

    run_tornado(main)


# -- gnsq (gevent) -----------------------------------------------------------------------


def test_gnsq_producer_and_consumer(node: Node) -> None:
    gevent = pytest.importorskip("gevent")
    import gnsq

    addr = f"127.0.0.1:{node.tcp_port}"
    expected = expected_bodies("gnsq")
    received: list[bytes] = []

    consumer = gnsq.Consumer(
        "clients", "gnsq", nsqd_tcp_addresses=[addr], max_in_flight=100, max_backoff_duration=0
    )

    @consumer.on_message.connect
    def handler(consumer: Any, message: Any) -> None:
        assert message.attempts == 1
        received.append(message.body)  # finished when the handler returns

    producer = gnsq.Producer([addr])

    def main() -> None:
        producer.start()
        consumer.start(block=False)
        for body in expected[:N]:
            assert producer.publish("clients", body) == b"OK"
        node.midway()
        for i in range(N, 2 * N, 50):
            assert producer.multipublish("clients", expected[i : i + 50]) == b"OK"
        for body in expected[2 * N :]:
            assert producer.publish("clients", body, defer=300) == b"OK"
        gnsq_wait(gevent, lambda: len(received), len(expected), "received")
        gevent.sleep(0.5)  # a duplicate would show up here

    with gnsq_running(gevent, producer, consumer):
        main()
    assert_exactly_once(received, expected)
    assert node.settled("clients", "gnsq") == (0, 0, 0)


def test_gnsq_requeue_then_finish(node: Node) -> None:
    gevent = pytest.importorskip("gevent")
    import gnsq
    from gnsq.errors import NSQRequeueMessage

    addr = f"127.0.0.1:{node.tcp_port}"
    expected = [b"r-%d" % i for i in range(100)]
    seen: list[tuple[bytes, int]] = []
    consumer = gnsq.Consumer(
        "requeue",
        "c",
        nsqd_tcp_addresses=[addr],
        max_in_flight=20,
        max_backoff_duration=0,
        backoff_on_requeue=False,
    )

    @consumer.on_message.connect
    def handler(consumer: Any, message: Any) -> None:
        seen.append((message.body, message.attempts))
        if message.attempts == 1:
            raise NSQRequeueMessage()  # REQ <id> 0

    producer = gnsq.Producer([addr])
    with gnsq_running(gevent, producer, consumer):
        producer.start()
        consumer.start(block=False)
        assert producer.multipublish("requeue", expected[:50]) == b"OK"
        node.midway()
        assert producer.multipublish("requeue", expected[50:]) == b"OK"
        gnsq_wait(gevent, lambda: len(seen), 2 * len(expected), "deliveries")
        gevent.sleep(0.3)
    assert sorted(seen) == sorted([(b, 1) for b in expected] + [(b, 2) for b in expected])
    assert node.settled("requeue", "c")[:2] == (0, 0)
    assert node.channel("requeue", "c")["requeue_count"] == 100


def test_gnsq_large_messages_through_the_disk_queue(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    # Bodies from 2 kB are written to the disk queue from their pieces (pwritev): gnsq publishes
    # 40 of 20 kB with MPUB before any channel exists (--mem-queue-size=0: all on disk), then
    # a gnsq consumer gets each once, byte for byte.
    gevent = pytest.importorskip("gevent")
    import gnsq

    nsqd = make_nsqd(mem_queue_size=0)
    addr = f"127.0.0.1:{nsqd.tcp_port}"
    expected = [(b"%03d" % i) * 6800 for i in range(40)]
    received: list[bytes] = []
    producer = gnsq.Producer([addr])
    consumer = gnsq.Consumer(
        "large", "c", nsqd_tcp_addresses=[addr], max_in_flight=10, max_backoff_duration=0
    )

    @consumer.on_message.connect
    def handler(consumer: Any, message: Any) -> None:
        received.append(message.body)

    def main() -> None:
        producer.start()
        for i in range(0, 40, 10):
            assert producer.multipublish("large", expected[i : i + 10]) == b"OK"
        topic = nsqd.call(lambda: nsqd.nsqd.topics["large"])
        assert nsqd.call(lambda: (len(topic.queue), topic.queue.backend.depth())) == (40, 40)
        consumer.start(block=False)
        gnsq_wait(gevent, lambda: len(received), len(expected), "received")

    with gnsq_running(gevent, producer, consumer):
        main()
    assert_exactly_once(received, expected)
    assert sorted(received) == expected
