"""The HTTP API over real HTTP connections: every endpoint, status and token of nsqd."""

from __future__ import annotations

import json
import re
import socket
import struct
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import ServerThread

from ..waiting import wait_for
from .servers import Reply, channel_stats, request, stats


def binary_mpub(bodies: list[bytes]) -> bytes:
    return struct.pack(">l", len(bodies)) + b"".join(struct.pack(">l", len(b)) + b for b in bodies)


def assert_error(reply: Reply, status: int, token: str) -> None:
    assert (reply.status, reply.message) == (status, token)
    assert reply.v1


# -- /ping and /info ------------------------------------------------------------------------


def test_ping(nsqd: ServerThread) -> None:
    reply = request(nsqd, "GET", "/ping")
    assert (reply.status, reply.body) == (200, b"OK")
    assert not reply.v1  # a PlainText route
    nsqd.call(lambda: nsqd.nsqd.set_health_error(OSError("disk full")))
    reply = request(nsqd, "GET", "/ping")
    assert (reply.status, reply.body) == (500, b"NOK - disk full")
    assert stats(nsqd)["health"] == "NOK - disk full"
    nsqd.call(lambda: nsqd.nsqd.set_health_error(None))
    assert request(nsqd, "GET", "/ping").body == b"OK"


def test_info(nsqd: ServerThread) -> None:
    reply = request(nsqd, "GET", "/info")
    assert reply.status == 200 and reply.v1
    info = reply.json
    assert list(info) == [
        "version",
        "broadcast_address",
        "hostname",
        "http_port",
        "tcp_port",
        "start_time",
        "max_heartbeat_interval",
        "max_output_buffer_size",
        "max_output_buffer_timeout",
        "max_deflate_level",
        "topology_zone",
        "topology_region",
        "features",
        "max_headers",
        "max_header_bytes",
        "retention_time",
        "retention_bytes",
        "storage_id",
    ]
    assert info["features"] == ["replayable-topics", "headers"]
    assert (info["max_headers"], info["max_header_bytes"]) == (16, 4096)
    assert re.fullmatch(r"[0-9a-f]{16}", info["storage_id"])
    assert info["retention_time"] == 0 and info["retention_bytes"] == 0
    assert info["version"] == "1.3.0"
    assert info["http_port"] == nsqd.http_port and info["tcp_port"] == nsqd.tcp_port
    assert info["hostname"] == socket.gethostname()
    assert info["max_heartbeat_interval"] == 60 * 10**9  # ns, not ms
    assert info["max_output_buffer_timeout"] == 30 * 10**9
    assert info["max_output_buffer_size"] == 65536
    assert isinstance(info["start_time"], int)


def test_http_server_log_line_and_address(nsqd: ServerThread) -> None:
    assert nsqd.nsqd.http_address == f"127.0.0.1:{nsqd.http_port}"


