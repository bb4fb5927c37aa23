"""Transcript tests of the V2 TCP protocol over real sockets (nsqd 1.3.0's V2 protocol).

Each test reads like a session with nsqd: what a client sends, what it gets back. Fatal errors
are an error frame followed by the server closing the connection; E_FIN_FAILED, E_REQ_FAILED and
E_TOUCH_FAILED leave the connection working.
"""

from __future__ import annotations

import re
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest

from pynsqd.protocol import encode
from pynsqd.protocol.frames import (
    FRAME_TYPE_RESPONSE,
    Frame,
    Message,
)
from tests.conftest import ServerThread
from tests.wire import Conn

from ..waiting import wait_for

MakeNSQD = Callable[..., ServerThread]
ID = b"0123456789abcdef"  # well-formed, never issued


def L(n: int) -> bytes:
    return struct.pack(">l", n)


def identify_bytes(data: dict[str, Any]) -> bytes:
    return encode.identify(data)


def take(conn: Conn, n: int) -> list[Message]:
    """Read exactly ``n`` messages, FINning each, then check that no more arrive."""
    msgs = []
    for _ in range(n):
        m = conn.read_message()
        conn.fin(m.id)
        msgs.append(m)
    conn.expect_nothing()
    return msgs


def collect(conns: list[Conn], n: int) -> list[list[Message]]:
    """Read ``n`` messages in all from several consumers, FINning each; then no more arrive."""
    got: list[list[Message]] = [[] for _ in conns]
    deadline = time.monotonic() + 10
    for c in conns:
        c.sock.settimeout(0.02)
    try:
        while sum(map(len, got)) < n:
            if time.monotonic() >= deadline:
                pytest.fail(f"only {sum(map(len, got))} of {n} messages")
            for c, out in zip(conns, got, strict=True):
                try:
                    m = c.read_message()
                except TimeoutError:
                    continue
                c.fin(m.id)
                out.append(m)
    finally:
        for c in conns:
            c.sock.settimeout(5)
    for c in conns:
        c.expect_nothing()
    return got


def drain(conn: Conn, *, quiet: float = 0.6) -> list[Message]:
    """Read messages, FINning each, until none arrives for ``quiet`` seconds (for unknown counts;
    ``quiet`` is well above the default 250 ms output_buffer_timeout)."""
    out = []
    conn.sock.settimeout(quiet)
    try:
        while True:
            try:
                m = conn.read_message()
            except TimeoutError:
                return out
            out.append(m)
            conn.fin(m.id)
    finally:
        conn.sock.settimeout(5)


@pytest.fixture
def limited(make_nsqd: MakeNSQD) -> ServerThread:
    """Small limits so that size errors are cheap to provoke."""
    return make_nsqd(max_msg_size=100, max_body_size=1000, max_rdy_count=50)


# -- connection set-up --------------------------------------------------------------------


def test_bad_magic_closes(nsqd: ServerThread) -> None:
    with Conn(nsqd.tcp_address, magic=b"  V1") as c:
        c.expect_fatal(b"E_BAD_PROTOCOL")
    with Conn(nsqd.tcp_address, magic=b"GET / HTTP/1.1\r\n") as c:
        c.expect_fatal(b"E_BAD_PROTOCOL")


def test_magic_split_across_packets(nsqd: ServerThread) -> None:
    with Conn(nsqd.tcp_address, magic=b"") as c:
        for b in b"  V2":
            c.send(bytes([b]))
            time.sleep(0.01)
        c.pub("t", b"x")


# -- fatal errors, every one -------------------------------------------------------

