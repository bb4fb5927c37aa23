"""Looking into a channel without consuming it (``GET /channel/peek``, ``GET /topic/peek``;
issue 55 item 3): its queued, requeued, deferred and in-flight messages over real sockets, from
memory and from disk, with ``--workers`` the node's, and a peek raced against traffic
changing nothing."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ..conftest import ServerThread, http_request
from ..processes import NsqdProcess
from ..waiting import wait_for
from ..wire import Conn


def peek(server: Any, query: str) -> tuple[int, Any]:
    if isinstance(server, ServerThread):
        status, body = http_request(server, "GET", query)
    else:
        status, body = server.http("GET", query)
    return status, json.loads(body)


@pytest.mark.parametrize("mem_queue_size", [10000, 0])
def test_a_channel_seen_from_inside_changes_nothing(
    make_nsqd: Callable[..., ServerThread], mem_queue_size: int
) -> None:
    server = make_nsqd(mem_queue_size=mem_queue_size)
    long = b"x" * 300
    bodies = [b"m0", b"m1", b"m2", b"m3", b"\x00\xff binary", long]
    with server.connect() as consumer:
        consumer.sub("orders", "billing", rdy=0)
        with server.connect() as p:
            for body in bodies:
                p.pub("orders", body)
        consumer.rdy(3)
        m0, m1, m2 = consumer.read_messages(3)
        consumer.rdy(0)
        consumer.req(m0.id, 0)  # back in the queue: requeued (attempts 1)
        consumer.req(m1.id, 60_000)  # deferred for a minute
        before = time.time() * 1000

        def settled() -> bool:
            doc = peek(server, "/channel/peek?topic=orders&channel=billing")[1]
            return doc["deferred_count"] == 1 and len(doc["queued"]) == 4

        wait_for(settled, "the REQs to land")
        status, doc = peek(server, "/channel/peek?topic=orders&channel=billing")
        assert status == 200 and (doc["topic"], doc["channel"]) == ("orders", "billing")
        assert (doc["depth"], doc["in_flight_count"], doc["deferred_count"]) == (4, 1, 1)
        queued = {r["id"]: r for r in doc["queued"]}
        assert [r["body"] for r in doc["queued"]] == ["m0", "m3", bodies[4].hex(), "x" * 256]
        binary, cut = doc["queued"][2], doc["queued"][3]
        assert binary["encoding"] == "hex" and not binary["truncated"]
        assert cut["truncated"] and cut["size"] == 300 and cut["encoding"] == "utf-8"
        assert [r["body"] for r in doc["requeued"]] == ["m0"] and doc["requeued"][0]["attempts"]
        (deferred,) = doc["deferred"]
        assert deferred["body"] == "m1" and before + 55_000 < deferred["due"] < before + 65_000
        (flying,) = doc["in_flight"]
        assert flying["body"] == "m2" and flying["id"] == m2.id.decode()
        assert flying["client"].startswith("127.0.0.1:") and flying["deadline"] > before
        assert m0.id.decode() in queued
        # Newest first, one kind, a short body, fewer of them.
        status, doc = peek(
            server,
            "/channel/peek?topic=orders&channel=billing&order=newest&n=2&kind=queued&body_max=1",
        )
        assert [r["body"] for r in doc["queued"]] == ["x", bodies[4][:1].hex()]
        assert set(doc) == {
            "topic",
            "channel",
            "depth",
            "in_flight_count",
            "deferred_count",
            "queued",
        }
        # Looking took nothing: every queued message is still delivered, once.
        consumer.fin(m2.id)
        consumer.rdy(10)
        got = consumer.read_messages(4)
        assert sorted(m.body for m in got) == sorted([b"m0", b"m3", bodies[4], long])
        for m in got:
            consumer.fin(m.id)
        doc = peek(server, "/channel/peek?topic=orders&channel=billing")[1]
        assert (doc["queued"], doc["in_flight"], doc["depth"]) == ([], [], 0)


def test_a_topic_without_channels_and_bad_requests(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(mem_queue_size=1)  # one in memory, the rest on disk
    with server.connect() as p:
        p.mpub("dead", [b"a", b"b", b"c"])
    status, doc = peek(server, "/topic/peek?topic=dead")
    assert status == 200 and doc["depth"] == 3
    assert sorted(r["body"] for r in doc["queued"]) == ["a", "b", "c"]
    for query, answer in [
        ("/topic/peek?topic=nope", (404, {"message": "TOPIC_NOT_FOUND"})),
        ("/channel/peek?topic=dead&channel=nope", (404, {"message": "CHANNEL_NOT_FOUND"})),
        ("/channel/peek?topic=nope&channel=c", (404, {"message": "TOPIC_NOT_FOUND"})),
        ("/channel/peek?topic=dead", (400, {"message": "MISSING_ARG_CHANNEL"})),
        ("/topic/peek?topic=dead&n=0", (400, {"message": "INVALID_ARG_N"})),
        ("/topic/peek?topic=dead&n=1001", (400, {"message": "INVALID_ARG_N"})),
        ("/topic/peek?topic=dead&order=up", (400, {"message": "INVALID_ARG_ORDER"})),
        ("/topic/peek?topic=dead&kind=all", (400, {"message": "INVALID_ARG_KIND"})),
        ("/topic/peek?topic=dead&body_max=-1", (400, {"message": "INVALID_ARG_BODY_MAX"})),
        ("/topic/peek?topic=bad%00name", (400, {"message": "INVALID_TOPIC"})),
    ]:
        assert peek(server, query) == answer, query
    assert peek(server, "/topic/peek?topic=dead")[1]["depth"] == 3  # still all there


def test_peek_under_load_changes_nothing(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(mem_queue_size=100)
    total = 3000
    peeks: list[int] = []
    done = threading.Event()

    def looker() -> None:
        # Peeks back to back, a 2-ms pause between them: the server's loop shares this
        # process's interpreter, and an unpaused looker on a busy machine held it long enough
        # for the publisher's 5-s socket guard to fire.
        while not done.wait(0.002):
            status, doc = peek(server, "/channel/peek?topic=busy&channel=c&n=50")
            assert status == 200
            peeks.append(len(doc["queued"]) + len(doc["in_flight"]))

    # Sockets with a 30-s guard (a hang, not a synchronisation).
    with Conn(server.tcp_address, timeout=30) as consumer:
        consumer.sub("busy", "c", rdy=20)
        thread = threading.Thread(target=looker)
        thread.start()
        try:
            with Conn(server.tcp_address, timeout=30) as p:
                for i in range(0, total, 100):
                    p.mpub("busy", [b"%d" % n for n in range(i, i + 100)])
            seen = []
            while len(seen) < total:
                m = consumer.read_message()
                seen.append(int(m.body))
                consumer.fin(m.id)
        finally:
            done.set()
            thread.join()
    assert sorted(seen) == list(range(total)) and len(peeks) > 0


def test_the_nodes_answer_with_workers(tmp_path: Path) -> None:
    node = NsqdProcess(tmp_path / "data", tmp_path / "nsqd.log", "--workers=2")
    try:
        wait_for(lambda: node.http("GET", "/ping")[0] == 200, "the node to be ready")
        assert node.http("POST", "/topic/create?topic=spread")[0] == 200
        assert node.http("POST", "/channel/create?topic=spread&channel=c")[0] == 200
        conns = [node.connect() for _ in range(4)]
        try:
            for i, c in enumerate(conns):
                c.identify()
                c.pub("spread", b"w%d" % i)
        finally:
            for c in conns:
                c.close()
        status, doc = peek(node, "/channel/peek?topic=spread&channel=c")
        assert status == 200 and doc["depth"] == 4
        assert [r["body"] for r in doc["queued"]] == ["w0", "w1", "w2", "w3"]  # publish order
        assert len({(int(r["id"], 16) >> 12) & 0x3FF for r in doc["queued"]}) == 2  # both's
        status, doc = peek(node, "/channel/peek?topic=spread&channel=c&n=1&order=newest")
        assert [r["body"] for r in doc["queued"]] == ["w3"]
        assert peek(node, "/channel/peek?topic=spread&channel=none")[0] == 404
        # A consumer with room for two: the node's answer has each of the four once, queued
        # or in flight (a message another worker lent waits on the consumer's worker: it was
        # listed twice, in flight to the link there and to the consumer here, or not at all).
        with node.connect() as consumer:
            consumer.identify({"client_id": "first"})
            consumer.sub("spread", "c", rdy=2)
            first = consumer.read_messages(2)

            def each_once() -> bool:
                doc = peek(node, "/channel/peek?topic=spread&channel=c")[1]
                queued = [r["body"] for r in doc["queued"]]
                flying = [r["body"] for r in doc["in_flight"]]
                return (
                    sorted(queued + flying) == ["w0", "w1", "w2", "w3"]
                    and sorted(flying) == sorted(m.body.decode() for m in first)
                    and (doc["depth"], doc["in_flight_count"]) == (2, 2)
                )

            wait_for(each_once, "the node's answer to list each message once")
        # One consumer, on one worker, takes all four (the other worker's lent to it): each
        # is in flight once in the node's answer, to that consumer, and nothing is queued.
        with node.connect() as consumer:
            consumer.identify({"client_id": "peeker"})
            consumer.sub("spread", "c", rdy=10)
            got = consumer.read_messages(4)
            status, doc = peek(node, "/channel/peek?topic=spread&channel=c")
            assert status == 200, doc
            flying = sorted(r["body"] for r in doc["in_flight"])
            assert flying == sorted(m.body.decode() for m in got) == ["w0", "w1", "w2", "w3"], doc
            (client,) = {r["client"] for r in doc["in_flight"]}  # the consumer's, not a link's
            assert client.startswith("127.0.0.1:"), doc
            assert doc["queued"] == [] and (doc["depth"], doc["in_flight_count"]) == (0, 4), doc
    finally:
        node.stop()


def test_a_message_requeued_then_dead_lettered_is_seen_at_each_step(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    """Issue 55 item 3: requeued messages, and what went to the dead-letter topic, by the way a
    message gets there (its attempts used up), not only a topic named so."""
    server = make_nsqd(max_attempts=2)
    poison = b"\xff\x00poison"  # binary: shown as hex
    with server.connect() as c:
        c.sub("t", "c", rdy=1)
        with server.connect() as p:
            p.pub("t", poison)
        m = c.read_message()
        c.rdy(0)
        c.req(m.id, 0)  # back in the queue, attempted once
        wait_for(
            lambda: (
                [r["id"] for r in peek(server, "/channel/peek?topic=t&channel=c")[1]["requeued"]]
                == [m.id.decode()]
            ),
            "the requeued message to be listed",
        )
        (again,) = peek(server, "/channel/peek?topic=t&channel=c&kind=requeued")[1]["requeued"]
        assert (again["attempts"], again["encoding"], again["body"]) == (1, "hex", poison.hex())
        c.rdy(1)
        m2 = c.read_message()
        assert (m2.id, m2.attempts) == (m.id, 2)
        c.req(m2.id, 0)  # its last attempt: dead-lettered
        wait_for(
            lambda: (
                peek(server, "/topic/peek?topic=t.dead")[0] == 200
                and peek(server, "/topic/peek?topic=t.dead")[1]["depth"] == 1
            ),
            "the message in the dead-letter topic",
        )
        c.expect_nothing()
    doc = peek(server, "/topic/peek?topic=t.dead")[1]
    (dead,) = doc["queued"]
    assert (dead["id"], dead["body"], dead["encoding"]) == (m.id.decode(), poison.hex(), "hex")
    doc = peek(server, "/channel/peek?topic=t&channel=c")[1]
    assert (doc["depth"], doc["in_flight_count"], doc["queued"], doc["requeued"]) == (0, 0, [], [])