def test_http_disabled(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(http_address="")
    assert server.nsqd.http_address == ""
    with server.connect() as conn:
        conn.pub("t", b"x")


def test_http_on_unix_socket(make_nsqd: Callable[..., ServerThread], tmp_path: Any) -> None:
    path = str(tmp_path / "http.sock")
    server = make_nsqd(http_address=path)
    assert server.nsqd.http_address == path
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    sock.sendall(b"GET /info HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    sock.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert json.loads(body)["http_port"] == -1


# -- routing --------------------------------------------------------------------------------


def test_not_found_and_method_not_allowed(nsqd: ServerThread) -> None:
    reply = request(nsqd, "GET", "/nope")
    assert (reply.status, reply.body) == (404, b'{"message":"NOT_FOUND"}')
    assert reply.headers["content-type"] == "application/json; charset=utf-8"
    reply = request(nsqd, "GET", "/pub?topic=t")
    assert (reply.status, reply.body) == (405, b'{"message":"METHOD_NOT_ALLOWED"}')
    assert_error(request(nsqd, "POST", "/stats"), 405, "METHOD_NOT_ALLOWED")
    assert_error(request(nsqd, "GET", "/topic/create?topic=t"), 405, "METHOD_NOT_ALLOWED")
    assert_error(request(nsqd, "POST", "/config/log_level"), 405, "METHOD_NOT_ALLOWED")
    assert_error(request(nsqd, "GET", "/config/"), 404, "NOT_FOUND")
    assert nsqd.call(lambda: "t" not in nsqd.nsqd.topics)


# -- /pub -----------------------------------------------------------------------------------


def test_pub_consumed_over_tcp(nsqd: ServerThread) -> None:
    with nsqd.connect() as sub:
        sub.sub("t", "c", rdy=10)
        reply = request(nsqd, "POST", "/pub?topic=t", b"hello\r\n")
        assert (reply.status, reply.body) == (200, b"OK")
        assert reply.v1
        assert "content-type" not in reply.headers or "json" not in reply.headers["content-type"]
        msg = sub.read_message()
        assert msg.body == b"hello\r\n"
        sub.fin(msg.id)


def test_pub_with_defer(nsqd: ServerThread) -> None:
    request(nsqd, "POST", "/channel/create?topic=t&channel=c")  # topic missing: 404
    assert request(nsqd, "POST", "/topic/create?topic=t").status == 200
    assert request(nsqd, "POST", "/channel/create?topic=t&channel=c").status == 200
    reply = request(nsqd, "POST", "/pub?topic=t&defer=60000", b"later")
    assert (reply.status, reply.body) == (200, b"OK")
    wait_for(lambda: channel_stats(nsqd, "t", "c")["deferred_count"] == 1)
    assert channel_stats(nsqd, "t", "c")["depth"] == 0


@pytest.mark.parametrize(
    "defer", ["abc", "-1", "1.5", "%205", "1_0", "3600001", "99999999999999999999"]
)
def test_pub_invalid_defer_creates_nothing(nsqd: ServerThread, defer: str) -> None:
    assert_error(request(nsqd, "POST", f"/pub?topic=t&defer={defer}", b"x"), 400, "INVALID_DEFER")
    assert nsqd.call(lambda: "t" not in nsqd.nsqd.topics)


def test_pub_errors(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(max_msg_size=100)
    # Content-Length over the limit: refused before the body is read.
    assert_error(request(server, "POST", "/pub?topic=t", b"x" * 101), 413, "MSG_TOO_BIG")
    # No Content-Length (chunked): refused after max-msg-size + 1 bytes.
    reply = request(server, "POST", "/pub?topic=t", b"x" * 5000, chunked=True)
    assert_error(reply, 413, "MSG_TOO_BIG")
    assert request(server, "POST", "/pub?topic=t", b"x" * 100, chunked=True).status == 200
    assert_error(request(server, "POST", "/pub?topic=t", b""), 400, "MSG_EMPTY")
    # The body is checked before the query, as in nsqd.
    assert_error(request(server, "POST", "/pub", b""), 400, "MSG_EMPTY")
    assert_error(request(server, "POST", "/pub?topic=%zz", b"x"), 400, "INVALID_REQUEST")
    assert_error(request(server, "POST", "/pub", b"x"), 400, "MISSING_ARG_TOPIC")
    assert_error(request(server, "POST", "/pub?topic=", b"x"), 400, "INVALID_TOPIC")
    assert_error(request(server, "POST", "/pub?topic=a%20b", b"x"), 400, "INVALID_TOPIC")
    assert_error(request(server, "POST", "/pub?topic=" + "a" * 65, b"x"), 400, "INVALID_TOPIC")


def test_pub_exiting_topic(nsqd: ServerThread) -> None:
    topic = nsqd.call(lambda: nsqd.nsqd.get_topic("t"))
    nsqd.call(lambda: setattr(topic, "exiting", True))
    try:
        assert_error(request(nsqd, "POST", "/pub?topic=t", b"x"), 503, "EXITING")
        assert_error(request(nsqd, "POST", "/mpub?topic=t", b"x\ny"), 503, "EXITING")
    finally:
        nsqd.call(lambda: setattr(topic, "exiting", False))
    assert nsqd.call(lambda: topic.message_count) == 0


# -- /mpub ----------------------------------------------------------------------------------


def test_mpub_text(nsqd: ServerThread) -> None:
    with nsqd.connect() as sub:
        sub.sub("t", "c", rdy=10)
        reply = request(nsqd, "POST", "/mpub?topic=t", b"a\r\n\nb\n\n\nc")
        assert (reply.status, reply.body) == (200, b"OK")
        msgs = sub.read_messages(3)
        # One "\n" is removed per line; "\r" stays; empty lines are skipped.
        assert [m.body for m in msgs] == [b"a\r", b"b", b"c"]
        for m in msgs:
            sub.fin(m.id)
    for mode in ("false", "0"):
        assert request(nsqd, "POST", f"/mpub?topic=t&binary={mode}", b"x\ny").status == 200
    # Only empty lines: 200 with nothing published.
    assert request(nsqd, "POST", "/mpub?topic=u", b"\n\n").status == 200
    assert nsqd.call(lambda: nsqd.nsqd.topics["u"].message_count) == 0


@pytest.mark.parametrize("mode", ["true", "1", "yes"])
def test_mpub_binary(nsqd: ServerThread, mode: str) -> None:
    with nsqd.connect() as sub:
        sub.sub("t", "c", rdy=10)
        body = binary_mpub([b"one\n", b"two", b"three"])
        reply = request(nsqd, "POST", f"/mpub?topic=t&binary={mode}", body)
        assert (reply.status, reply.body) == (200, b"OK")
        assert [m.body for m in sub.read_messages(3)] == [b"one\n", b"two", b"three"]


def test_mpub_errors_publish_nothing(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(max_msg_size=10, max_body_size=100)
    cases: list[tuple[str, bytes, bool, int, str]] = [
        ("", b"x" * 101, False, 413, "BODY_TOO_BIG"),
        ("", b"x\n" * 60, True, 413, "BODY_TOO_BIG"),
        ("", b"ok\n" + b"x" * 11 + b"\nok", False, 413, "MSG_TOO_BIG"),
        ("&binary=true", b"\x00\x00", False, 413, "BAD_BODY"),
        ("&binary=true", struct.pack(">l", 0), False, 413, "BAD_BODY"),
        ("&binary=true", struct.pack(">ll", 1, 0), False, 413, "BAD_MESSAGE"),
        ("&binary=true", struct.pack(">ll", 1, 11) + b"x" * 11, False, 413, "BAD_MESSAGE"),
        ("&binary=true", struct.pack(">ll", 2, 1) + b"x", False, 413, "BAD_MESSAGE"),
        ("&binary=true", binary_mpub([b"a"]) + b"junk", False, 413, "BAD_BODY"),
    ]
    for query, body, chunked, status, token in cases:
        reply = request(server, "POST", "/mpub?topic=t" + query, body, chunked=chunked)
        assert (reply.status, reply.message) == (status, token), (query, body)
    assert server.call(lambda: "t" not in server.nsqd.topics)
    assert_error(request(server, "POST", "/mpub", b"x"), 400, "MISSING_ARG_TOPIC")
    assert_error(request(server, "POST", "/mpub?topic=a/b", b"x"), 400, "INVALID_TOPIC")
    assert_error(request(server, "POST", "/mpub?topic=%", b"x"), 400, "INVALID_REQUEST")


# -- /topic/* -------------------------------------------------------------------------------


def test_topic_endpoints(nsqd: ServerThread) -> None:
    reply = request(nsqd, "POST", "/topic/create?topic=t")
    assert (reply.status, reply.body) == (200, b"")
    assert reply.v1
    assert nsqd.call(lambda: "t" in nsqd.nsqd.topics)
    request(nsqd, "POST", "/mpub?topic=t", b"a\nb")
    assert stats(nsqd)["topics"][0]["depth"] == 2
    assert request(nsqd, "POST", "/topic/empty?topic=t").body == b""
    assert stats(nsqd)["topics"][0]["depth"] == 0
    assert request(nsqd, "POST", "/topic/pause?topic=t").status == 200
    assert stats(nsqd)["topics"][0]["paused"] is True
    assert request(nsqd, "POST", "/topic/unpause?topic=t").status == 200
    assert stats(nsqd)["topics"][0]["paused"] is False
    assert request(nsqd, "POST", "/topic/delete?topic=t").body == b""
    assert nsqd.call(lambda: "t" not in nsqd.nsqd.topics)


def test_topic_errors(nsqd: ServerThread) -> None:
    for action in ("create", "delete", "empty", "pause", "unpause"):
        assert_error(request(nsqd, "POST", f"/topic/{action}"), 400, "MISSING_ARG_TOPIC")
        assert_error(request(nsqd, "POST", f"/topic/{action}?topic=%zz"), 400, "INVALID_REQUEST")
    for action in ("create", "empty"):
        assert_error(request(nsqd, "POST", f"/topic/{action}?topic=a!"), 400, "INVALID_TOPIC")
    for action in ("delete", "empty", "pause", "unpause"):
        assert_error(request(nsqd, "POST", f"/topic/{action}?topic=x"), 404, "TOPIC_NOT_FOUND")
    # delete and pause do not validate the name: an invalid one is simply not found.
    assert_error(request(nsqd, "POST", "/topic/delete?topic=a!"), 404, "TOPIC_NOT_FOUND")
    assert_error(request(nsqd, "POST", "/topic/pause?topic=a!"), 404, "TOPIC_NOT_FOUND")


# -- /channel/* -----------------------------------------------------------------------------


def test_channel_endpoints(nsqd: ServerThread) -> None:
    request(nsqd, "POST", "/topic/create?topic=t")
    reply = request(nsqd, "POST", "/channel/create?topic=t&channel=c")
    assert (reply.status, reply.body) == (200, b"")
    request(nsqd, "POST", "/mpub?topic=t", b"a\nb")
    wait_for(lambda: channel_stats(nsqd, "t", "c")["depth"] == 2)
    assert request(nsqd, "POST", "/channel/pause?topic=t&channel=c").body == b""
    assert channel_stats(nsqd, "t", "c")["paused"] is True
    assert request(nsqd, "POST", "/channel/unpause?topic=t&channel=c").status == 200
    assert channel_stats(nsqd, "t", "c")["paused"] is False
    assert request(nsqd, "POST", "/channel/empty?topic=t&channel=c").body == b""
    assert channel_stats(nsqd, "t", "c")["depth"] == 0
    assert request(nsqd, "POST", "/channel/delete?topic=t&channel=c").body == b""
    assert stats(nsqd)["topics"][0]["channels"] == []


def test_channel_errors(nsqd: ServerThread) -> None:
    request(nsqd, "POST", "/topic/create?topic=t")
    for action in ("create", "delete", "empty", "pause", "unpause"):
        path = f"/channel/{action}"
        assert_error(request(nsqd, "POST", path + "?topic=%zz"), 400, "INVALID_REQUEST")
        assert_error(request(nsqd, "POST", path), 400, "MISSING_ARG_TOPIC")
        assert_error(request(nsqd, "POST", path + "?topic=a!"), 400, "INVALID_ARG_TOPIC")
        assert_error(request(nsqd, "POST", path + "?topic=t"), 400, "MISSING_ARG_CHANNEL")
        reply = request(nsqd, "POST", path + "?topic=t&channel=a!")
        assert_error(reply, 400, "INVALID_ARG_CHANNEL")
        reply = request(nsqd, "POST", path + "?topic=nope&channel=c")
        assert_error(reply, 404, "TOPIC_NOT_FOUND")
    for action in ("delete", "empty", "pause", "unpause"):
        reply = request(nsqd, "POST", f"/channel/{action}?topic=t&channel=nope")
        assert_error(reply, 404, "CHANNEL_NOT_FOUND")
    assert nsqd.call(lambda: "nope" not in nsqd.nsqd.topics)


def test_pause_stops_delivery(nsqd: ServerThread) -> None:
    with nsqd.connect() as sub:
        sub.sub("t", "c", rdy=10)
        assert request(nsqd, "POST", "/channel/pause?topic=t&channel=c").status == 200
        request(nsqd, "POST", "/pub?topic=t", b"one")
        sub.expect_nothing()
        assert channel_stats(nsqd, "t", "c")["depth"] == 1
        assert request(nsqd, "POST", "/channel/unpause?topic=t&channel=c").status == 200
        msg = sub.read_message()
        assert msg.body == b"one"
        sub.fin(msg.id)

        assert request(nsqd, "POST", "/topic/pause?topic=t").status == 200
        request(nsqd, "POST", "/pub?topic=t", b"two")
        sub.expect_nothing()
        assert stats(nsqd)["topics"][0]["depth"] == 1
        assert request(nsqd, "POST", "/topic/unpause?topic=t").status == 200
        assert sub.read_message().body == b"two"


def test_channel_empty_clears_in_flight_and_deferred(nsqd: ServerThread) -> None:
    with nsqd.connect() as sub:
        sub.sub("t", "c", rdy=1)
        request(nsqd, "POST", "/mpub?topic=t", b"a\nb\nc")
        request(nsqd, "POST", "/pub?topic=t&defer=60000", b"d")
        msg = sub.read_message()
        wait_for(lambda: channel_stats(nsqd, "t", "c")["deferred_count"] == 1)
        c = channel_stats(nsqd, "t", "c")
        assert (c["in_flight_count"], c["depth"]) == (1, 2)
        assert c["clients"][0]["in_flight_count"] == 1
        assert request(nsqd, "POST", "/channel/empty?topic=t&channel=c").status == 200
        c = channel_stats(nsqd, "t", "c")
        assert (c["in_flight_count"], c["deferred_count"], c["depth"]) == (0, 0, 0)
        assert c["clients"][0]["in_flight_count"] == 0
        sub.fin(msg.id)
        assert sub.read_error().startswith(b"E_FIN_FAILED")


# -- /config/:opt ---------------------------------------------------------------------------


def test_config_get(nsqd: ServerThread) -> None:
    def get(opt: str) -> Reply:
        reply = request(nsqd, "GET", f"/config/{opt}")
        assert reply.status == 200 and reply.v1
        return reply

    assert get("mem_queue_size").json == 10000
    assert get("nsqlookupd_tcp_addresses").json == []
    assert get("log_level").json == 2  # Go's lg.INFO
    assert get("msg_timeout").json == 60 * 10**9  # a Go time.Duration: ns
    assert get("id").json == nsqd.opts.node_id  # the cfg name, not the flag's
    assert get("snappy").json is True
    assert get("e2e_processing_latency_percentiles").json == []
    assert get("tls_required").json == 0
    # Strings are written raw, as nsqd's RespondV1 writes a Go string.
    reply = get("tcp_address")
    assert reply.body == b"127.0.0.1:0"
    assert "json" not in reply.headers.get("content-type", "")
    assert_error(request(nsqd, "GET", "/config/nope"), 400, "INVALID_OPTION")
    assert_error(request(nsqd, "GET", "/config/node_id"), 400, "INVALID_OPTION")


def test_config_put(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(max_msg_size=50)
    reply = request(server, "PUT", "/config/log_level", b"debug")
    assert (reply.status, reply.json) == (200, 1)
    assert request(server, "GET", "/config/log_level").json == 1
    assert server.opts.log_level == "debug"
    request(server, "PUT", "/config/log_level", b"INFO")
    assert request(server, "GET", "/config/log_level").json == 2
    reply = request(server, "PUT", "/config/nsqlookupd_tcp_addresses", b'["127.0.0.1:4160"]')
    assert (reply.status, reply.json) == (200, ["127.0.0.1:4160"])
    assert server.opts.lookupd_tcp_addresses == ["127.0.0.1:4160"]
    assert_error(request(server, "PUT", "/config/log_level", b"loud"), 400, "INVALID_VALUE")
    reply = request(server, "PUT", "/config/nsqlookupd_tcp_addresses", b"[1")
    assert_error(reply, 400, "INVALID_VALUE")
    reply = request(server, "PUT", "/config/nsqlookupd_tcp_addresses", b"[1]")
    assert_error(reply, 400, "INVALID_VALUE")
    assert_error(request(server, "PUT", "/config/log_level", b""), 413, "INVALID_VALUE")
    reply = request(server, "PUT", "/config/log_level", b"x" * 51)
    assert_error(reply, 413, "INVALID_VALUE")
    assert_error(request(server, "PUT", "/config/mem_queue_size", b"5"), 400, "INVALID_OPTION")
    assert server.opts.mem_queue_size == 10000


# -- /debug ---------------------------------------------------------------------------------


def test_debug_endpoints(nsqd: ServerThread) -> None:
    for path in (
        "/debug/pprof/",
        "/debug/pprof/cmdline",
        "/debug/pprof/symbol",
        "/debug/pprof/heap",
        "/debug/pprof/goroutine",
        "/debug/pprof/block",
        "/debug/pprof/threadcreate",
        "/debug/pprof/profile?seconds=0",
    ):
        reply = request(nsqd, "GET", path)
        assert reply.status == 200, path
    assert request(nsqd, "POST", "/debug/pprof/symbol").status == 200
    assert b"heap_objects" in request(nsqd, "GET", "/debug/pprof/heap").body
    assert b"asyncio tasks" in request(nsqd, "GET", "/debug/pprof/goroutine").body
    assert request(nsqd, "PUT", "/debug/setblockrate?rate=5").status == 200
    assert b"rate 5" in request(nsqd, "GET", "/debug/pprof/block").body
    reply = request(nsqd, "PUT", "/debug/setblockrate?rate=x")
    assert reply.status == 400
    assert reply.body.startswith(b"invalid block rate : ")
    assert request(nsqd, "POST", "/debug/freememory").status == 200
    assert_error(request(nsqd, "GET", "/debug/freememory"), 405, "METHOD_NOT_ALLOWED")


# -- the TCP path does not wait for HTTP ----------------------------------------------------


def test_slow_http_client_does_not_stall_tcp(nsqd: ServerThread) -> None:
    # One client sends half a request and stalls; another sends a body it never finishes.
    stalled = socket.create_connection(("127.0.0.1", nsqd.http_port))
    stalled.sendall(b"GET /stats HTTP/1.1\r\nHost: x\r\n")
    half_body = socket.create_connection(("127.0.0.1", nsqd.http_port))
    half_body.sendall(
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10
    )
    # A reader that never reads a large /stats answer.
    unread = socket.create_connection(("127.0.0.1", nsqd.http_port))
    unread.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    request(nsqd, "POST", "/mpub?topic=big", b"\n".join(b"m%d" % i for i in range(2000)))
    for _ in range(50):
        unread.sendall(b"GET /stats HTTP/1.1\r\nHost: x\r\n\r\n")
    try:
        with nsqd.connect() as pub, nsqd.connect() as sub:
            sub.sub("t", "c", rdy=100)
            for i in range(100):
                pub.pub("t", b"%d" % i)
            assert [m.body for m in sub.read_messages(100)] == [b"%d" % i for i in range(100)]
        assert request(nsqd, "GET", "/ping").body == b"OK"
    finally:
        for s in (stalled, half_body, unread):
            s.close()


def test_pub_expect_100_continue(nsqd: ServerThread) -> None:
    # curl sends "Expect: 100-continue" for large bodies and waits for the interim answer.
    with socket.create_connection(("127.0.0.1", nsqd.http_port), timeout=10) as sock:
        sock.sendall(
            b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n"
            b"Expect: 100-continue\r\n\r\n"
        )
        assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        sock.sendall(b"hello")
        data = b""
        while not data.endswith(b"OK"):
            data += sock.recv(1000)
        assert data.startswith(b"HTTP/1.1 200 OK")
    assert nsqd.call(lambda: nsqd.nsqd.topics["t"].message_count) == 1
