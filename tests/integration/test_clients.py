"""Unmodified NSQ client libraries as independent oracles: pynsq (tornado) and gnsq (gevent).

A Writer publishes N messages with PUB, MPUB and DPUB; a Reader receives all N: none lost,
none duplicated. Each library's event loop runs in the test thread under a hard timeout, while
nsqd runs on its own loop in the background thread of the ``nsqd`` fixture.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import ServerThread
from tests.real_clients import gnsq_running, gnsq_wait, run_tornado
from tests.waiting import wait_for_async

N = 300  # messages per publishing method


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


# -- pynsq (tornado) ---------------------------------------------------------------------


def test_pynsq_writer_and_reader(nsqd: ServerThread) -> None:
    import nsq

    addr = f"127.0.0.1:{nsqd.tcp_port}"
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
            for i in range(0, N, 50):
                writer.mpub("clients", mpub_bodies[i : i + 50], callback=on_pub)
            for body in dpub_bodies:
                writer.dpub("clients", 300, body, callback=on_pub)
            n_cmds = N + N // 50 + N
            await wait_for_async(lambda: len(responses) + len(errors) == n_cmds, "every OK")
            assert not errors
            assert all(r == b"OK" for r in responses)
            await wait_for_async(lambda: len(received) >= len(expected), "every message")
            await asyncio.sleep(0.5)  # a duplicate would show up here
            assert_exactly_once(received, expected)
        finally:
            reader.close()
            for conn in list(writer.conns.values()):
                conn.close()

    run_tornado(main)
    ch = nsqd.call(lambda: nsqd.nsqd.topics["clients"].channels["pynsq"])
    assert nsqd.call(lambda: (ch.depth, len(ch.in_flight), len(ch.deferred))) == (0, 0, 0)


def test_pynsq_requeue_competing_readers_and_fan_out(nsqd: ServerThread) -> None:
    import nsq

    addr = f"127.0.0.1:{nsqd.tcp_port}"
    expected = [b"m-%d" % i for i in range(200)]
    topics = nsqd.nsqd.topics

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
            await wait_for_async(
                lambda: nsqd.call(lambda: len(getattr(topics.get("fan"), "channels", ()))) == 2,
                "both channels",
            )
            oks: list[Any] = []
            writer.mpub("fan", expected[:100], callback=lambda c, d: oks.append(d))
            for body in expected[100:]:
                writer.pub("fan", body, callback=lambda c, d: oks.append(d))
            await wait_for_async(lambda: len(oks) == 101, "every OK")
            assert all(d == b"OK" for d in oks)
            await wait_for_async(lambda: len(finished) >= len(expected), "every message finished")
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


def test_gnsq_producer_and_consumer(nsqd: ServerThread) -> None:
    gevent = pytest.importorskip("gevent")
    import gnsq

    addr = f"127.0.0.1:{nsqd.tcp_port}"
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
        for i in range(N, 2 * N, 50):
            assert producer.multipublish("clients", expected[i : i + 50]) == b"OK"
        for body in expected[2 * N :]:
            assert producer.publish("clients", body, defer=300) == b"OK"
        gnsq_wait(gevent, lambda: len(received), len(expected), "received")
        gevent.sleep(0.5)  # a duplicate would show up here

    with gnsq_running(gevent, producer, consumer):
        main()
    assert_exactly_once(received, expected)
    ch = nsqd.call(lambda: nsqd.nsqd.topics["clients"].channels["gnsq"])
    assert nsqd.call(lambda: (ch.depth, len(ch.in_flight), len(ch.deferred))) == (0, 0, 0)


def test_gnsq_requeue_then_finish(nsqd: ServerThread) -> None:
    gevent = pytest.importorskip("gevent")
    import gnsq
    from gnsq.errors import NSQRequeueMessage

    addr = f"127.0.0.1:{nsqd.tcp_port}"
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
        assert producer.multipublish("requeue", expected) == b"OK"
        gnsq_wait(gevent, lambda: len(seen), 2 * len(expected), "deliveries")
        gevent.sleep(0.3)
    assert sorted(seen) == sorted([(b, 1) for b in expected] + [(b, 2) for b in expected])
    ch = nsqd.call(lambda: nsqd.nsqd.topics["requeue"].channels["c"])
    assert nsqd.call(lambda: (ch.depth, len(ch.in_flight), ch.requeue_count)) == (0, 0, 100)


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
