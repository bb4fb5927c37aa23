"""pynsqd's message lifecycle over real sockets: max attempts and dead-lettering (with the
real gnsq client as well as our wire client), message TTL, bounded queues, persistence."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from ..conftest import ServerThread, http_request
from ..waiting import wait_for
from .servers import channel_stats

HOUR = 3600.0


def post(server: ServerThread, path: str) -> tuple[int, Any]:
    status, body = http_request(server, "POST", path)
    return status, json.loads(body) if body else None


def get(server: ServerThread, path: str) -> tuple[int, Any]:
    status, body = http_request(server, "GET", path)
    return status, json.loads(body) if body else None


# -- max attempts and dead-lettering -----------------------------------------------------------


def test_a_message_requeued_max_attempts_times_lands_in_the_dead_letter_topic(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(max_attempts=3)
    with server.connect() as watch:
        watch.sub("t.dead", "inspect", rdy=10)
        with server.connect() as c:
            c.sub("t", "c", rdy=10)
            with server.connect() as p:
                p.pub("t", b"poison")
            for attempt in (1, 2, 3):
                m = c.read_message()
                assert (m.body, m.attempts) == (b"poison", attempt)
                c.req(m.id, 0)
            c.expect_nothing()  # no fourth delivery
        dead = watch.read_message()
    assert (dead.id, dead.body, dead.attempts) == (m.id, b"poison", 1)
    stats = channel_stats(server, "t", "c")
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0
    assert stats["lifecycle"]["dead_letter_count"] == 1
    assert stats["lifecycle"]["max_attempts"] == 3


def test_timeouts_count_as_attempts_too(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(max_attempts=2)
    with server.connect() as c:
        c.identify({"msg_timeout": 1000})
        c.sub("t", "c", rdy=10)
        with server.connect() as p:
            p.pub("t", b"slow")
        assert c.read_message().attempts == 1  # never FIN'd: times out
        assert c.read_message().attempts == 2
        # It would be delivered a third time: it goes to t.dead instead.
        wait_for(
            lambda: channel_stats(server, "t", "c")["lifecycle"]["dead_letter_count"] == 1,
            "the message to be dead-lettered after its second timeout",
        )
        c.expect_nothing()


def test_gnsq_requeueing_until_the_message_is_dead_lettered(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    gevent = pytest.importorskip("gevent")
    import gnsq
    from gnsq.errors import NSQRequeueMessage

    server = make_nsqd()
    status, cfg = post(
        server, "/channel/config?topic=jobs&channel=w&max_attempts=4&dead_letter=failed"
    )
    assert status == 200 and (cfg["max_attempts"], cfg["dead_letter"]) == (4, "failed")
    addr = f"127.0.0.1:{server.tcp_port}"
    attempts: list[int] = []
    consumer = gnsq.Consumer(
        "jobs", "w", nsqd_tcp_addresses=[addr], max_backoff_duration=0, backoff_on_requeue=False
    )

    @consumer.on_message.connect
    def handler(consumer: Any, message: Any) -> None:
        attempts.append(message.attempts)
        raise NSQRequeueMessage()  # REQ, every time

    producer = gnsq.Producer([addr])
    try:
        with gevent.Timeout(20):
            producer.start()
            consumer.start(block=False)
            assert producer.publish("jobs", b"never works") == b"OK"
            while (
                not channel_stats(server, "jobs", "w").get("lifecycle", {}).get("dead_letter_count")
            ):
                gevent.sleep(0.01)
    finally:
        producer.close()
        consumer.close()
        producer.join(timeout=5)
        consumer.join(timeout=5)
    assert attempts == [1, 2, 3, 4]
    with server.connect() as c:
        c.sub("failed", "c", rdy=1)
        assert c.read_message().body == b"never works"


def test_dead_letter_none_drops_and_counts(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd()
    assert (
        post(server, "/channel/config?topic=t&channel=c&max_attempts=1&dead_letter=none")[0] == 200
    )
    with server.connect() as c:
        c.sub("t", "c", rdy=10)
        with server.connect() as p:
            p.pub("t", b"x")
        c.req(c.read_message().id, 0)
        c.expect_nothing()
    assert channel_stats(server, "t", "c")["lifecycle"]["dead_letter_count"] == 1
    assert get(server, "/topic/config?topic=none")[0] == 404  # no topic called "none"


def test_a_dead_letter_topic_that_cannot_store_keeps_the_message_on_the_channel(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(max_attempts=1)
    # The dead-letter topic is bounded and full, with policy reject.
    assert post(server, "/topic/config?topic=t.dead&max_depth=1")[0] == 200
    with server.connect() as p:
        p.pub("t.dead", b"already there")
    with server.connect() as c:
        c.sub("t", "c", rdy=10)
        with server.connect() as p:
            p.pub("t", b"x")
        c.req(c.read_message().id, 0)
        again = c.read_message()  # delivered again rather than lost
        assert (again.body, again.attempts) == (b"x", 2)
        c.fin(again.id)
    lifecycle = channel_stats(server, "t", "c")["lifecycle"]
    assert lifecycle["dead_letter_failed_count"] == 1 and lifecycle["dead_letter_count"] == 0


# -- TTL -------------------------------------------------------------------------------------


def test_messages_past_their_ttl_are_not_delivered(make_nsqd: Callable[..., ServerThread]) -> None:
    # The TTL leaves "fresh" 2 s from its publish to its delivery: on a loaded machine (the
    # whole suite on 2 cores) 200 ms was not always enough, and "fresh" expired too.
    server = make_nsqd()
    assert post(server, "/topic/config?topic=t&msg_ttl=2s")[0] == 200
    with server.connect() as c:
        c.sub("t", "c", rdy=0)
        with server.connect() as p:
            p.pub("t", b"stale")
        published = time.monotonic()
        wait_for(lambda: time.monotonic() - published > 2.05, "the message to be older than 2s")
        with server.connect() as p:
            p.pub("t", b"fresh")
        c.rdy(10)
        assert c.read_message().body == b"fresh"
        c.expect_nothing()
    lifecycle = channel_stats(server, "t", "c")["lifecycle"]
    assert lifecycle["expired_count"] == 1 and lifecycle["msg_ttl"] == "2s"


def test_a_deferred_message_due_after_its_ttl_is_dropped_at_due_time(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(msg_ttl=0.1)
    with server.connect() as c:
        c.sub("t", "c", rdy=10)
        with server.connect() as p:
            p.dpub("t", 300, b"late")
        wait_for(
            lambda: channel_stats(server, "t", "c")["lifecycle"]["expired_count"] == 1,
            "the deferred message to expire at its due time",
        )
        c.expect_nothing()


# -- bounded queues --------------------------------------------------------------------------


def test_a_full_channel_rejects_publishes_naming_itself(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(max_channel_depth=3)
    with server.connect() as c:
        c.sub("t", "c", rdy=0)
    with server.connect() as p:
        p.mpub("t", [b"1", b"2", b"3"])
        p.send(b"PUB t\n\x00\x00\x00\x014")
        assert p.read_frame().data == b"E_PUB_FAILED PUB failed t:c is full (3 of 3 messages)"
    assert get(server, "/stats?format=json")[0] == 200
    status, raw = http_request(server, "POST", "/pub?topic=t", b"x")
    assert status == 503 and json.loads(raw) == {
        "message": "QUEUE_FULL",
        "queue": "t:c",
        "depth": 3,
        "max_depth": 3,
    }
    assert channel_stats(server, "t", "c")["depth"] == 3  # nothing half-published


def test_drop_oldest_keeps_the_newest(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd()
    assert (
        post(server, "/channel/config?topic=t&channel=c&max_depth=3&bound_policy=drop-oldest")[0]
        == 200
    )
    with server.connect() as p:
        for i in range(5):
            p.pub("t", b"%d" % i)
    stats = channel_stats(server, "t", "c")
    assert stats["depth"] == 3 and stats["lifecycle"]["dropped_count"] == 2
    with server.connect() as c:
        c.sub("t", "c", rdy=10)
        assert sorted(m.body for m in c.read_messages(3)) == [b"2", b"3", b"4"]


def test_a_topic_without_channels_is_bounded_too(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(max_channel_depth=2)
    with server.connect() as p:
        p.mpub("t", [b"a", b"b"])
        p.send(b"PUB t\n\x00\x00\x00\x01c")
        assert p.read_frame().data.startswith(b"E_PUB_FAILED PUB failed t is full")


# -- settings: validation, read back, persistence ---------------------------------------------


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("max_attempts=-1", "INVALID_ARG_MAX_ATTEMPTS"),
        ("max_attempts=70000", "INVALID_ARG_MAX_ATTEMPTS"),
        ("dead_letter=bad!name", "INVALID_ARG_DEAD_LETTER"),
        ("dead_letter=t", "INVALID_ARG_DEAD_LETTER"),
        ("max_depth=lots", "INVALID_ARG_MAX_DEPTH"),
        ("bound_policy=drop-newest", "INVALID_ARG_BOUND_POLICY"),
    ],
)
def test_bad_settings_get_a_400_naming_the_parameter(
    make_nsqd: Callable[..., ServerThread], query: str, message: str
) -> None:
    server = make_nsqd()
    assert post(server, f"/channel/config?topic=t&channel=c&{query}") == (400, {"message": message})


def test_settings_survive_a_restart_and_default_restores_the_flag(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(max_attempts=7)
    post(server, "/topic/config?topic=t&msg_ttl=1h&max_depth=100")
    post(server, "/channel/config?topic=t&channel=c&max_attempts=2&dead_letter=t.bad")
    server.stop()
    server = make_nsqd(max_attempts=7)
    assert get(server, "/topic/config?topic=t") == (
        200,
        {
            "topic": "t",
            "msg_ttl": "1h0m0s",
            "max_depth": 100,
            "bound_policy": "reject",
            "dedup_records": 100_000,
            "dedup_window": "24h0m0s",
            "own": ["max_depth", "msg_ttl"],
        },
    )
    _, cfg = get(server, "/channel/config?topic=t&channel=c")
    assert (cfg["max_attempts"], cfg["dead_letter"], cfg["msg_ttl"]) == (2, "t.bad", "1h0m0s")
    _, cfg = post(server, "/channel/config?topic=t&channel=c&max_attempts=default")
    assert cfg["max_attempts"] == 7 and cfg["own"] == ["dead_letter"]


def test_everything_is_off_by_default(nsqd: ServerThread) -> None:
    with nsqd.connect() as c:
        c.sub("t", "c", rdy=10)
        with nsqd.connect() as p:
            p.pub("t", b"x")
        for _ in range(5):  # requeued forever, as nsqd
            c.req(c.read_message().id, 0)
        assert c.read_message().attempts == 6
    stats = channel_stats(nsqd, "t", "c")
    assert "lifecycle" not in stats


def test_a_channel_bounded_in_bytes(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(max_channel_bytes=1000)
    with server.connect() as c:
        c.sub("t", "c", rdy=0)
    with server.connect() as p:
        p.mpub("t", [b"x" * 400, b"y" * 400])
        p.send(b"PUB t\n\x00\x00\x01\x2c" + b"z" * 300)  # 300 more bytes: 1100 > 1000
        assert p.read_frame().data == b"E_PUB_FAILED PUB failed t:c is full (800 of 1000 bytes)"
    query = "topic=t&channel=c&bound_policy=drop-oldest"
    assert post(server, f"/channel/config?{query}")[1]["max_bytes"] == 1000
    with server.connect() as p:
        p.pub("t", b"z" * 300)
    stats = channel_stats(server, "t", "c")
    assert stats["depth"] == 2 and stats["lifecycle"]["dropped_count"] == 1


# -- bounds hold for everything a publisher or an admin call adds ------------------------------


def publish_until_refused(server: ServerThread, topic: str, limit: int) -> int:
    """PUB one message at a time until E_PUB_FAILED; returns how many were accepted."""
    from pynsqd.protocol import encode

    with server.connect() as p:
        for i in range(limit):
            p.send(encode.pub(topic, b"%05d" % i))
            frame = p.read_frame()
            if frame.data != b"OK":
                assert frame.data.startswith(b"E_PUB_FAILED"), frame
                return i
    return limit


def test_a_paused_topic_cannot_pass_a_channel_bound(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(max_channel_depth=500, channel_bound_policy="reject")
    assert post(server, "/topic/create?topic=t")[0] == 200
    assert post(server, "/channel/create?topic=t&channel=c")[0] == 200
    assert post(server, "/topic/pause?topic=t")[0] == 200
    assert publish_until_refused(server, "t", 2000) == 500
    assert post(server, "/topic/unpause?topic=t")[0] == 200
    wait_for(lambda: channel_stats(server, "t", "c")["depth"] == 500, "the backlog handed over")
    assert publish_until_refused(server, "t", 10) == 0


def test_a_retained_channel_created_in_the_past_keeps_its_bound(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as p:
        for i in range(0, 3000, 500):
            p.mpub("t", [b"%05d" % j for j in range(i, i + 500)])
    server.stop()
    server = make_nsqd(retention_time=HOUR, max_channel_depth=500)  # the bound comes now
    assert post(server, "/channel/create?topic=t&channel=c&offset=0") == (
        409,
        {"message": "CHANNEL_FULL", "offset": 0, "next": 500, "count": 500},
    )
    assert channel_stats(server, "t", "c")["depth"] == 500
    with server.connect() as c:
        c.sub("t", "c", rdy=1000)
        assert sorted(int(m.body) for m in c.read_messages(500)) == list(range(500))
        c.expect_nothing()


def test_messages_taken_back_from_consumers_may_pass_the_bound_and_are_counted(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(max_channel_depth=500, channel_bound_policy="reject")
    with server.connect() as consumer:
        consumer.sub("t", "c", rdy=400)
        assert publish_until_refused(server, "t", 400) == 400
        consumer.read_messages(400)  # 400 in flight: the queue has room for 500 more
        assert publish_until_refused(server, "t", 2000) == 500
    # Their publisher was told OK: the disconnect's requeue keeps them all, past the bound.
    wait_for(lambda: channel_stats(server, "t", "c")["depth"] == 900, "the requeue")
    assert channel_stats(server, "t", "c")["lifecycle"]["over_bound_count"] == 400
    assert publish_until_refused(server, "t", 10) == 0


def test_drop_oldest_drops_the_oldest_across_memory_and_disk(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(
        max_channel_depth=500, channel_bound_policy="drop-oldest", mem_queue_size=100
    )
    assert post(server, "/topic/create?topic=t")[0] == 200
    assert post(server, "/channel/create?topic=t&channel=c")[0] == 200
    assert publish_until_refused(server, "t", 2000) == 2000
    with server.connect() as c:
        c.sub("t", "c", rdy=1000)
        assert sorted(int(m.body) for m in c.read_messages(500)) == list(range(1500, 2000))
        c.expect_nothing()


# -- dead-letter names and failures -----------------------------------------------------------


def test_the_default_dead_letter_topic_is_always_a_valid_durable_name(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    from pynsqd.internal.names import is_valid_name

    server = make_nsqd(max_attempts=1)
    long_topic = "a" * 60
    assert post(server, f"/topic/create?topic={long_topic}")[0] == 200
    assert post(server, f"/channel/create?topic={long_topic}&channel=c")[0] == 200
    name = get(server, f"/channel/config?topic={long_topic}&channel=c")[1]["dead_letter"]
    assert is_valid_name(name) and name.endswith(".dead") and len(name) == 64
    assert post(server, "/topic/create?topic=x%23ephemeral")[0] == 200
    assert post(server, "/channel/create?topic=x%23ephemeral&channel=c")[0] == 200
    assert (
        get(server, "/channel/config?topic=x%23ephemeral&channel=c")[1]["dead_letter"] == "x.dead"
    )
    status, doc = post(server, "/channel/config?topic=t&channel=c&dead_letter=d%23ephemeral")
    assert (status, doc["message"]) == (400, "INVALID_ARG_DEAD_LETTER")
    # An exhausted message of the long topic lands in its dead-letter topic.
    with server.connect() as c:
        c.sub(long_topic, "c", rdy=1)
        with server.connect() as p:
            p.pub(long_topic, b"poison")
        c.req(c.read_message().id, 0)
        wait_for(lambda: channel_stats(server, long_topic, "c")["depth"] == 0, "dead-lettering")
    _, stats = get(server, f"/stats?format=json&topic={name}")
    assert stats["topics"][0]["depth"] == 1


def test_a_failing_dead_letter_backs_off_and_logs_once(
    make_nsqd: Callable[..., ServerThread], caplog: Any
) -> None:
    server = make_nsqd(max_attempts=1)
    assert post(server, "/topic/config?topic=t.dead&max_depth=1")[0] == 200
    with server.connect() as p:
        p.pub("t.dead", b"fill")  # the dead-letter topic is full: dead-lettering fails
    with server.connect() as c:
        c.sub("t", "c", rdy=10)
        with server.connect() as p:
            p.pub("t", b"poison")
        m = c.read_message()
        c.req(m.id, 0)
        # Not redelivered at once, again and again: deferred, as a REQ with a delay.
        wait_for(
            lambda: channel_stats(server, "t", "c")["deferred_count"] == 1, "the message deferred"
        )
        c.expect_nothing(0.3)
        again = c.read_message()  # once the delay is over, delivered once more (never lost)
        assert (again.id, again.attempts) == (m.id, 2)
        c.req(again.id, 0)
        wait_for(lambda: channel_stats(server, "t", "c")["deferred_count"] == 1, "deferred again")
    stats = channel_stats(server, "t", "c")["lifecycle"]
    assert stats["dead_letter_failed_count"] == 2
    assert caplog.text.count("failed to dead-letter") == 1  # one line per 10 s, with a count
