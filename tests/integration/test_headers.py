"""Message headers (``protocol/headers.py``) over real sockets and files: negotiated in
IDENTIFY, kept through memory, the disk queues, requeue, deferral, dead-lettering, a restart
and the retained log; a client that did not ask sees nsqd's messages exactly."""

from __future__ import annotations

import http.client
import json
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pynsqd.client import ClientOptions, Connection, NsqConnectionError, NsqError
from pynsqd.protocol import encode, headers
from pynsqd.protocol.frames import FRAME_TYPE_MESSAGE

from ..conftest import ServerThread, http_request
from ..processes import NsqdProcess
from ..wire import Conn
from .servers import read_log, tool

pytestmark = pytest.mark.integration

NEGOTIATE = {"feature_negotiation": True, "headers": True}
_LEN = struct.Struct(">H")


def with_headers(body: bytes, **pairs: str) -> bytes:
    """A negotiated client's body: its header block, then the body."""
    block = headers.encode(
        [(k.replace("_", "-"), v.encode("utf-8", "surrogateescape")) for k, v in pairs.items()]
    )
    return headers.join_body(block, body)


def read_with_headers(conn: Conn) -> tuple[bytes, int, dict[str, bytes], bytes]:
    """A negotiated consumer's next message: (id, attempts, headers, body)."""
    frame = conn.read_frame()
    assert frame.frame_type == FRAME_TYPE_MESSAGE, frame
    data = frame.data
    attempts = struct.unpack_from(">H", data, 8)[0]
    (size,) = _LEN.unpack_from(data, 26)
    return data[10:26], attempts, dict(headers.decode(data[28 : 28 + size])), data[28 + size :]


def negotiated(server: ServerThread) -> tuple[Conn, dict[str, Any]]:
    conn = server.connect()
    reply = conn.identify(NEGOTIATE)
    assert isinstance(reply, dict)
    return conn, reply


