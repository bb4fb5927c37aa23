"""nsqlookupd over real sockets: V1 transcripts (what Go nsqd sends), errors, the HTTP API."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator

import pytest

from ..waiting import wait_for
from .lookupd_helpers import (
    LookupdThread,
    V1Conn,
    get_json,
    go_identify,
    http,
    lookupd_factory,
)


@pytest.fixture
def make_lookupd() -> Iterator[Callable[..., LookupdThread]]:
    yield from lookupd_factory()


@pytest.fixture
def lookupd(make_lookupd: Callable[..., LookupdThread]) -> LookupdThread:
    return make_lookupd()


# -- TCP ----------------------------------------------------------------------------------------


def test_go_nsqd_registration_transcript(lookupd: LookupdThread) -> None:
    conn = V1Conn(lookupd.tcp_address)
    assert conn.command(b"PING\n") == b"OK"  # allowed before IDENTIFY
    info = json.loads(conn.command(go_identify()))
    assert info == {
        "tcp_port": lookupd.lookupd.real_tcp_port,
        "http_port": lookupd.lookupd.real_http_port,
        "version": "1.3.0",
        "broadcast_address": "lookupd-host",
        "hostname": socket.gethostname(),
    }
    assert conn.command(b"REGISTER topic1\n") == b"OK"
    assert conn.command(b"REGISTER topic1 ch1\n") == b"OK"
    assert conn.command(b"REGISTER topic2 ch2\n") == b"OK"
    assert conn.command(b"PING\n") == b"OK"
    local = f"127.0.0.1:{conn.sock.getsockname()[1]}"
    data = get_json(lookupd.http_url + "/lookup?topic=topic1")
    assert data == {
        "channels": ["ch1"],
        "producers": [
            {
                "remote_address": local,
                "hostname": "node1.local",
                "broadcast_address": "node1",
                "tcp_port": 4150,
                "http_port": 4151,
                "version": "1.3.0",
                "topology_zone": "",
                "topology_region": "",
            }
        ],
    }
    assert get_json(lookupd.http_url + "/topics") == {"topics": ["topic1", "topic2"]}
    assert get_json(lookupd.http_url + "/channels?topic=topic2") == {"channels": ["ch2"]}
    nodes = get_json(lookupd.http_url + "/nodes")["producers"]
    assert [(n["topics"], n["tombstones"]) for n in nodes] == [
        (["topic1", "topic2"], [False, False])
    ]
    # UNREGISTER of a channel, then of a topic
    assert conn.command(b"UNREGISTER topic1 ch1\n") == b"OK"
    assert get_json(lookupd.http_url + "/lookup?topic=topic1")["channels"] == ["ch1"]  # key stays
    assert conn.command(b"UNREGISTER topic2\n") == b"OK"
    assert get_json(lookupd.http_url + "/lookup?topic=topic2")["producers"] == []
    conn.close()


def test_disconnect_removes_node_everywhere(lookupd: LookupdThread) -> None:
    a = V1Conn(lookupd.tcp_address)
    b = V1Conn(lookupd.tcp_address)
    a.command(go_identify(address="a"))
    b.command(go_identify(address="b"))
    for conn in (a, b):
        assert conn.command(b"REGISTER t c\n") == b"OK"
    url = lookupd.http_url + "/lookup?topic=t"
    assert len(get_json(url)["producers"]) == 2
    a.close()
    wait_for(lambda: [p["broadcast_address"] for p in get_json(url)["producers"]] == ["b"])
    assert [n["broadcast_address"] for n in get_json(lookupd.http_url + "/nodes")["producers"]] == [
        "b"
    ]
    b.close()
    wait_for(lambda: get_json(url)["producers"] == [])
    # the registrations stay, with no producers
    assert get_json(lookupd.http_url + "/topics") == {"topics": ["t"]}
    assert get_json(url)["channels"] == ["c"]


def test_ephemeral_registrations_go_with_last_producer(lookupd: LookupdThread) -> None:
    conn = V1Conn(lookupd.tcp_address)
    conn.command(go_identify())
    conn.command(b"REGISTER t c#ephemeral\n")
    conn.command(b"REGISTER e#ephemeral\n")
    assert get_json(lookupd.http_url + "/channels?topic=t") == {"channels": ["c#ephemeral"]}
    conn.command(b"UNREGISTER t c#ephemeral\n")
    conn.command(b"UNREGISTER e#ephemeral\n")
    assert get_json(lookupd.http_url + "/channels?topic=t") == {"channels": []}
    assert get_json(lookupd.http_url + "/topics") == {"topics": ["t"]}
    conn.close()


ERRORS = [
    (b"", b"  V2", b"E_BAD_PROTOCOL"),
    (b"", b"GET / HTTP/1.1\r\n", b"E_BAD_PROTOCOL"),
    (b"  V1", b"FOO\n", b"E_INVALID invalid command FOO"),
    (b"  V1", b"REGISTER t\n", b"E_INVALID client must IDENTIFY"),
    (b"  V1", b"UNREGISTER t\n", b"E_INVALID client must IDENTIFY"),
    (b"  V1" + go_identify(), b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
    (b"  V1" + go_identify(), b"REGISTER b@d\n",
     b"E_BAD_TOPIC REGISTER topic name 'b@d' is not valid"),
    (b"  V1" + go_identify(), b"UNREGISTER t b@d\n",
     b"E_BAD_CHANNEL UNREGISTER channel name 'b@d' is not valid"),
    (b"  V1" + go_identify(), go_identify(), b"E_INVALID cannot IDENTIFY again"),
    (b"  V1", b"IDENTIFY\n\x00\x00\x00\x02{}", b"E_BAD_BODY IDENTIFY missing fields"),
    (b"  V1", b"IDENTIFY\n\x00\x00\x00\x02[]", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b"  V1", b"IDENTIFY\n\xff\xff\xff\xff", b"E_BAD_BODY IDENTIFY failed to read body"),
]  # fmt: skip


@pytest.mark.parametrize(("setup", "bad", "error"), ERRORS)
def test_errors_are_sent_then_fatal(
    lookupd: LookupdThread, setup: bytes, bad: bytes, error: bytes
) -> None:
    other = V1Conn(lookupd.tcp_address)
    other.command(go_identify(address="good"))
    other.command(b"REGISTER t\n")
    conn = V1Conn(lookupd.tcp_address, magic=b"")
    conn.send(setup)
    if setup.startswith(b"  V1" + b"IDENTIFY"):
        conn.read()
    conn.send(bad)
    assert conn.read() == error
    conn.assert_closed()
    # the other node's registration is untouched, and it keeps working
    assert other.command(b"PING\n") == b"OK"
    producers = get_json(lookupd.http_url + "/lookup?topic=t")["producers"]
    assert [p["broadcast_address"] for p in producers] == ["good"]
    other.close()


def test_short_identify_body_at_half_close(lookupd: LookupdThread) -> None:
    conn = V1Conn(lookupd.tcp_address)
    conn.send(b"IDENTIFY\n\x00\x00")
    conn.sock.shutdown(socket.SHUT_WR)
    assert conn.read() == b"E_BAD_BODY IDENTIFY failed to read body size"
    conn.assert_closed()


def test_pipelined_commands_in_one_write(lookupd: LookupdThread) -> None:
    conn = V1Conn(lookupd.tcp_address, magic=b"")
    conn.send(b"  V1" + go_identify() + b"REGISTER a\nREGISTER b c\nPING\nBAD\nPING\n")
    assert json.loads(conn.read())["version"] == "1.3.0"
    assert [conn.read() for _ in range(4)] == [
        b"OK",
        b"OK",
        b"OK",
        b"E_INVALID invalid command BAD",
    ]
    conn.assert_closed()


# -- HTTP ---------------------------------------------------------------------------------------


def test_http_envelopes_and_errors(lookupd: LookupdThread) -> None:
    url = lookupd.http_url
    status, body, headers = http(url + "/ping")
    assert (status, body) == (200, b"OK")
    assert "X-NSQ-Content-Type" not in headers
    assert get_json(url + "/info") == {"version": "1.3.0"}
    assert get_json(url + "/topics") == {"topics": []}
    cases = [
        ("GET", "/nope", 404, "NOT_FOUND"),
        ("POST", "/ping", 405, "METHOD_NOT_ALLOWED"),
        ("POST", "/lookup?topic=t", 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/lookup", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/lookup?topic=t", 404, "TOPIC_NOT_FOUND"),
        ("GET", "/lookup?topic=%zz", 400, "INVALID_REQUEST"),
        ("GET", "/channels", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/create", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/create?topic=b@d", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/topic/delete", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?topic=t", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/create?channel=c", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?topic=b@d&channel=c", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/channel/create?topic=t&channel=b@d", 400, "INVALID_ARG_CHANNEL"),
        ("POST", "/channel/delete?topic=t&channel=c", 404, "CHANNEL_NOT_FOUND"),
        ("POST", "/topic/tombstone?topic=t", 400, "MISSING_ARG_NODE"),
        ("POST", "/topic/tombstone?node=n:1", 400, "MISSING_ARG_TOPIC"),
    ]
    for method, path, code, token in cases:
        status, body, headers = http(url + path, method, b"" if method == "POST" else None)
        assert (status, json.loads(body)) == (code, {"message": token}), path
        assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"


def test_http_topic_and_channel_admin(lookupd: LookupdThread) -> None:
    url = lookupd.http_url
    assert http(url + "/topic/create?topic=t1", "POST", b"")[:2] == (200, b"")
    assert http(url + "/channel/create?topic=t2&channel=c", "POST", b"")[:2] == (200, b"")
    assert get_json(url + "/topics") == {"topics": ["t1", "t2"]}
    assert get_json(url + "/lookup?topic=t2") == {"channels": ["c"], "producers": []}
    assert http(url + "/channel/delete?topic=t2&channel=c", "POST", b"")[:2] == (200, b"")
    assert get_json(url + "/channels?topic=t2") == {"channels": []}
    assert http(url + "/topic/delete?topic=t2", "POST", b"")[:2] == (200, b"")
    assert http(url + "/topic/delete?topic=never", "POST", b"")[:2] == (200, b"")  # not checked
    assert get_json(url + "/topics") == {"topics": ["t1"]}
    assert get_json(url + "/channels?topic=") == {"channels": []}


def test_tombstone_hides_producer_for_lifetime(make_lookupd: Callable[..., LookupdThread]) -> None:
    lookupd = make_lookupd(tombstone_lifetime=0.5)
    a = V1Conn(lookupd.tcp_address)
    b = V1Conn(lookupd.tcp_address)
    a.command(go_identify(http_port=1001, address="a"))
    b.command(go_identify(http_port=1002, address="b"))
    a.command(b"REGISTER t\n")
    b.command(b"REGISTER t\n")
    b.command(b"REGISTER u\n")
    url = lookupd.http_url
    assert http(url + "/topic/tombstone?topic=t&node=a:1001", "POST", b"")[:2] == (200, b"")
    assert http(url + "/topic/tombstone?topic=t&node=x:1", "POST", b"")[0] == 200  # no match

    def visible() -> list[str]:
        return [p["broadcast_address"] for p in get_json(url + "/lookup?topic=t")["producers"]]

    assert visible() == ["b"]
    # /nodes still lists the node, with the tombstone flag for that topic
    nodes = {n["broadcast_address"]: n for n in get_json(url + "/nodes")["producers"]}
    assert (nodes["a"]["topics"], nodes["a"]["tombstones"]) == (["t"], [True])
    assert (nodes["b"]["topics"], nodes["b"]["tombstones"]) == (["t", "u"], [False, False])
    debug = get_json(url + "/debug")
    assert sorted(debug) == ["client::", "topic:t:", "topic:u:"]
    assert [e["tombstoned"] for e in debug["topic:t:"] if e["broadcast_address"] == "a"] == [True]
    wait_for(lambda: sorted(visible()) == ["a", "b"])
    a.close()
    b.close()


def test_inactive_producers_are_hidden_until_they_ping(
    make_lookupd: Callable[..., LookupdThread],
) -> None:
    lookupd = make_lookupd(inactive_producer_timeout=0.3)
    conn = V1Conn(lookupd.tcp_address)
    conn.command(go_identify())
    conn.command(b"REGISTER t\n")
    url = lookupd.http_url + "/lookup?topic=t"
    wait_for(lambda: get_json(url)["producers"] == [])
    assert get_json(lookupd.http_url + "/nodes") == {"producers": []}
    assert conn.command(b"PING\n") == b"OK"
    assert len(get_json(url)["producers"]) == 1
    conn.close()


def test_debug_pprof_index(lookupd: LookupdThread) -> None:
    status, body, _ = http(lookupd.http_url + "/debug/pprof")
    assert status == 200
    assert body
