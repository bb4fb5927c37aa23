"""/stats over HTTP: nsqd's keys, key order and types, filters, text form, e2e."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.conftest import ServerThread

from ..waiting import wait_for
from .servers import request, stats

TOPIC_KEYS = [
    "topic_name",
    "channels",
    "depth",
    "backend_depth",
    "message_count",
    "message_bytes",
    "paused",
    "e2e_processing_latency",
]
CHANNEL_KEYS = [
    "channel_name",
    "depth",
    "backend_depth",
    "in_flight_count",
    "deferred_count",
    "message_count",
    "requeue_count",
    "timeout_count",
    "client_count",
    "clients",
    "paused",
    "e2e_processing_latency",
    "overflow_count",  # pynsqd's own, after nsqd's
]
CLIENT_TYPES: dict[str, type] = {
    "client_id": str,
    "hostname": str,
    "version": str,
    "remote_address": str,
    "state": int,
    "ready_count": int,
    "in_flight_count": int,
    "message_count": int,
    "finish_count": int,
    "requeue_count": int,
    "connect_ts": int,
    "sample_rate": int,
    "deflate": bool,
    "snappy": bool,
    "user_agent": str,
    "topology_zone": str,
    "topology_region": str,
    "tls": bool,
    "tls_cipher_suite": str,
    "tls_version": str,
    "tls_negotiated_protocol": str,
    "tls_negotiated_protocol_is_mutual": bool,
}
MEMORY_KEYS = [
    "heap_objects",
    "heap_idle_bytes",
    "heap_in_use_bytes",
    "heap_released_bytes",
    "gc_pause_usec_100",
    "gc_pause_usec_99",
    "gc_pause_usec_95",
    "next_gc_bytes",
    "gc_total_runs",
]


def check_client(c: dict[str, Any], *, producer: bool) -> None:
    expected = list(CLIENT_TYPES)
    if producer:
        expected.insert(expected.index("tls"), "pub_counts")
    assert list(c) == expected
    for key, typ in CLIENT_TYPES.items():
        assert type(c[key]) is typ, key
    assert c["version"] == "V2"


def test_stats_json_keys_and_types(nsqd: ServerThread) -> None:
    sub = nsqd.connect(client_id="worker", hostname="h.example", user_agent="test/1.0")
    with sub, nsqd.connect() as pub:
        sub.sub("t", "c", rdy=5)
        pub.pub("t", b"hello")
        pub.mpub("u", [b"a", b"b"])
        msg = sub.read_message()
        data = stats(nsqd)
    assert list(data) == ["version", "health", "start_time", "topics", "memory", "producers"]
    assert (data["version"], data["health"]) == ("1.3.0", "OK")
    assert type(data["start_time"]) is int
    assert list(data["memory"]) == MEMORY_KEYS
    assert all(type(v) is int for v in data["memory"].values())
    assert data["memory"]["heap_in_use_bytes"] > 0

    assert [t["topic_name"] for t in data["topics"]] == ["t", "u"]
    t = data["topics"][0]
    assert list(t) == TOPIC_KEYS
    assert (t["message_count"], t["message_bytes"], t["depth"], t["paused"]) == (1, 5, 0, False)
    assert t["e2e_processing_latency"] == {"count": 0, "percentiles": None}
    c = t["channels"][0]
    assert list(c) == CHANNEL_KEYS
    for key in CHANNEL_KEYS[1:9]:
        assert type(c[key]) is int, key
    assert (c["in_flight_count"], c["message_count"], c["client_count"]) == (1, 1, 1)
    assert c["e2e_processing_latency"] == {"count": 0, "percentiles": None}
    client = c["clients"][0]
    check_client(client, producer=False)
    assert (client["client_id"], client["hostname"], client["user_agent"]) == (
        "worker",
        "h.example",
        "test/1.0",
    )
    assert (client["state"], client["ready_count"], client["in_flight_count"]) == (3, 5, 1)
    assert client["message_count"] == 1
    assert client["remote_address"].startswith("127.0.0.1:")
    assert msg.body == b"hello"

    # Every topic a producer published to, sorted.
    (producer,) = data["producers"]
    check_client(producer, producer=True)
    assert producer["pub_counts"] == [{"topic": "t", "count": 1}, {"topic": "u", "count": 2}]


def test_stats_filters(nsqd: ServerThread) -> None:
    with nsqd.connect() as sub:
        sub.sub("t", "c", rdy=1)
        request(nsqd, "POST", "/topic/create?topic=u")
        request(nsqd, "POST", "/channel/create?topic=t&channel=d")
        assert [t["topic_name"] for t in stats(nsqd, "&topic=t")["topics"]] == ["t"]
        only = stats(nsqd, "&topic=t&channel=d")["topics"][0]["channels"]
        assert [c["channel_name"] for c in only] == ["d"]
        # An unknown topic: null topics; an unknown channel drops its topic.
        data = stats(nsqd, "&topic=nope")
        assert (data["topics"], data["producers"]) == (None, None)
        assert stats(nsqd, "&channel=nope")["topics"] == []
        # No producers yet: null, as nsqd's nil slice.
        assert stats(nsqd)["producers"] is None

        data = stats(nsqd, "&include_clients=false&include_mem=0")
        assert "memory" not in data
        assert data["producers"] is None
        c = data["topics"][0]["channels"][0]
        assert (c["channel_name"], c["clients"], c["client_count"]) == ("c", None, 1)
        # Any other value means true.
        data = stats(nsqd, "&include_clients=maybe&include_mem=yes")
        assert "memory" in data and len(data["topics"][0]["channels"][0]["clients"]) == 1
    assert request(nsqd, "GET", "/stats?format=json&topic=%zz").status == 400


def test_stats_text(nsqd: ServerThread) -> None:
    with nsqd.connect(hostname="h", user_agent="ua") as sub, nsqd.connect() as pub:
        sub.sub("t", "c", rdy=1)
        pub.pub("t", b"x")
        sub.read_message()
        request(nsqd, "POST", "/channel/pause?topic=t&channel=c")
        reply = request(nsqd, "GET", "/stats")
        assert reply.status == 200
        text = reply.body.decode()
    lines = text.splitlines()
    assert lines[0].startswith("nsqd v1.3.0 (built w/")
    assert lines[1].startswith("start_time ")
    assert lines[2].startswith("uptime ")
    assert "\nHealth: OK\n" in text
    assert "\nMemory:\n   heap_objects" in text
    assert "\n   [t              ] depth: 0     be-depth: 0     msgs: 1        e2e%: \n" in text
    assert "   *P [c                        ] depth: 0     be-depth: 0     inflt: 1    " in text
    port = text.split("        [V2 h:", 1)[1].split(" ", 1)[0]
    assert f"        [V2 {f'h:{port} ua':<21}] state: 3 inflt: 1    rdy: 1    fin: 0   " in text
    assert "\nProducers:\n   [V2 " in text and "topics: t=1 connected:" in text
    empty = request(nsqd, "GET", "/stats?format=text&topic=none&include_mem=false").body
    assert b"\nTopics: None\n" in empty and b"Memory" not in empty
    assert b"\nProducers: None\n" in empty


def test_e2e_processing_latency(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(e2e_processing_latency_percentiles=[1.0, 0.99, 0.5])
    with server.connect() as sub, server.connect() as pub:
        sub.sub("t", "c", rdy=10)
        request(server, "POST", "/channel/create?topic=t&channel=other")
        pub.mpub("t", [b"a", b"b", b"c"])
        for m in sub.read_messages(3):
            sub.fin(m.id)

        def finished() -> bool:
            t = stats(server)["topics"][0]
            return bool(t["e2e_processing_latency"]["count"] == 3)

        wait_for(finished)
        t = stats(server)["topics"][0]
    for result in (t["e2e_processing_latency"], t["channels"][0]["e2e_processing_latency"]):
        assert result["count"] == 3
        assert [p["quantile"] for p in result["percentiles"]] == [1, 0.99, 0.5]
        assert all(type(p["value"]) is int and p["value"] > 0 for p in result["percentiles"])
    # A channel with no FINs yet reports its percentiles as 0.
    other = t["channels"][1]["e2e_processing_latency"]
    assert other == {
        "count": 0,
        "percentiles": [
            {"quantile": 1, "value": 0},
            {"quantile": 0.99, "value": 0},
            {"quantile": 0.5, "value": 0},
        ],
    }
    text = request(server, "GET", "/stats").body.decode()
    assert "e2e%: " in text and ("us, " in text or "ms, " in text)