def test_headers_are_negotiated_and_a_client_that_does_not_ask_sees_nsqd(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    server = make_nsqd()
    conn, reply = negotiated(server)
    assert reply["headers"] is True
    assert (reply["max_headers"], reply["max_header_bytes"]) == (16, 4096)
    conn.close()
    with server.connect() as plain:
        answer = plain.identify({"feature_negotiation": True})
        assert isinstance(answer, dict) and "headers" not in answer  # nsqd's answer
    (tmp_path / "off").mkdir()
    off = make_nsqd(max_headers=0, data_path=str(tmp_path / "off"))
    with off.connect() as c:
        answer = c.identify(NEGOTIATE)
        assert isinstance(answer, dict) and answer["headers"] is False
        c.pub("t", b"\x00\x05hello")  # not negotiated: the body is the body, as sent
        c.sub("t", "c", rdy=1)
        assert c.read_message().body == b"\x00\x05hello"


@pytest.mark.parametrize("mem_queue_size", [10_000, 0], ids=["memory", "disk"])
def test_headers_ride_with_their_messages_and_plain_consumers_get_plain_bodies(
    make_nsqd: Callable[..., ServerThread], mem_queue_size: int
) -> None:
    server = make_nsqd(mem_queue_size=mem_queue_size)
    with server.connect() as plain:
        plain.sub("t", "plain", rdy=10)
        consumer, _ = negotiated(server)
        consumer.sub("t", "hdr")
        producer, _ = negotiated(server)
        producer.pub("t", with_headers(b"one", traceparent="00-abc-01"))
        producer.mpub(
            "t", [with_headers(b"two", a="1", b_c="2"), with_headers(b"three"), b"\x00\x00four"]
        )
        producer.dpub("t", 10, with_headers(b"five", due="soon"))
        consumer.rdy(10)
        got = [read_with_headers(consumer) for _ in range(5)]
        assert [(h, b) for _, _, h, b in got] == [
            ({"traceparent": b"00-abc-01"}, b"one"),
            ({"a": b"1", "b-c": b"2"}, b"two"),
            ({}, b"three"),
            ({}, b"four"),
            ({"due": b"soon"}, b"five"),
        ]
        # A client that did not negotiate gets nsqd's frames: the bodies as published.
        assert [plain.read_message().body for _ in range(5)] == [
            b"one",
            b"two",
            b"three",
            b"four",
            b"five",
        ]
        # Requeued (deferred, then due): the headers come back with it.
        first_id = got[0][0]
        consumer.req(first_id, 10)
        again = read_with_headers(consumer)
        assert (again[0], again[1], again[2], again[3]) == (
            first_id,
            2,
            {"traceparent": b"00-abc-01"},
            b"one",
        )
        consumer.close()
        producer.close()


def test_headers_survive_a_restart_with_a_disk_backlog_and_dead_lettering(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(mem_queue_size=0, max_attempts=1)
    with server.connect() as c:
        c.sub("t", "c")  # the channel exists: the backlog is its, on disk
    producer, _ = negotiated(server)
    producer.mpub("t", [with_headers(b"kept %d" % i, n=str(i)) for i in range(3)])
    producer.close()
    server.stop()
    server = make_nsqd(mem_queue_size=0, max_attempts=1)
    consumer, _ = negotiated(server)
    consumer.sub("t", "c", rdy=3)
    got = [read_with_headers(consumer) for _ in range(3)]
    assert [(h, b) for _, _, h, b in got] == [({"n": b"%d" % i}, b"kept %d" % i) for i in range(3)]
    # max_attempts=1: a REQ sends the message to the dead-letter topic, headers and all.
    consumer.req(got[0][0], 0)
    dead, _ = negotiated(server)
    dead.sub("t.dead", "c", rdy=1)
    _, _, hdrs, body = read_with_headers(dead)
    assert (hdrs, body) == ({"n": b"0"}, b"kept 0")
    dead.close()
    consumer.close()


def test_a_retained_topic_logs_the_headers_and_its_readers_get_them(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(retention_time=3600.0)
    producer, _ = negotiated(server)
    producer.mpub("t", [with_headers(b"logged", k="v"), with_headers(b"bare")])
    producer.close()
    _, records = read_log(server, "topic=t&offset=0")
    assert [(r.headers, r.body) for r in records] == [
        (headers.encode([("k", b"v")]), b"logged"),
        (b"", b"bare"),
    ]
    consumer, _ = negotiated(server)
    consumer.sub("t", "c", rdy=2)  # from the log's hand-off
    got = [read_with_headers(consumer)[2:] for _ in range(2)]
    assert got == [({"k": b"v"}, b"logged"), ({}, b"bare")]
    consumer.close()


def test_an_mpub_of_same_sized_tagged_messages_keeps_each_ones_headers_or_is_refused_whole(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    """A publisher that tags each message with its own ``traceparent`` sends same-sized bodies
    whose blocks share their names and lengths: split at once (``headers.split_bodies``), each
    message still gets its own values; one broken name among them refuses the MPUB whole."""
    server = make_nsqd()
    tagged = [with_headers(b"body %03d" % i, traceparent=f"00-{i:032x}-01") for i in range(300)]
    assert len(set(map(len, tagged))) == 1
    consumer, _ = negotiated(server)
    producer, _ = negotiated(server)
    with consumer, producer:
        consumer.sub("t", "c")
        producer.mpub("t", tagged)
        consumer.rdy(300)
        got = [read_with_headers(consumer) for _ in range(300)]
        assert [(h, b) for _, _, h, b in got] == [
            ({"traceparent": b"00-%032x-01" % i}, b"body %03d" % i) for i in range(300)
        ]
    broken = list(tagged)
    broken[150] = broken[150].replace(b"traceparent", b"traceParent")
    conn, _ = negotiated(server)
    with conn:
        conn.send(encode.mpub("t2", broken))
        error = conn.read_error()
        assert error.startswith(b"E_BAD_MESSAGE MPUB ") and b"traceParent" in error, error
        conn.expect_closed()
    assert "t2" not in server.nsqd.topics or server.nsqd.topics["t2"].message_count == 0


def test_a_negotiated_publishers_messages_without_headers_reach_every_consumer_as_sent(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    """A negotiated publisher's MPUB of same-sized bodies with empty blocks is cut past the
    block lengths as it is parsed (``Strided.unblocked``): each consumer gets the bodies alone
    (a negotiated one with an empty block); one body with a header among them keeps it."""
    server = make_nsqd()
    bodies = [b"body %04d" % i for i in range(200)]
    mixed = [headers.join_body(b"", b) for b in bodies]
    mixed[77] = headers.join_body(headers.encode([("k", b"v")]), b"x" * 4)  # one size still
    assert len(set(map(len, mixed))) == 1
    producer, _ = negotiated(server)
    consumer, _ = negotiated(server)
    old_style = server.connect()
    with producer, consumer, old_style:
        consumer.sub("t", "c")
        old_style.identify({"feature_negotiation": True})
        old_style.sub("t", "d")
        producer.mpub("t", [headers.join_body(b"", b) for b in bodies])
        producer.mpub("t", mixed)
        consumer.rdy(400)
        old_style.rdy(400)
        got = [read_with_headers(consumer)[2:] for _ in range(400)]
        want = [({}, b) for b in bodies] * 2
        want[200 + 77] = ({"k": b"v"}, b"x" * 4)
        assert got == want
        seen = [old_style.read_message().body for _ in range(400)]
        assert seen == [b for _, b in want]


@pytest.mark.parametrize(
    "flags",
    [{}, {"mem_queue_size": 0}, {"retention_time": 3600.0}],
    ids=["memory", "disk", "retained"],
)
def test_tagged_messages_kept_as_sent_reach_every_reader_as_published(
    make_nsqd: Callable[..., ServerThread], flags: dict[str, Any]
) -> None:
    """Same-sized tagged messages are kept as their publisher sent them
    (``core/message.WireMessage``): a negotiated consumer gets each one's headers, one that
    did not ask gets the plain bodies, a requeue brings them back, the retained log records
    them, and the topic counts body bytes only (nsqd's ``message_bytes``)."""
    server = make_nsqd(**flags)
    tagged = [with_headers(b"body %03d" % i, traceparent=f"00-{i:032x}-01") for i in range(40)]
    want = [({"traceparent": b"00-%032x-01" % i}, b"body %03d" % i) for i in range(40)]
    consumer, _ = negotiated(server)
    producer, _ = negotiated(server)
    with server.connect() as plain, consumer, producer:
        plain.sub("t", "plain", rdy=40)
        consumer.sub("t", "c", rdy=40)
        producer.mpub("t", tagged)
        got = [read_with_headers(consumer) for _ in range(40)]
        assert [(h, b) for _, _, h, b in got] == want
        assert [plain.read_message().body for _ in range(40)] == [b for _, b in want]
        consumer.req(got[7][0], 0)
        assert read_with_headers(consumer)[1:] == (2, *want[7])
    stats = json.loads(http_request(server, "GET", "/stats?format=json&topic=t")[1])
    (topic,) = stats["topics"]
    assert topic["message_bytes"] == sum(len(b) for _, b in want)
    if "retention_time" in flags:
        _, records = read_log(server, "topic=t&offset=0")
        assert [(dict(headers.decode(r.headers)), r.body) for r in records] == want


@pytest.mark.parametrize(
    ("body", "says"),
    [
        (b"\x00", b"too short"),
        (b"\x00\x09abc", b"a header block of 9 bytes"),
        (_LEN.pack(4) + b"\x01A\x00\x00", b"name"),
        (_LEN.pack(5) + b"\x01a\x00\x09x", b"cut short"),
        (headers.join_body(headers.encode([(f"h{i}", b"") for i in range(17)]), b"x"), b"17"),
        (headers.join_body(headers.encode([("big", b"x" * 5000)]), b"x"), b"--max-header-bytes"),
    ],
    ids=["short", "block-past-body", "upper-case-name", "value-past-block", "count", "bytes"],
)
def test_a_bad_header_block_is_refused_whole_with_the_rule_named(
    make_nsqd: Callable[..., ServerThread], body: bytes, says: bytes
) -> None:
    server = make_nsqd()
    conn, _ = negotiated(server)
    with conn:
        conn.send(encode.pub("t", body))
        error = conn.read_error()
        assert error.startswith(b"E_BAD_MESSAGE PUB ") and says in error, error
        conn.expect_closed()
    assert "t" not in server.nsqd.topics or server.nsqd.topics["t"].message_count == 0


def test_http_pub_and_mpub_take_headers_from_nsq_header_request_headers(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd()
    info = json.loads(http_request(server, "GET", "/info")[1])
    assert "headers" in info["features"]
    assert (info["max_headers"], info["max_header_bytes"]) == (16, 4096)
    consumer, _ = negotiated(server)
    consumer.sub("t", "c", rdy=10)
    sent = {"Nsq-Header-Traceparent": "00-4bf92f-01", "nsq-header-tenant": "acme"}
    assert http_request(server, "POST", "/pub?topic=t", b"one", **sent)[0] == 200
    assert http_request(server, "POST", "/mpub?topic=t", b"two\nthree", **sent)[0] == 200
    assert http_request(server, "POST", "/pub?topic=t", b"bare")[0] == 200
    want = {"traceparent": b"00-4bf92f-01", "tenant": b"acme"}
    got = [read_with_headers(consumer)[2:] for _ in range(4)]
    assert got == [(want, b"one"), (want, b"two"), (want, b"three"), ({}, b"bare")]
    consumer.close()
    status, body = http_request(server, "POST", "/pub?topic=t", b"x", **{"Nsq-Header-A+B": "1"})
    doc = json.loads(body)
    assert (status, doc["message"]) == (400, "INVALID_HEADERS")
    assert doc["reason"].startswith("header name 'A+B' is invalid")
    many = {f"Nsq-Header-H{i}": "v" for i in range(17)}
    status, body = http_request(server, "POST", "/pub?topic=t", b"x", **many)
    assert status == 400 and json.loads(body)["reason"] == "17 headers (--max-headers=16)"
    assert server.nsqd.topics["t"].message_count == 4  # the refused ones were not written


def test_headers_cross_the_links_of_a_node_of_several_workers(tmp_path: Path) -> None:
    """``--workers 2``: publishes on connections spread over both workers, identified ones
    passed to their producer's home worker (the forward link), and a consumer on one worker
    offered the other's messages (the relay link): every message keeps its headers, over
    HTTP too; a consumer that did not ask gets the plain bodies."""
    proc = NsqdProcess(
        tmp_path / "data", tmp_path / "nsqd.log", "--workers=2", "--retention-time=1h"
    )
    try:
        consumer = Conn(("127.0.0.1", proc.port))
        consumer.identify(NEGOTIATE)
        consumer.sub("t", "c", rdy=100)
        plain = proc.connect()
        plain.sub("t", "plain", rdy=100)
        sent = []
        for i in range(6):  # new connections: the node spreads them over its workers
            with Conn(("127.0.0.1", proc.port)) as producer:
                producer.identify({**NEGOTIATE, "idempotent_publish": True})
                body = with_headers(b"m%d" % i, n=str(i))
                producer.send(encode.pub("t", body, (f"p{i}", 1)))
                assert producer.read_response() == b"OK"
                sent.append(({"n": b"%d" % i}, b"m%d" % i))
        for i in range(4):  # identified MPUBs of same-sized tagged messages (kept as sent)
            with Conn(("127.0.0.1", proc.port)) as producer:
                producer.identify({**NEGOTIATE, "idempotent_publish": True})
                bodies = [with_headers(b"q%d-%d" % (i, k), n=f"q{i}{k}") for k in range(3)]
                producer.send(encode.mpub("t", bodies, (f"q{i}", 1)))
                assert producer.read_response() == b"OK"
                sent += [({"n": b"q%d%d" % (i, k)}, b"q%d-%d" % (i, k)) for k in range(3)]
        conn = http.client.HTTPConnection("127.0.0.1", proc.http_port, timeout=10)
        conn.request("POST", "/pub?topic=t", b"over http", {"Nsq-Header-Via": "http"})
        assert conn.getresponse().status == 200
        conn.close()
        sent.append(({"via": b"http"}, b"over http"))
        got = [read_with_headers(consumer)[2:] for _ in range(len(sent))]
        assert sorted(got, key=lambda g: g[1]) == sorted(sent, key=lambda g: g[1])
        bodies = sorted(plain.read_message().body for _ in range(len(sent)))
        assert bodies == sorted(b for _, b in sent)
        consumer.close()
        plain.close()
        info = json.loads(proc.http("GET", "/info")[1])
        assert "headers" in info["features"] and info["max_headers"] == 16
    finally:
        proc.stop()


def test_our_client_publishes_and_receives_headers(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    server = make_nsqd()
    address = f"127.0.0.1:{server.tcp_port}"
    got: list[tuple[list[tuple[str, bytes]], bytes]] = []
    done = threading.Event()

    def on_messages(
        conn: Connection,
        ts: list[int],
        attempts: list[int],
        ids: list[bytes],
        bodies: list[bytes],
        hdrs: list[list[tuple[str, bytes]]],
    ) -> None:
        got.extend(zip(hdrs, bodies, strict=True))
        conn.fin_many(ids)
        if len(got) >= 4:
            done.set()

    consumer = Connection(address, ClientOptions(headers=True)).connect()
    consumer.subscribe("t", "c", on_messages, rdy=10)
    with Connection(address, ClientOptions(headers=True)).connect() as producer:
        producer.pub("t", b"one", headers={"traceparent": "00-abc-01"})
        producer.mpub("t", [b"two", b"three"], headers=[[("k", b"\x00\xff")], None])
        producer.dpub("t", 1, b"four", headers=[("Due", "now")])
        with pytest.raises(NsqError, match=r"E_BAD_MESSAGE .*header name"):
            producer.pub("t", b"x", headers={"a b": "1"})
    assert done.wait(30)
    consumer.close()
    assert got == [
        ([("traceparent", b"00-abc-01")], b"one"),
        ([("k", b"\x00\xff")], b"two"),
        ([], b"three"),
        ([("due", b"now")], b"four"),
    ]
    # Not asked for: a clear refusal to send them.
    with Connection(address).connect() as plain, pytest.raises(NsqError, match="ClientOptions"):
        plain.pub("t", b"x", headers={"a": "1"})
    (tmp_path / "off").mkdir()
    off = make_nsqd(max_headers=0, data_path=str(tmp_path / "off"))
    with pytest.raises(NsqConnectionError, match="does not offer message headers"):
        Connection(f"127.0.0.1:{off.tcp_port}", ClientOptions(headers=True)).connect()


def test_peek_and_nsq_log_show_the_headers(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(retention_time=3600.0)
    with server.connect() as c:
        c.sub("t", "c")  # the channel exists: what is published waits in it
    producer, _ = negotiated(server)
    producer.pub("t", with_headers(b"seen", tenant="acme", blob="\udcff"))
    producer.close()
    status, body = http_request(server, "GET", "/channel/peek?topic=t&channel=c")
    (row,) = json.loads(body)["queued"]
    assert status == 200 and row["body"] == "seen"
    assert [(h["name"], h["body"], h["encoding"]) for h in row["headers"]] == [
        ("tenant", "acme", "utf-8"),
        ("blob", "ff", "hex"),
    ]
    out = tool(
        "nsq_log",
        f"--nsqd-http-address=127.0.0.1:{server.http_port}",
        "--topic=t",
        "--format=json",
        "--n=1",
    )
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["body"] == "seen"
    assert doc["headers"] == [
        {"name": "tenant", "value": "acme"},
        {"name": "blob", "value_base64": "/w=="},
    ]