_IN_INIT: list[tuple[bytes, bytes]] = [
    (b"FOO\n", b"E_INVALID invalid command FOO"),
    (b"pub t\n", b"E_INVALID invalid command pub"),
    # IDENTIFY
    (b"IDENTIFY\n" + L(1001), b"E_BAD_BODY IDENTIFY body too big 1001 > 1000"),
    (b"IDENTIFY\n" + L(0), b"E_BAD_BODY IDENTIFY invalid body size 0"),
    (b"IDENTIFY\n" + L(-1), b"E_BAD_BODY IDENTIFY invalid body size -1"),
    (b"IDENTIFY\n" + L(3) + b"{x}", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (
        identify_bytes({"heartbeat_interval": 300001}),
        b"E_BAD_BODY IDENTIFY heartbeat interval (300001) is invalid",
    ),
    (
        identify_bytes({"heartbeat_interval": 999}),
        b"E_BAD_BODY IDENTIFY heartbeat interval (999) is invalid",
    ),
    (
        identify_bytes({"output_buffer_size": 63}),
        b"E_BAD_BODY IDENTIFY output buffer size (63) is invalid",
    ),
    (
        identify_bytes({"output_buffer_size": 65537}),
        b"E_BAD_BODY IDENTIFY output buffer size (65537) is invalid",
    ),
    (
        identify_bytes({"output_buffer_timeout": 24}),
        b"E_BAD_BODY IDENTIFY output buffer timeout (24) is invalid",
    ),
    (identify_bytes({"sample_rate": 100}), b"E_BAD_BODY IDENTIFY sample rate (100) is invalid"),
    (identify_bytes({"sample_rate": -1}), b"E_BAD_BODY IDENTIFY sample rate (-1) is invalid"),
    (identify_bytes({"msg_timeout": 999}), b"E_BAD_BODY IDENTIFY msg timeout (999) is invalid"),
    (
        identify_bytes({"msg_timeout": 900001}),
        b"E_BAD_BODY IDENTIFY msg timeout (900001) is invalid",
    ),
    (
        identify_bytes({"feature_negotiation": True, "deflate": True, "snappy": True}),
        b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression",
    ),
    # AUTH
    (b"AUTH\n" + L(3) + b"abc", b"E_AUTH_DISABLED AUTH disabled"),
    (b"AUTH x\n", b"E_INVALID AUTH invalid number of parameters"),
    (b"AUTH\n" + L(1001), b"E_BAD_BODY AUTH body too big 1001 > 1000"),
    (b"AUTH\n" + L(0), b"E_BAD_BODY AUTH invalid body size 0"),
    # SUB
    (b"SUB t\n", b"E_INVALID SUB insufficient number of parameters"),
    (b"SUB\n", b"E_INVALID SUB insufficient number of parameters"),
    (b"SUB a*b c\n", b'E_BAD_TOPIC SUB topic name "a*b" is not valid'),
    (
        b"SUB " + b"a" * 65 + b" c\n",
        b'E_BAD_TOPIC SUB topic name "' + b"a" * 65 + b'" is not valid',
    ),
    (b"SUB t c*d\n", b'E_BAD_CHANNEL SUB channel name "c*d" is not valid'),
    (b"SUB t  c\n", b'E_BAD_CHANNEL SUB channel name "" is not valid'),
    # subscriber-only commands before SUB
    (b"RDY 1\n", b"E_INVALID cannot RDY in current state"),
    (b"FIN " + ID + b"\n", b"E_INVALID cannot FIN in current state"),
    (b"REQ " + ID + b" 0\n", b"E_INVALID cannot REQ in current state"),
    (b"TOUCH " + ID + b"\n", b"E_INVALID cannot TOUCH in current state"),
    (b"CLS\n", b"E_INVALID cannot CLS in current state"),
    # PUB
    (b"PUB\n", b"E_INVALID PUB insufficient number of parameters"),
    (b"PUB a*b\n", b'E_BAD_TOPIC PUB topic name "a*b" is not valid'),
    (b"PUB t\n" + L(0), b"E_BAD_MESSAGE PUB invalid message body size 0"),
    (b"PUB t\n" + L(-5), b"E_BAD_MESSAGE PUB invalid message body size -5"),
    (b"PUB t\n" + L(101), b"E_BAD_MESSAGE PUB message too big 101 > 100"),
    # MPUB
    (b"MPUB\n", b"E_INVALID MPUB insufficient number of parameters"),
    (b"MPUB a*b\n", b'E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "a*b" is not valid'),
    (b"MPUB t\n" + L(0), b"E_BAD_BODY MPUB invalid body size 0"),
    (b"MPUB t\n" + L(1001), b"E_BAD_BODY MPUB body too big 1001 > 1000"),
    (b"MPUB t\n" + L(4) + L(0), b"E_BAD_BODY MPUB invalid message count 0"),
    (b"MPUB t\n" + L(4) + L(200), b"E_BAD_BODY MPUB invalid message count 200"),
    (b"MPUB t\n" + L(3) + b"abc", b"E_BAD_BODY MPUB failed to read message count"),
    (b"MPUB t\n" + L(8) + L(1) + L(0), b"E_BAD_MESSAGE MPUB invalid message(0) body size 0"),
    (b"MPUB t\n" + L(8) + L(1) + L(101), b"E_BAD_MESSAGE MPUB message too big 101 > 100"),
    # DPUB
    (b"DPUB t\n", b"E_INVALID DPUB insufficient number of parameters"),
    (b"DPUB a*b 0\n", b'E_BAD_TOPIC DPUB topic name "a*b" is not valid'),
    (b"DPUB t x\n", b"E_INVALID DPUB could not parse timeout x"),
    (b"DPUB t -1\n", b"E_INVALID DPUB could not parse timeout -1"),
    (b"DPUB t 3600001\n", b"E_INVALID DPUB timeout 3600001 out of range 0-3600000"),
    (b"DPUB t 0\n" + L(0), b"E_BAD_MESSAGE DPUB invalid message body size 0"),
    (b"DPUB t 10\n" + L(101), b"E_BAD_MESSAGE DPUB message too big 101 > 100"),
]


@pytest.mark.parametrize(("data", "error"), _IN_INIT, ids=[e.decode() for _, e in _IN_INIT])
def test_fatal_errors_before_sub(limited: ServerThread, data: bytes, error: bytes) -> None:
    with limited.connect() as c:
        c.send(data)
        c.expect_fatal(error)
    # Only that connection is gone.
    with limited.connect() as other:
        other.pub("ok", b"still serving")


_WHEN_SUBSCRIBED: list[tuple[bytes, bytes]] = [
    (identify_bytes({}), b"E_INVALID cannot IDENTIFY in current state"),
    (b"AUTH\n" + L(3) + b"abc", b"E_INVALID cannot AUTH in current state"),
    (b"SUB t c\n", b"E_INVALID cannot SUB in current state"),
    (b"RDY x\n", b"E_INVALID RDY could not parse count x"),
    (b"RDY -1\n", b"E_INVALID RDY could not parse count -1"),
    (b"RDY 51\n", b"E_INVALID RDY count 51 out of range 0-50"),
    (b"FIN\n", b"E_INVALID FIN insufficient number of params"),
    (b"FIN abc\n", b"E_INVALID invalid message ID"),
    (b"FIN " + ID + b"0\n", b"E_INVALID invalid message ID"),
    (b"REQ " + ID + b"\n", b"E_INVALID REQ insufficient number of params"),
    (b"REQ abc 0\n", b"E_INVALID invalid message ID"),
    (b"REQ " + ID + b" x\n", b"E_INVALID REQ could not parse timeout x"),
    (b"TOUCH\n", b"E_INVALID TOUCH insufficient number of params"),
    (b"TOUCH abc\n", b"E_INVALID invalid message ID"),
]


@pytest.mark.parametrize(
    ("data", "error"), _WHEN_SUBSCRIBED, ids=[e.decode() for _, e in _WHEN_SUBSCRIBED]
)
def test_fatal_errors_when_subscribed(limited: ServerThread, data: bytes, error: bytes) -> None:
    with limited.connect() as c:
        c.sub("t", "c")
        c.send(data)
        c.expect_fatal(error)


def test_errors_when_closing(nsqd: ServerThread) -> None:
    with nsqd.connect() as c:
        c.sub("t", "c")
        c.cls()
        c.send(b"CLS\n")
        c.expect_fatal(b"E_INVALID cannot CLS in current state")
    with nsqd.connect() as c:
        c.sub("t", "c")
        c.cls()
        c.send(b"SUB t c\n")
        c.expect_fatal(b"E_INVALID cannot SUB in current state")


def test_command_line_too_long_is_refused_with_a_reason(nsqd: ServerThread) -> None:
    with nsqd.connect() as c:
        c.send(b"PUB " + b"t" * 20000)
        err = c.read_error()
        assert err.startswith(b"E_INVALID "), err
        c.expect_closed()


def test_malformed_mpub_creates_no_topic(limited: ServerThread) -> None:
    # The whole command is validated before anything is created: a bad second message means
    # no topic and no first message.
    with limited.connect() as c:
        c.send(b"MPUB fresh\n" + L(13) + L(2) + L(1) + b"a" + L(0))
        assert c.read_error() == b"E_BAD_MESSAGE MPUB invalid message(1) body size 0"
        c.expect_closed()
    assert not limited.call(lambda: "fresh" in limited.nsqd.topics)


def test_rdy_range(make_nsqd: MakeNSQD) -> None:
    s = make_nsqd(max_rdy_count=50)
    with s.connect() as c:
        c.sub("t", "c", rdy=50)
        c.rdy(0)
        c.send(b"NOP\n")
        c.expect_nothing()
        c.rdy(51)
        c.expect_fatal(b"E_INVALID RDY count 51 out of range 0-50")


def test_rdy_without_count_is_one(nsqd: ServerThread) -> None:
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.sub("t", "c")
        sub.send(b"RDY\n")
        pub.mpub("t", [b"a", b"b"])
        m = sub.read_message()
        sub.expect_nothing()
        sub.fin(m.id)
        assert sub.read_message().body == b"b"


# -- IDENTIFY ----------------------------------------------------------------------------

_IDENTIFY_KEYS = {
    "max_rdy_count",
    "version",
    "max_msg_timeout",
    "msg_timeout",
    "tls_v1",
    "deflate",
    "deflate_level",
    "max_deflate_level",
    "snappy",
    "sample_rate",
    "auth_required",
    "output_buffer_size",
    "output_buffer_timeout",
}


def test_identify_feature_negotiation_defaults(nsqd: ServerThread) -> None:
    with nsqd.connect() as c:
        resp = c.identify({"feature_negotiation": True})
        assert isinstance(resp, dict)
        assert set(resp) == _IDENTIFY_KEYS
        assert resp == {
            "max_rdy_count": 2500,
            "version": "1.3.0",
            "max_msg_timeout": 900000,
            "msg_timeout": 60000,
            "tls_v1": False,
            "deflate": False,
            "deflate_level": 6,
            "max_deflate_level": 6,
            "snappy": False,
            "sample_rate": 0,
            "auth_required": False,
            "output_buffer_size": 16384,
            "output_buffer_timeout": 250,
        }


def test_identify_feature_negotiation_values(make_nsqd: MakeNSQD) -> None:
    s = make_nsqd(max_rdy_count=50, msg_timeout=5.0, max_msg_timeout=120.0, max_deflate_level=4)
    with s.connect() as c:
        resp = c.identify(
            {
                "feature_negotiation": True,
                "client_id": "test",
                "hostname": "host",
                "user_agent": "pynsqd-tests/1",
                "heartbeat_interval": 1000,
                "msg_timeout": 2000,
                "sample_rate": 42,
                "output_buffer_size": 1024,
                "output_buffer_timeout": 100,
                "tls_v1": True,  # asked, but no TLS is configured
                "deflate_level": 9,  # without deflate: nsqd reports 6, capped
                "unknown_key": [1, 2, 3],
            }
        )
        assert isinstance(resp, dict)
        assert set(resp) == _IDENTIFY_KEYS
        assert resp["max_rdy_count"] == 50
        assert resp["version"] == "1.3.0"
        assert resp["max_msg_timeout"] == 120000
        assert resp["msg_timeout"] == 2000
        assert resp["sample_rate"] == 42
        assert resp["output_buffer_size"] == 1024
        assert resp["output_buffer_timeout"] == 100
        assert resp["max_deflate_level"] == 4
        assert resp["deflate_level"] == 4  # 6 capped at --max-deflate-level
        assert resp["tls_v1"] is False
        assert resp["snappy"] is False and resp["deflate"] is False
        assert resp["auth_required"] is False
        c.pub("t", b"works")
    with s.connect() as c:
        # msg_timeout 0 means the server's --msg-timeout; output_buffer_size -1 means no buffering.
        resp = c.identify({"feature_negotiation": True, "msg_timeout": 0, "output_buffer_size": -1})
        assert isinstance(resp, dict)
        assert resp["msg_timeout"] == 5000
        assert resp["output_buffer_size"] == 1
        assert resp["output_buffer_timeout"] == 0


def test_identify_without_negotiation_is_plain_ok(nsqd: ServerThread) -> None:
    with nsqd.connect() as c:
        assert c.identify({"client_id": "x"}) == b"OK"
        assert c.identify({"feature_negotiation": False}) == b"OK"  # repeated: allowed
        c.sub("t", "c")


def test_identify_then_commands_in_the_same_packet(nsqd: ServerThread) -> None:
    with nsqd.connect() as c:
        c.send(encode.identify({"feature_negotiation": True}) + encode.pub("t", b"x") + b"NOP\n")
        assert c.read_response().startswith(b"{")
        assert c.read_response() == b"OK"
        c.expect_nothing()


def test_auth_disabled(nsqd: ServerThread) -> None:
    with nsqd.connect() as c:
        c.identify({})
        c.auth(b"secret")
        c.expect_fatal(b"E_AUTH_DISABLED AUTH disabled")


def test_nop_in_every_state(nsqd: ServerThread) -> None:
    with nsqd.connect() as c:
        c.nop()
        c.expect_nothing()
        c.sub("t", "c")
        c.nop()
        c.expect_nothing()
        c.cls()
        c.nop()
        c.expect_nothing()


def test_subscriber_may_publish(nsqd: ServerThread) -> None:
    with nsqd.connect() as c:
        c.sub("t", "c", rdy=1)
        c.send(encode.pub("t", b"self"))
        frames = [c.read_frame(), c.read_frame()]
        assert Frame(FRAME_TYPE_RESPONSE, b"OK") in frames
        c.send(encode.dpub("t", 0, b"d") + encode.mpub("t", [b"m"]))
        assert c.read_response() == b"OK"


# -- heartbeats --------------------------------------------------------------------------


def test_heartbeats_disabled(nsqd: ServerThread) -> None:
    with nsqd.connect() as c:
        c.identify({"heartbeat_interval": -1})
        c.pub("t", b"a producer needs no heartbeats")
        c.send(b"SUB t c\n")
        c.expect_fatal(b"E_INVALID cannot SUB with heartbeats disabled")


# -- output buffering --------------------------------------------------------------------


def test_output_buffer_flushes_when_not_ready_or_full(nsqd: ServerThread) -> None:
    # The timeout is 30 s, far beyond the read timeout: whatever arrives was flushed by a rule.
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.identify({"output_buffer_timeout": 30000})
        sub.sub("t", "c", rdy=1)
        pub.pub("t", b"rdy reached")
        assert sub.read_message().body == b"rdy reached"
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.identify({"output_buffer_timeout": 30000, "output_buffer_size": 64})
        sub.sub("t", "c2", rdy=100)
        pub.pub("t", b"x" * 100)
        assert sub.read_message().body == b"x" * 100
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.identify({"output_buffer_size": -1})
        sub.sub("t", "c3", rdy=100)
        pub.pub("t", b"unbuffered")
        assert sub.read_message().body == b"unbuffered"


# -- RDY, FIN, timeouts, TOUCH, REQ ------------------------------------------------------


def test_rdy_is_a_window(nsqd: ServerThread) -> None:
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.sub("t", "c", rdy=2)
        pub.mpub("t", [b"%d" % i for i in range(5)])
        first = sub.read_messages(2)
        sub.expect_nothing(0.3)
        sub.fin(first[0].id)
        third = sub.read_message()
        sub.expect_nothing(0.3)
        sub.rdy(0)
        sub.fin(first[1].id)
        sub.fin(third.id)
        sub.expect_nothing(0.3)  # RDY 0: nothing more, even with nothing in flight
        sub.rdy(5)
        rest = sub.read_messages(2)
        assert sorted(m.body for m in [*first, third, *rest]) == [b"%d" % i for i in range(5)]
        assert all(m.attempts == 1 for m in [*first, third, *rest])


def test_fin_failures_are_not_fatal(nsqd: ServerThread) -> None:
    with nsqd.connect() as pub, nsqd.connect() as a, nsqd.connect() as b:
        a.sub("t", "c", rdy=1)
        b.sub("t", "c", rdy=0)
        pub.pub("t", b"mine")
        m = a.read_message()
        b.fin(m.id)
        assert b.read_error() == b"E_FIN_FAILED FIN %s failed client does not own message" % m.id
        b.req(m.id, 0)
        assert b.read_error() == b"E_REQ_FAILED REQ %s failed client does not own message" % m.id
        b.touch(m.id)
        assert b.read_error() == (
            b"E_TOUCH_FAILED TOUCH %s failed client does not own message" % m.id
        )
        a.fin(ID)
        assert a.read_error() == b"E_FIN_FAILED FIN %s failed ID not in flight" % ID
        a.req(ID, 0)
        assert a.read_error() == b"E_REQ_FAILED REQ %s failed ID not in flight" % ID
        a.touch(ID)
        assert a.read_error() == b"E_TOUCH_FAILED TOUCH %s failed ID not in flight" % ID
        # Both connections go on.
        a.fin(m.id)
        a.fin(m.id)  # twice: no longer in flight
        assert a.read_error() == b"E_FIN_FAILED FIN %s failed ID not in flight" % m.id
        b.rdy(1)
        pub.pub("t", b"next")
        got = collect([a, b], 1)
        assert [x.body for x in got[0] + got[1]] == [b"next"]


def test_pipelined_fins(nsqd: ServerThread) -> None:
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.sub("t", "c", rdy=10)
        pub.mpub("t", [b"%d" % i for i in range(10)])
        msgs = sub.read_messages(10)
        # One packet: FINs with a bad one in the middle; the good ones after it still count.
        sub.send(b"".join(b"FIN " + m.id + b"\n" for m in msgs[:5]) + b"FIN " + ID + b"\r\n")
        assert sub.read_error() == b"E_FIN_FAILED FIN %s failed ID not in flight" % ID
        sub.send(b"".join(b"FIN " + m.id + b"\r\n" for m in msgs[5:]))
        sub.expect_nothing()
        ch = nsqd.call(lambda: nsqd.nsqd.topics["t"].channels["c"])
        assert nsqd.call(lambda: len(ch.in_flight)) == 0


def test_req_zero_redelivers_at_once(nsqd: ServerThread) -> None:
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.sub("t", "c", rdy=1)
        pub.pub("t", b"again")
        m = sub.read_message()
        sub.req(m.id, 0)
        m2 = sub.read_message()
        assert (m2.id, m2.attempts) == (m.id, 2)
        sub.fin(m2.id)
        sub.expect_nothing()
        ch = nsqd.call(lambda: nsqd.nsqd.topics["t"].channels["c"])
        assert nsqd.call(lambda: ch.requeue_count) == 1


def test_req_timeout_is_clamped(make_nsqd: MakeNSQD) -> None:
    s = make_nsqd(max_req_timeout=1.0)
    with s.connect() as pub, s.connect() as sub:
        sub.sub("t", "c", rdy=1)
        pub.pub("t", b"clamped")
        m = sub.read_message()
        sub.req(m.id, 3_600_000)  # an hour asked; 1 s given, and no error
        m2 = sub.read_message()
        assert (m2.id, m2.attempts) == (m.id, 2)


# -- DPUB --------------------------------------------------------------------------------


def test_dpub_is_delivered_after_its_delay(nsqd: ServerThread) -> None:
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.sub("t", "c", rdy=10)
        pub.dpub("t", 1000, b"deferred")
        pub.pub("t", b"plain")
        assert sub.read_message().body == b"plain"
        sub.expect_nothing(0.5)
        m = sub.read_message()
        assert (m.body, m.attempts) == (b"deferred", 1)
        pub.dpub("t", 0, b"zero delay")
        assert sub.read_message().body == b"zero delay"


def test_dpub_out_of_range_is_fatal(make_nsqd: MakeNSQD) -> None:
    s = make_nsqd(max_req_timeout=1.0)
    with s.connect() as c:
        c.dpub("t", 1000, b"at the limit")
        c.send(encode.dpub("t", 1001, b"x"))
        c.expect_fatal(b"E_INVALID DPUB timeout 1001 out of range 0-1000")


# -- topics and channels -----------------------------------------------------------------


def test_consumers_on_one_channel_compete(nsqd: ServerThread) -> None:
    with nsqd.connect() as pub, nsqd.connect() as a, nsqd.connect() as b:
        a.sub("t", "c", rdy=100)
        b.sub("t", "c", rdy=100)
        bodies = [b"%d" % i for i in range(50)]
        pub.mpub("t", bodies)
        got_a, got_b = collect([a, b], 50)
        assert got_a and got_b
        assert sorted(m.body for m in got_a + got_b) == sorted(bodies)


def test_channels_each_get_every_message(nsqd: ServerThread) -> None:
    with nsqd.connect() as pub, nsqd.connect() as a, nsqd.connect() as b:
        a.sub("t", "c1", rdy=100)
        b.sub("t", "c2", rdy=100)
        bodies = [b"%d" % i for i in range(20)]
        pub.mpub("t", bodies[:10])
        for x in bodies[10:]:
            pub.pub("t", x)
        ma, mb = take(a, 20), take(b, 20)
        assert sorted(m.body for m in ma) == sorted(bodies)
        assert sorted(m.body for m in mb) == sorted(bodies)
        assert {m.id for m in ma} == {m.id for m in mb}  # every copy has the same ID


def test_topic_without_channels_keeps_messages(nsqd: ServerThread) -> None:
    with nsqd.connect() as pub:
        pub.pub("t", b"early")
        pub.mpub("t", [b"a", b"b"])
    assert nsqd.call(lambda: nsqd.nsqd.topics["t"].depth) == 3
    with nsqd.connect() as sub:
        sub.sub("t", "c", rdy=10)
        assert sorted(m.body for m in take(sub, 3)) == [b"a", b"b", b"early"]
    with nsqd.connect() as sub:
        sub.sub("t", "late", rdy=10)  # a channel created later sees only what follows
        sub.expect_nothing()


def test_ephemeral_channel_and_topic_are_deleted(nsqd: ServerThread) -> None:
    topics = nsqd.nsqd.topics
    with nsqd.connect() as a, nsqd.connect() as b:
        a.sub("t#ephemeral", "c#ephemeral")
        b.sub("t#ephemeral", "c#ephemeral")
        a.close()
        # once the server has seen a leave, the channel still has b: it stays
        wait_for(
            lambda: (
                nsqd.call(lambda: len(topics["t#ephemeral"].channels["c#ephemeral"].clients)) == 1
            )
        )
    wait_for(lambda: nsqd.call(lambda: "t#ephemeral" not in topics))
    # An ephemeral channel of a durable topic goes; the topic stays.
    with nsqd.connect() as c:
        c.sub("durable", "tail#ephemeral")
    wait_for(lambda: nsqd.call(lambda: "tail#ephemeral" not in topics["durable"].channels))
    assert nsqd.call(lambda: "durable" in topics)
    # A durable channel stays when its consumer leaves.
    with nsqd.connect() as c:
        c.sub("durable", "kept")
    wait_for(lambda: nsqd.call(lambda: not nsqd.nsqd.clients))  # the server saw it leave
    assert nsqd.call(lambda: "kept" in topics["durable"].channels)


def test_ephemeral_topic_without_channels_is_kept(nsqd: ServerThread) -> None:
    with nsqd.connect() as c:
        c.pub("e#ephemeral", b"x")  # its OK means the topic holds it
    assert nsqd.call(lambda: nsqd.nsqd.topics["e#ephemeral"].depth) == 1


def test_max_channel_consumers(make_nsqd: MakeNSQD) -> None:
    s = make_nsqd(max_channel_consumers=1)
    with s.connect() as a, s.connect() as b, s.connect() as other:
        a.sub("t", "c")
        b.send(b"SUB t c\n")
        b.expect_fatal(b"E_SUB_FAILED SUB failed consumers for t:c exceeds limit of 1")
        other.sub("t", "c2")  # the limit is per channel
    wait_for(lambda: s.call(lambda: not s.nsqd.topics["t"].channels["c"].clients))
    with s.connect() as c:
        c.sub("t", "c")  # a's place is free again


def test_sample_rate_is_roughly_honoured(nsqd: ServerThread) -> None:
    n = 1000
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.identify({"sample_rate": 50})
        sub.sub("t", "c", rdy=2500)
        pub.mpub("t", [b"%d" % i for i in range(n)])
        got = drain(sub)
        # About 51% (rand < 100 kept when <= 50); unsampled ones are dropped, not requeued.
        assert 0.35 * n < len(got) < 0.67 * n
        assert len({m.id for m in got}) == len(got)
        ch = nsqd.call(lambda: nsqd.nsqd.topics["t"].channels["c"])
        assert nsqd.call(lambda: (ch.depth, len(ch.in_flight))) == (0, 0)


def test_cls_then_close_wait(nsqd: ServerThread) -> None:
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.sub("t", "c", rdy=1)
        pub.mpub("t", [b"1", b"2"])
        m = sub.read_message()
        sub.cls()
        sub.rdy(10)  # ignored while closing, no reply
        sub.expect_nothing(0.3)
        sub.fin(m.id)  # still allowed
        sub.expect_nothing(0.3)  # and no new delivery: RDY is 0
        ch = nsqd.call(lambda: nsqd.nsqd.topics["t"].channels["c"])
        assert nsqd.call(lambda: (len(ch.in_flight), ch.depth)) == (0, 1)
        sub.pub("t", b"a closing client may publish")
    with nsqd.connect() as other:
        other.sub("t", "c", rdy=10)
        assert [x.body for x in take(other, 2)] == [b"2", b"a closing client may publish"]


def test_disconnect_requeues_in_flight_at_once(nsqd: ServerThread) -> None:
    # msg_timeout is the default 60 s: whatever the second consumer gets came back on close.
    with nsqd.connect() as pub, nsqd.connect() as waiting:
        waiting.sub("t", "c", rdy=0)
        gone = nsqd.connect()
        gone.sub("t", "c", rdy=10)
        pub.mpub("t", [b"a", b"b", b"c"])
        taken = gone.read_messages(3)
        gone.fin(taken[0].id)
        gone.close()
        waiting.rdy(10)
        back = take(waiting, 2)
        assert sorted((m.body, m.attempts) for m in back) == [(b"b", 2), (b"c", 2)]
        ch = nsqd.call(lambda: nsqd.nsqd.topics["t"].channels["c"])
        assert nsqd.call(lambda: ch.timeout_count) == 0


def test_message_ids_are_lowercase_hex_and_unique(nsqd: ServerThread) -> None:
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.sub("t", "c", rdy=2500)
        before = time.time_ns()
        for _ in range(5):
            pub.mpub("t", [b"x"] * 200)
        for _ in range(20):
            pub.pub("t", b"y")
        after = time.time_ns()
        msgs = take(sub, 1020)
        assert all(before <= m.timestamp <= after for m in msgs)  # publish time, in ns
        ids = [m.id for m in msgs]
        assert all(re.fullmatch(rb"[0-9a-f]{16}", i) for i in ids)
        assert len(set(ids)) == len(ids)


def test_pub_to_many_topics(nsqd: ServerThread) -> None:
    names = [f"topic_{i}" for i in range(30)]
    subs = [nsqd.connect() for _ in names]
    try:
        for sub, name in zip(subs, names, strict=True):
            sub.identify({"output_buffer_size": -1})
            sub.sub(name, "c", rdy=10)
        with nsqd.connect() as pub:
            for name in names:
                pub.pub(name, name.encode())
            for name in names:
                pub.mpub(name, [name.encode() + b"-m"])
        for sub, name in zip(subs, names, strict=True):
            assert [m.body for m in sub.read_messages(2)] == [name.encode(), name.encode() + b"-m"]

        def delivered_once() -> bool:  # every channel: two in flight and nothing left to send
            chans = [nsqd.nsqd.topics[n].channels["c"] for n in names]
            return all(len(ch.in_flight) == 2 and ch.depth == 0 for ch in chans)

        assert nsqd.call(delivered_once)  # so no duplicate can still be on its way
        for sub in subs:
            sub.expect_nothing(0.01)
    finally:
        for sub in subs:
            sub.close()


def test_big_message_round_trip(nsqd: ServerThread) -> None:
    big = bytes(range(256)) * 4096  # exactly --max-msg-size
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.sub("t", "c", rdy=10)
        pub.pub("t", big)
        pub.mpub("t", [big, b"small"])
        assert [m.body for m in take(sub, 3)] == [big, big, b"small"]


# -- bad clients never hurt others --------------------------------------------------------


def test_bad_clients_do_not_affect_others(nsqd: ServerThread) -> None:
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.sub("t", "c", rdy=100)
        # A client stalled in the middle of a body...
        stalled = nsqd.connect()
        stalled.send(b"PUB t\n" + L(100) + b"only ten b")
        # ...one sending garbage...
        with Conn(nsqd.tcp_address, magic=b"") as garbage:
            garbage.send(bytes(range(256)) * 10)
            assert garbage.read_error() == b"E_BAD_PROTOCOL"
            garbage.expect_closed()
        with nsqd.connect() as garbage2:
            garbage2.send(b"\x00\xff\r\n" * 10)
            assert garbage2.read_error().startswith(b"E_INVALID invalid command ")
            garbage2.expect_closed()
        # ...and one announcing a huge body.
        with nsqd.connect() as huge:
            huge.send(b"PUB t\n" + L(2**31 - 1))
            assert huge.read_error() == b"E_BAD_MESSAGE PUB message too big 2147483647 > 1048576"
            huge.expect_closed()
        with nsqd.connect() as huge:
            huge.send(b"MPUB t\n" + L(2**31 - 1))
            assert huge.read_error() == b"E_BAD_BODY MPUB body too big 2147483647 > 5242880"
            huge.expect_closed()
        pub.mpub("t", [b"%d" % i for i in range(50)])
        pub.pub("t", b"last")
        assert len(take(sub, 51)) == 51
        # The stalled client is still waiting, its connection intact; it vanishes mid-body.
        stalled.expect_nothing(0.1)
        stalled.close()
        pub.pub("t", b"after")
        assert [m.body for m in take(sub, 1)] == [b"after"]  # the half-sent PUB never arrives


def test_a_client_vanishing_mid_body_loses_nothing_for_others(nsqd: ServerThread) -> None:
    bodies = [b"%d" % i for i in range(100)]
    with nsqd.connect() as sub:
        sub.sub("t", "c", rdy=1000)
        for i in range(10):
            c = nsqd.connect()
            c.mpub("t", bodies[i * 10 : i * 10 + 10])
            c.send(encode.mpub("t", [b"x" * 50] * 5)[: 30 + i * 7])  # cut anywhere
            c.sock.shutdown(socket.SHUT_RDWR)
            c.close()
        assert sorted(m.body for m in take(sub, 100)) == sorted(bodies)


def test_a_consumer_that_stops_reading_blocks_nobody(nsqd: ServerThread) -> None:
    body = b"z" * 50_000
    bodies = [b"%04d" % i + body for i in range(200)]  # 10 MB, beyond the write buffer limit
    with nsqd.connect() as pub, nsqd.connect() as reader:
        stuck = nsqd.connect()
        stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        stuck.sub("t", "c1", rdy=2500)  # and then never reads
        reader.sub("t", "c2", rdy=2500)
        for i in range(0, 200, 20):
            pub.mpub("t", bodies[i : i + 20])  # each OK arrives: publishing is never blocked
        assert sorted(m.body for m in take(reader, 200)) == bodies
        # The stuck consumer leaves: all it was sent but never FINned goes to the next one.
        stuck.close()
        with nsqd.connect() as next_one:
            next_one.sub("t", "c1", rdy=2500)
            got = take(next_one, 200)
            assert sorted(m.body for m in got) == bodies


def test_deferred_messages_are_never_early(nsqd: ServerThread) -> None:
    """40 DPUBs of 300 ms, one at a time, to a subscribed consumer: none arrives before its due
    time by the wall clock (how soon after it is latency: ``scripts/bench --mode latency``).
    Waits only on blocking reads."""
    n, defer_ms = 40, 300
    with nsqd.connect(client_id="c") as cons, nsqd.connect() as pub:
        cons.sub("t", "c", rdy=100)
        for i in range(n):
            pub.dpub("t", defer_ms, b"m%d" % i)  # waits for the OK
        late_ms = []
        for _ in range(n):
            m = cons.read_message()
            late_ms.append((time.time_ns() - m.timestamp) / 1e6 - defer_ms)
            cons.fin(m.id)
    assert min(late_ms) >= 0, sorted(late_ms)[:5]
