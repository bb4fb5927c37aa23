"""Idempotent publishing (``core/dedup.py``) over real sockets and files: a publish retried with
the same identity is answered OK and written once, over TCP and HTTP, across a kill -9."""

from __future__ import annotations

import asyncio
import json
import random
import signal
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from pynsqd.client import Connection, NsqError
from pynsqd.client.aio import AsyncConnection
from pynsqd.protocol import encode

from ..conftest import ServerThread, http_request
from ..processes import NsqdProcess as Proc
from ..waiting import wait_for
from ..wire import Conn
from .servers import BIN, read_everything, tool

HOUR = 3600.0


def identified(server: ServerThread | Proc) -> Conn:
    c = Conn(("127.0.0.1", server.tcp_port))
    reply = c.identify({"feature_negotiation": True, "idempotent_publish": True})
    assert isinstance(reply, dict) and reply["idempotent_publish"] is True
    return c


def test_a_retried_publish_is_written_once_over_tcp_and_http(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(retention_time=HOUR)
    with identified(server) as c:
        c.send(encode.pub("t", b"a", ("p1", 0)))
        assert c.read_response() == b"OK"
        c.send(encode.pub("t", b"a", ("p1", 0)))  # the retry: acknowledged, and said so
        assert c.read_response() == b"OK DUPLICATES 1"
        c.send(encode.mpub("t", [b"a", b"b", b"c"], ("p1", 0)))  # overlaps: b, c are new
        assert c.read_response() == b"OK DUPLICATES 1"
        c.send(encode.dpub("t", 10, b"d", ("p1", 3)))
        assert c.read_response() == b"OK"
        c.send(encode.pub("t", b"x", ("p2", 7)))  # another producer starts anywhere
        assert c.read_response() == b"OK"
    status, body = http_request(server, "POST", "/pub?topic=t&producer=p1&seq=3", b"d")
    assert status == 200 and body == b"OK"
    status, body = http_request(server, "POST", "/mpub?topic=t&producer=p2&seq=7", b"x\ny")
    assert status == 200 and body == b"OK"
    records = read_everything(server, "t")
    assert [(r.body, r.producer, r.sequence) for r in records] == [
        (b"a", b"p1", 0),
        (b"b", b"p1", 1),
        (b"c", b"p1", 2),
        (b"d", b"p1", 3),
        (b"x", b"p2", 7),
        (b"y", b"p2", 8),
    ]
    assert records[3].defer_ms == 10
    stats = json.loads(http_request(server, "GET", "/stats?format=json&topic=t")[1])
    assert stats["topics"][0]["message_count"] == 6
    assert stats["topics"][0]["log"]["duplicate_count"] == 4
    metrics = http_request(server, "GET", "/metrics")[1].decode()
    assert 'nsq_topic_duplicates_total{topic="t"} 4.0' in metrics


def test_consumers_get_each_message_once_and_without_its_identity(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as sub:
        sub.sub("t", "c", rdy=10)
        with identified(server) as c:
            for i in range(3):
                c.send(encode.mpub("t", [b"one", b"two"], ("p", 0)))
                assert c.read_response() == (b"OK DUPLICATES 2" if i else b"OK")
        got = sub.read_messages(2)
        assert [m.body for m in got] == [b"one", b"two"]
        # The channel was given these two and nothing else (its own count, not a wait).
        stats = json.loads(http_request(server, "GET", "/stats?format=json&topic=t")[1])
        channel = stats["topics"][0]["channels"][0]
        assert (channel["message_count"], channel["depth"]) == (2, 0)


def test_a_gap_a_conflict_and_a_topic_without_a_log_are_errors_that_say_so(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd()
    http_request(server, "POST", "/topic/retention?topic=t&time=1h")
    with identified(server) as c:
        c.send(encode.pub("t", b"a", ("p", 5)))
        assert c.read_response() == b"OK"
        c.send(encode.pub("t", b"b", ("p", 7)))
        c.expect_fatal(
            b"E_BAD_SEQUENCE PUB failed producer p sequence 7 is not the next one "
            b"(expected 6, or a number already published)"
        )
    with identified(server) as c:
        c.send(encode.pub("t", b"not a", ("p", 5)))
        c.expect_fatal(
            b"E_CONFLICT PUB failed producer p sequence 5 was published with a different body"
        )
    with identified(server) as c:
        c.send(encode.pub("plain", b"a", ("p", 0)))
        err = c.read_error()
        assert err.startswith(b"E_NOT_RETAINED PUB failed topic plain keeps no log")
        assert b"/topic/retention?topic=plain" in err
    # HTTP's JSON escapes '&' as nsqd's Go encoder does: the suggested command must paste as
    # it reads there too (issue 54: it said ...?topic=plain\u0026time=24h).
    status, body = http_request(server, "POST", "/pub?topic=plain&producer=p&seq=0", b"a")
    assert status == 400 and b"\\u0026" not in body, body
    reason = json.loads(body)["reason"]
    assert "/topic/retention" in reason and "time=24h" in reason and "--retention-time" in reason
    status, body = http_request(server, "POST", "/pub?topic=t&producer=p&seq=5", b"other")
    assert status == 409 and json.loads(body)["message"] == "CONFLICT"
    status, body = http_request(server, "POST", "/pub?topic=t&producer=p&seq=9", b"a")
    assert status == 400 and json.loads(body)["message"] == "BAD_SEQUENCE"
    for query, code in [
        ("producer=p", "MISSING_ARG_SEQ"),
        ("seq=1", "MISSING_ARG_PRODUCER"),
        ("producer=a%20b&seq=1", "INVALID_ARG_PRODUCER"),
        ("producer=p&seq=-1", "INVALID_ARG_SEQ"),
        ("producer=p&seq=9223372036854775808", "INVALID_ARG_SEQ"),
    ]:
        status, body = http_request(server, "POST", f"/pub?topic=t&{query}", b"a")
        assert (status, json.loads(body)["message"]) == (400, code), query


def test_without_negotiation_extra_parameters_are_ignored_as_nsqd_does(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as c:
        c.send(b"PUB t p 0\n" + len(b"a").to_bytes(4, "big") + b"a")
        assert c.read_response() == b"OK"
        c.send(b"PUB t p 0\n" + len(b"a").to_bytes(4, "big") + b"a")
        assert c.read_response() == b"OK"
    assert [(r.body, r.sequence) for r in read_everything(server, "t")] == [(b"a", -1)] * 2


def _publish_with_retries(
    port: int, producer: str, first: int, bodies: list[bytes], rng: random.Random
) -> None:
    """One MPUB, retried on a new connection until it is answered OK; sometimes the
    connection is cut right after the command is sent, before its OK is read."""
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"  V2")
                s.sendall(encode.identify({"idempotent_publish": True}))
                s.sendall(encode.mpub("t", bodies, (producer, first)))
                if rng.random() < 0.5:
                    continue  # disconnect before the answer: it may or may not be written
                data = b""
                while data.count(b"OK") < 2:
                    chunk = s.recv(4096)
                    if not chunk:
                        raise ConnectionError
                    data += chunk
                return
        except OSError:
            continue  # the node is down or restarting: again


def test_retries_across_kill_9_write_each_message_once(tmp_path: Path) -> None:
    """A publisher that retries every MPUB on a new connection, often cutting the connection
    before the OK, with the node killed with kill -9 between a send and its retry: every
    message is in the log exactly once."""
    rng = random.Random(42)
    flags = ("--retention-time=1h", "--sync-every=1", "--mem-queue-size=0")
    data, log = tmp_path / "data", tmp_path / "nsqd.log"
    data.mkdir()
    proc = Proc(data, log, *flags)
    kills = 0
    try:
        bodies = [f"m{i}".encode() for i in range(300)]
        for n in range(0, len(bodies), 15):
            batch = bodies[n : n + 15]
            if rng.random() < 0.3:
                with socket.create_connection(("127.0.0.1", proc.port), timeout=5) as s:
                    s.sendall(b"  V2" + encode.identify({"idempotent_publish": True}))
                    s.sendall(encode.mpub("t", batch, ("writer", n)))
                    if rng.random() < 0.5:
                        s.recv(1)  # the IDENTIFY's OK: the MPUB is being read
                proc.p.send_signal(signal.SIGKILL)
                proc.stop()
                kills += 1
                proc = Proc(data, log, *flags)
            _publish_with_retries(proc.port, "writer", n, batch, rng)
        records = read_everything(proc, "t")
        assert kills >= 3
        assert [r.body for r in records] == bodies
        assert [r.sequence for r in records] == list(range(len(bodies)))
    finally:
        proc.stop()


def test_a_retry_after_a_million_other_records_and_a_kill_9_is_written_once(
    tmp_path: Path,
) -> None:
    """Issue 56: a retry later than the count window (100,000 records by default) was written
    again: Spark ran a failed task's retry after other tasks' rows. A producer is kept by time
    (``--dedup-window``, 24 h), whatever is written meanwhile, and across a kill -9 (each
    segment roll writes the producers down: small segments here, so many rolls)."""
    flags = ("--retention-time=1h", "--max-bytes-per-file=4194304")
    data, log = tmp_path / "data", tmp_path / "nsqd.log"
    data.mkdir()
    proc = Proc(data, log, *flags)
    try:
        spark = [b"row%d" % i for i in range(10)]
        with Connection(f"127.0.0.1:{proc.port}").connect() as c:
            c.mpub("t", spark, identity=("spark-task-7", 0))
            others = [b"x" * 20] * 5000
            for n in range(0, 1_000_000, 5000):
                c.mpub("t", others, identity=("other", n))
        proc.p.send_signal(signal.SIGKILL)
        proc.stop()
        proc = Proc(data, log, *flags)
        with Connection(f"127.0.0.1:{proc.port}").connect() as c:
            # The retry: OK, and the answer says every record was there.
            assert c.mpub("t", spark, identity=("spark-task-7", 0)) == len(spark)
            with pytest.raises(NsqError, match="E_BAD_SEQUENCE"):
                c.mpub("t", [b"skipped"], identity=("spark-task-7", 11))
        status, body = proc.http("GET", "/topic/offsets?topic=t")
        assert status == 200, body
        assert json.loads(body)["latest"] == 1_000_010  # written once
        assert "producers remembered for idempotent publishing" in log.read_text()
    finally:
        proc.stop()


@pytest.mark.parametrize("records", [5])
def test_the_window_forgets_by_count(make_nsqd: Callable[..., ServerThread], records: int) -> None:
    server = make_nsqd(retention_time=HOUR)
    status, body = http_request(
        server, "POST", f"/topic/config?topic=t&dedup_records={records}&dedup_window=1h"
    )
    assert status == 200, body
    doc = json.loads(body)
    assert (doc["dedup_records"], doc["dedup_window"]) == (records, "1h0m0s")
    with identified(server) as c:
        c.send(encode.mpub("t", [b"%d" % i for i in range(10)], ("p", 0)))
        assert c.read_response() == b"OK"
        c.send(encode.pub("t", b"9", ("p", 9)))  # in the window: a duplicate
        assert c.read_response() == b"OK DUPLICATES 1"
        c.send(encode.pub("t", b"other", ("q", 0)))
        assert c.read_response() == b"OK"
    assert len(read_everything(server, "t")) == 11


def test_the_clients_publish_with_identities(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(retention_time=HOUR)
    address = f"127.0.0.1:{server.tcp_port}"
    with Connection(address).connect() as conn:
        # Each publish returns how many of its records the topic already had.
        assert conn.mpub("t", [b"a", b"b"], identity=("blocking", 0)) == 0
        assert conn.mpub("t", [b"a", b"b"], identity=("blocking", 0)) == 2
        assert conn.pub("t", b"c", identity=("blocking", 2)) == 0
        assert conn.dpub("t", 5, b"c", identity=("blocking", 2)) == 1
        with pytest.raises(ValueError, match="invalid producer id"):
            conn.pub("t", b"x", identity=("no spaces", 0))
        with pytest.raises(NsqError) as err:
            conn.pub("t", b"other", identity=("blocking", 2))
        assert err.value.code == "E_CONFLICT"

    async def aio() -> None:
        conn = await AsyncConnection.connect(address)
        try:
            assert await conn.pub("t", b"d", identity=("aio", 0)) == 0
            assert await conn.mpub("t", [b"d", b"e"], identity=("aio", 0)) == 1
            assert await conn.dpub("t", 5, b"f", identity=("aio", 2)) == 0
        finally:
            await conn.close()

    asyncio.run(aio())
    records = read_everything(server, "t")
    assert [(r.producer, r.sequence, r.body) for r in records] == [
        (b"blocking", 0, b"a"),
        (b"blocking", 1, b"b"),
        (b"blocking", 2, b"c"),
        (b"aio", 0, b"d"),
        (b"aio", 1, b"e"),
        (b"aio", 2, b"f"),
    ]


def test_to_nsq_run_again_with_its_producer_id_writes_each_record_once(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(retention_time=HOUR)
    args = ("--topic=t", f"--nsqd-tcp-address=127.0.0.1:{server.tcp_port}", "--producer-id=load-1")
    first = tool("to_nsq", *args, stdin=b"a\nb\nc\n")
    assert first.returncode == 0, first.stderr
    assert first.stderr == (
        b"to_nsq: 3 records acknowledged on t as producer load-1 (sequences 0-2): 3 written\n"
    )
    # The same input again, longer (the first run "died" after c): only d and e are new.
    again = tool("to_nsq", *args, stdin=b"a\nb\nc\nd\ne\n")
    assert again.returncode == 0, again.stderr
    # What was acknowledged and what of it was new, not "published 5 messages" (issue 54: a
    # re-run that wrote nothing new said it published them all).
    assert again.stderr == (
        b"to_nsq: 5 records acknowledged on t as producer load-1 (sequences 0-4): 2 written, "
        b"3 were already in the topic (not written again)\n"
    )
    third = tool("to_nsq", *args, stdin=b"a\nb\nc\nd\ne\n")
    assert third.stderr == (
        b"to_nsq: 5 records acknowledged on t as producer load-1 (sequences 0-4): 0 written, "
        b"5 were already in the topic (not written again)\n"
    )
    records = read_everything(server, "t")
    assert [(r.body, r.sequence) for r in records] == [
        (b"a", 0),
        (b"b", 1),
        (b"c", 2),
        (b"d", 3),
        (b"e", 4),
    ]
    stats = json.loads(http_request(server, "GET", "/stats?format=json&topic=t")[1])
    assert stats["topics"][0]["log"]["duplicate_count"] == 8
    # nsq_log shows who published each record (its run of identities across reads too).
    shown = tool(
        "nsq_log",
        "--topic=t",
        f"--nsqd-http-address=127.0.0.1:{server.http_port}",
        "--format=json",
        "--n=5",
    )
    assert shown.returncode == 0, shown.stderr
    docs = [json.loads(line) for line in shown.stdout.splitlines()]
    assert [(d["body"], d["producer"], d["sequence"]) for d in docs] == [
        ("a", "load-1", 0),
        ("b", "load-1", 1),
        ("c", "load-1", 2),
        ("d", "load-1", 3),
        ("e", "load-1", 4),
    ]
    bad = tool("to_nsq", "--topic=t", "--nsqd-tcp-address=127.0.0.1:1", "--producer-id=a b")
    assert bad.returncode == 1 and b"--producer-id" in bad.stderr


def test_nsq_to_nsq_idempotent_publishes_with_its_run_s_identity(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    (tmp_path / "dest").mkdir()
    source = make_nsqd()
    dest = make_nsqd(retention_time=HOUR, data_path=str(tmp_path / "dest"))
    with source.connect() as c:
        c.mpub("src", [b"1", b"2", b"3"])
    proc = subprocess.Popen(
        [
            str(BIN / "nsq_to_nsq"),
            "--topic=src",
            f"--nsqd-tcp-address=127.0.0.1:{source.tcp_port}",
            f"--destination-nsqd-tcp-address=127.0.0.1:{dest.tcp_port}",
            "--destination-topic=dst",
            "--idempotent",
        ],
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(
            lambda: (
                dest.nsqd.get_existing_topic("dst") is not None
                and dest.nsqd.topics["dst"].message_count == 3
            ),
            "nsq_to_nsq to copy 3 messages",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    records = read_everything(dest, "dst")
    assert sorted(r.body for r in records) == [b"1", b"2", b"3"]
    assert [r.sequence for r in records] == [0, 1, 2]
    assert len({r.producer for r in records}) == 1
    assert records[0].producer.startswith(b"nsq_to_nsq.")
