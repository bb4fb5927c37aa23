"""Replayable topics over real sockets and files: the log, reads by offset, retention, rewind."""

from __future__ import annotations

import json
import os
import signal
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ..conftest import ServerThread, http_request
from ..disks import fill
from ..processes import NsqdProcess as Proc
from ..waiting import wait_for
from ..wire import Conn
from .secure_client import AuthServer
from .servers import drain, read_everything, read_log

HOUR = 3600.0


def get_json(server: ServerThread, path: str, method: str = "GET") -> tuple[int, Any]:
    status, body = http_request(server, method, path)
    return status, json.loads(body) if body else None


def test_every_publish_path_is_logged_with_dense_offsets(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as c:
        c.pub("t", b"pub")
        c.mpub("t", [b"mpub1", b"mpub2"])
        c.dpub("t", 1500, b"dpub")
    assert http_request(server, "POST", "/pub?topic=t", b"http")[0] == 200
    assert http_request(server, "POST", "/mpub?topic=t", b"h1\nh2")[0] == 200
    status, doc = get_json(server, "/topic/offsets?topic=t")
    assert status == 200
    assert (doc["earliest"], doc["latest"], doc["segments"]) == (0, 7, 1)
    assert doc["retention_time"] == "1h0m0s" and doc["bytes"] > 0
    headers, records = read_log(server, "topic=t&offset=0")
    assert [r.body for r in records] == [b"pub", b"mpub1", b"mpub2", b"dpub", b"http", b"h1", b"h2"]
    assert [r.offset for r in records] == list(range(7))
    assert records[3].defer_ms == 1500
    assert len({r.id for r in records}) == 7
    assert headers["x-nsq-first-offset"] == "0" and headers["x-nsq-next-offset"] == "7"
    assert headers["x-nsq-count"] == "7" and headers["x-nsq-latest"] == "7"
    # Reading from the middle, bounded by count; at the end the reader is caught up.
    _, some = read_log(server, "topic=t&offset=2&max_messages=3")
    assert [r.offset for r in some] == [2, 3, 4]
    headers, none = read_log(server, "topic=t&offset=7")
    assert none == [] and headers["x-nsq-next-offset"] == "7"


def test_the_log_ids_are_the_ids_consumers_get(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as sub, server.connect() as pub:
        sub.sub("t", "c", rdy=10)
        pub.mpub("t", [b"a", b"b", b"c"])
        delivered = sub.read_messages(3)
    _, records = read_log(server, "topic=t&offset=0")
    assert [r.id for r in records] == [m.id for m in delivered]
    assert [r.timestamp for r in records] == [m.timestamp for m in delivered]


def test_a_topic_without_retention_has_no_log(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    server = make_nsqd()
    with server.connect() as c:
        c.pub("t", b"x")
    assert get_json(server, "/topic/offsets?topic=t") == (400, {"message": "TOPIC_NOT_RETAINED"})
    assert not (tmp_path / "t.log").exists()
    _, stats = get_json(server, "/stats?format=json")
    assert "log" not in stats["topics"][0]


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/topic/offsets", 400, "MISSING_ARG_TOPIC"),
        ("/topic/offsets?topic=bad!name", 400, "INVALID_ARG_TOPIC"),
        ("/topic/offsets?topic=nope", 404, "TOPIC_NOT_FOUND"),
        ("/topic/offsets?topic=t&timestamp=yesterday", 400, "INVALID_ARG_TIMESTAMP"),
        ("/topic/log?topic=t", 400, "MISSING_ARG_OFFSET"),
        ("/topic/log?topic=t&offset=-1", 400, "INVALID_ARG_OFFSET"),
        ("/topic/log?topic=t&offset=99999999999999999999", 400, "INVALID_ARG_OFFSET"),
        ("/topic/log?topic=t&offset=0&max_messages=0", 400, "INVALID_ARG_MAX_MESSAGES"),
        ("/topic/log?topic=t&offset=0&max_bytes=x", 400, "INVALID_ARG_MAX_BYTES"),
        ("/topic/log?topic=t&offset=%zz", 400, "INVALID_REQUEST"),
    ],
)
def test_bad_reads_get_a_clear_4xx(
    make_nsqd: Callable[..., ServerThread], path: str, status: int, message: str
) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as c:
        c.pub("t", b"x")
    got_status, doc = get_json(server, path)
    assert (got_status, doc["message"]) == (status, message)


def test_an_offset_out_of_range_names_the_valid_range(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as c:
        c.mpub("t", [b"a", b"b"])
    assert get_json(server, "/topic/log?topic=t&offset=3") == (
        400,
        {"message": "OFFSET_OUT_OF_RANGE", "earliest": 0, "latest": 2},
    )


def test_offsets_by_timestamp(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as c:
        c.mpub("t", [b"a", b"b"])
    _, records = read_log(server, "topic=t&offset=0")
    cut_ms = records[1].timestamp // 1_000_000 + 1
    with server.connect() as c:
        wait_for(lambda: time.time_ns() // 1_000_000 > cut_ms, "the clock to pass the cut")
        c.pub("t", b"later")
    _, doc = get_json(server, f"/topic/offsets?topic=t&timestamp={cut_ms}")
    assert doc["offset"] == 2
    _, doc = get_json(server, "/topic/offsets?topic=t&timestamp=0")
    assert doc["offset"] == 0


def test_per_topic_retention_is_kept_across_restarts_and_0_removes_the_log(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    server = make_nsqd()
    status, doc = get_json(server, "/topic/retention?topic=t&time=24h&bytes=1000000", "POST")
    assert status == 200 and doc["retention_time"] == "24h0m0s"
    assert doc["retention_bytes"] == 1_000_000
    with server.connect() as c:
        c.mpub("t", [b"a", b"b", b"c"])
    server.stop()
    server = make_nsqd()
    _, doc = get_json(server, "/topic/offsets?topic=t")
    assert (doc["earliest"], doc["latest"], doc["retention_time"]) == (0, 3, "24h0m0s")
    with server.connect() as c:
        c.pub("t", b"d")
    assert [r.body for r in read_everything(server, "t")] == [b"a", b"b", b"c", b"d"]
    status, doc = get_json(server, "/topic/retention?topic=t&time=0", "POST")
    assert status == 200 and doc["retention_time"] == "0s"
    assert get_json(server, "/topic/offsets?topic=t")[0] == 400
    assert [p.name for p in (tmp_path / "t.log").iterdir()] == ["retention.json"]
    assert get_json(server, "/topic/retention?topic=t&time=soon", "POST") == (
        400,
        {"message": "INVALID_ARG_TIME"},
    )


def test_rewinding_a_channel_delivers_the_logged_messages_again(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as sub, server.connect() as pub:
        sub.sub("t", "c", rdy=100)
        pub.mpub("t", [b"m%d" % i for i in range(10)])
        first = sub.read_messages(10)
        for m in first:
            sub.fin(m.id)
        status, doc = get_json(server, "/channel/rewind?topic=t&channel=c&offset=4", "POST")
        assert status == 200 and doc == {"offset": 4, "next": 10, "count": 6}
        again = sub.read_messages(6)
    assert [(m.id, m.body) for m in again] == [(m.id, m.body) for m in first[4:]]
    assert get_json(server, "/channel/rewind?topic=t&channel=nope&offset=0", "POST") == (
        404,
        {"message": "CHANNEL_NOT_FOUND"},
    )
    assert get_json(server, "/channel/rewind?topic=t&channel=c&offset=11", "POST")[1] == {
        "message": "OFFSET_OUT_OF_RANGE",
        "earliest": 0,
        "latest": 10,
    }


def test_a_new_channel_can_start_in_the_past(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as c:
        c.sub("t", "live", rdy=0)
    with server.connect() as c:
        c.mpub("t", [b"a", b"b", b"c"])
    status, doc = get_json(server, "/channel/create?topic=t&channel=late&timestamp=0", "POST")
    assert status == 200 and doc["count"] == 3
    with server.connect() as c:
        c.sub("t", "late", rdy=10)
        assert sorted(m.body for m in c.read_messages(3)) == [b"a", b"b", b"c"]


def test_stats_and_metrics_show_the_log(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as c:
        c.mpub("t", [b"a", b"b"])
    _, stats = get_json(server, "/stats?format=json")
    log = stats["topics"][0]["log"]
    assert (log["earliest_offset"], log["latest_offset"], log["segments"]) == (0, 2, 1)
    assert log["bytes"] == 2 * (46 + 1)
    text = http_request(server, "GET", "/stats")[1].decode()
    assert "log: offsets 0-2 bytes: 94 segments: 1" in text
    metrics = http_request(server, "GET", "/metrics")[1].decode()
    assert 'nsq_topic_log_latest_offset{topic="t"} 2.0' in metrics


def test_a_reader_that_keeps_its_own_offsets_shows_with_its_lag(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    """``POST /topic/reader`` (what the Spark log source calls at each commit): /stats and
    /metrics show the reader's committed offset and lag, which follow the log as it grows."""
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as c:
        c.mpub("t", [b"m"] * 10)
        c.pub("plain", b"x")
    status, doc = get_json(server, "/topic/reader?topic=t&reader=etl%20job&offset=4", "POST")
    assert (status, doc) == (200, {"reader": "etl job", "committed": 4, "lag": 6})
    with server.connect() as c:
        c.mpub("t", [b"m"] * 5)
    _, stats = get_json(server, "/stats?format=json&topic=t")
    readers = stats["topics"][0]["log"]["readers"]
    assert [(r["reader"], r["committed"], r["lag"]) for r in readers] == [("etl job", 4, 11)]
    metrics = http_request(server, "GET", "/metrics")[1].decode()
    assert 'nsq_log_reader_lag{partition="",reader="etl job",topic="t"} 11.0' in metrics
    assert 'nsq_log_reader_committed_offset{partition="",reader="etl job",topic="t"} 4.0' in metrics
    # A later commit moves it; the reader caught up has no lag.
    assert get_json(server, "/topic/reader?topic=t&reader=etl%20job&offset=15", "POST")[1] == {
        "reader": "etl job",
        "committed": 15,
        "lag": 0,
    }
    # Bad reports are refused with nsqd's kind of answer, and change nothing.
    assert http_request(server, "POST", "/topic/retention?topic=plain&time=0&bytes=0")[0] == 200
    for query, answer in (
        ("topic=t&offset=1", "MISSING_ARG_READER"),
        ("topic=t&reader=&offset=1", "INVALID_ARG_READER"),
        ("topic=t&reader=" + "r" * 129 + "&offset=1", "INVALID_ARG_READER"),
        ("topic=t&reader=a%0Ab&offset=1", "INVALID_ARG_READER"),
        ("topic=t&reader=r&offset=-1", "INVALID_ARG_OFFSET"),
        ("topic=t&reader=r&offset=16", "OFFSET_OUT_OF_RANGE"),
        ("topic=plain&reader=r&offset=0", "TOPIC_NOT_RETAINED"),
        ("topic=nope&reader=r&offset=0", "TOPIC_NOT_FOUND"),
    ):
        status, doc = get_json(server, "/topic/reader?" + query, "POST")
        assert status in (400, 404) and doc["message"] == answer, (query, doc)
    _, stats = get_json(server, "/stats?format=json&topic=t")
    assert [r["reader"] for r in stats["topics"][0]["log"]["readers"]] == ["etl job"]


def test_retention_by_size_prunes_whole_segments(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(retention_bytes=20_000, max_bytes_per_file=4096)
    with server.connect() as c:
        for i in range(50):
            c.mpub("t", [b"%04d" % (i * 10 + j) + b"." * 96 for j in range(10)])
    # Without channels the log holds the topic's backlog: nothing is pruned yet.
    _, doc = get_json(server, "/topic/offsets?topic=t")
    assert doc["latest"] == 500 and doc["earliest"] == 0
    with server.connect() as c:
        c.sub("t", "c", rdy=1000)
        c.read_messages(500)
    # Handed to the channel, the old segments go at the next roll.
    with server.connect() as c:
        for _ in range(5):
            c.mpub("t", [b"x" * 100] * 10)
    _, doc = get_json(server, "/topic/offsets?topic=t")
    assert doc["latest"] == 550 and doc["earliest"] > 0
    assert doc["bytes"] >= 20_000 and doc["bytes"] < 20_000 + 4096 + 1500
    records = read_everything(server, "t", doc["earliest"])
    assert [r.offset for r in records] == list(range(doc["earliest"], 550))
    assert get_json(server, "/topic/log?topic=t&offset=0")[1]["message"] == "OFFSET_OUT_OF_RANGE"


def test_a_reader_that_leaves_mid_stream_costs_nothing(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as c:
        for _ in range(20):
            c.mpub("t", [b"x" * 1000] * 100)
    for _ in range(5):
        with Conn(("127.0.0.1", server.http_port), magic=b"") as raw:
            raw.send(
                b"GET /topic/log?topic=t&offset=0&max_bytes=10000000 HTTP/1.1\r\nHost: x\r\n\r\n"
            )
            raw.sock.recv(1000)  # the headers and a little of the body; then hang up
    with server.connect() as c:
        c.pub("t", b"still fine")
    assert read_everything(server, "t")[-1].body == b"still fine"


# -- crashes and a full disk -------------------------------------------------------------------


def test_kill_9_loses_no_acknowledged_record_and_reuses_no_offset(
    proc_dir: tuple[Path, Path],
) -> None:
    """Many cycles of publish-then-kill -9 with --sync-every=1: every acknowledged message is
    in the log, once, at a dense offset."""
    data, log = proc_dir
    acked: list[bytes] = []
    for cycle in range(6):
        proc = Proc(data, log, "--retention-time=1h", "--sync-every=1")
        stop = threading.Event()
        mine: list[bytes] = []

        def publish(
            proc: Proc = proc, cycle: int = cycle, mine: list[bytes] = mine, stop: Any = stop
        ) -> None:
            try:
                with proc.connect() as c:
                    i = 0
                    while not stop.is_set():
                        body = b"c%d-%06d" % (cycle, i)
                        c.pub("t", body)  # returns once OK arrived
                        mine.append(body)
                        i += 1
            except (OSError, AssertionError, struct.error):
                pass  # the server died under us: only what was acknowledged counts

        t = threading.Thread(target=publish)
        t.start()
        want = 50 + 30 * cycle
        wait_for(lambda: len(mine) >= want, "some acknowledged messages")  # noqa: B023
        proc.p.send_signal(signal.SIGKILL)
        proc.p.wait()
        proc.log_file.close()
        stop.set()
        t.join()
        acked += mine
    proc = Proc(data, log, "--retention-time=1h", "--sync-every=1")
    try:
        records = read_everything(proc, "t")
        # The log is the topic's queue: a channel gets every acknowledged message too.
        delivered: set[bytes] = set()
        with proc.connect() as c:
            c.sub("t", "c", rdy=2000)
            while not set(acked) <= delivered:
                m = c.read_message()  # times out (fails) if one is missing
                delivered.add(m.body)
                c.fin(m.id)
    finally:
        proc.stop(signal.SIGTERM)
    assert [r.offset for r in records] == list(range(len(records)))
    bodies = [r.body for r in records]
    assert len(set(bodies)) == len(bodies)  # none twice at different offsets
    missing = set(acked) - set(bodies)
    assert not missing, f"{len(missing)} acknowledged messages lost"


def test_a_full_disk_fails_the_publish_and_loses_nothing_acknowledged(
    make_nsqd: Callable[..., ServerThread], small_disk: Path
) -> None:
    server = make_nsqd(data_path=str(small_disk), retention_time=HOUR)
    with server.connect() as c:
        c.pub("t", b"before")
    filler = fill(small_disk)
    with server.connect() as c:
        c.send(b"PUB t\n" + struct.pack(">l", 4096) + b"x" * 4096)
        assert c.read_frame().data.startswith(b"E_PUB_FAILED")
    assert http_request(server, "GET", "/ping")[0] == 500
    filler.unlink()
    with server.connect() as c:
        c.pub("t", b"after")
    assert http_request(server, "GET", "/ping") == (200, b"OK")
    assert [r.body for r in read_everything(server, "t")] == [b"before", b"after"]
    assert os.path.isdir(small_disk / "t.log")


# -- who may read ------------------------------------------------------------------------------


def get_with(server: ServerThread, path: str, **headers: str) -> tuple[int, Any]:
    status, body = http_request(server, "GET", path, **headers)
    return status, json.loads(body) if body.startswith(b"{") else body


def test_with_an_auth_server_reading_needs_subscribe_on_the_topic(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    authd = AuthServer()  # grants publish and subscribe on topics matching ^allowed
    try:
        server = make_nsqd(retention_time=HOUR, auth_http_addresses=[authd.address])
        for topic in ("allowed_t", "other"):
            assert http_request(server, "POST", f"/topic/retention?topic={topic}&time=1h")[0] == 200
        path = "/topic/log?topic=allowed_t&offset=0"
        assert get_with(server, path) == (401, {"message": "AUTH_REQUIRED"})
        assert get_with(server, path, **{"X-Nsq-Auth-Secret": "s3cret"})[0] == 200
        assert get_with(server, path + "&secret=s3cret")[0] == 200
        assert len(authd.requests) == 1  # the answer is kept for its TTL
        assert get_with(server, "/topic/offsets?topic=other&secret=s3cret") == (
            403,
            {"message": "UNAUTHORIZED"},
        )
        authd.status = 500
        assert get_with(server, path + "&secret=another") == (401, {"message": "AUTH_FAILED"})
    finally:
        authd.close()


# -- the log is the topic's queue --------------------------------------------------------------


def test_a_backlog_waits_in_the_log_across_a_restart_and_nowhere_else(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    server = make_nsqd(retention_time=HOUR, mem_queue_size=10)
    with server.connect() as c:
        for i in range(30):
            c.mpub("t", [b"%03d-%d" % (i, j) for j in range(10)])
    assert get_json(server, "/stats?format=json")[1]["topics"][0]["depth"] == 300
    server.stop()
    # Written once: the topic's disk queue holds nothing, the log everything.
    assert not any(
        p.name.startswith("t.diskqueue.0") and p.stat().st_size for p in tmp_path.iterdir()
    )
    server = make_nsqd(retention_time=HOUR, mem_queue_size=10)
    got = drain(server, "t", "c", 300)
    # (Not in order: a channel past --mem-queue-size serves memory and disk alternately.)
    assert sorted(got) == [b"%03d-%d" % (i, j) for i in range(30) for j in range(10)]
    assert get_json(server, "/stats?format=json")[1]["topics"][0]["depth"] == 0


def test_a_paused_retained_topic_keeps_its_backlog_and_empty_drops_it(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as c:
        c.sub("t", "c", rdy=0)
    assert http_request(server, "POST", "/topic/pause?topic=t")[0] == 200
    with server.connect() as c:
        c.mpub("t", [b"a", b"b"])
    assert http_request(server, "POST", "/topic/unpause?topic=t")[0] == 200
    assert drain(server, "t", "c", 2) == [b"a", b"b"]
    assert http_request(server, "POST", "/topic/pause?topic=t")[0] == 200
    with server.connect() as c:
        c.mpub("t", [b"c", b"d"])
    assert http_request(server, "POST", "/topic/empty?topic=t")[0] == 200
    assert http_request(server, "POST", "/topic/unpause?topic=t")[0] == 200
    with server.connect() as c:
        c.sub("t", "c", rdy=10)
        c.expect_nothing()
    assert [r.body for r in read_everything(server, "t")] == [b"a", b"b", b"c", b"d"]


def test_turning_retention_off_moves_the_backlog_to_the_queue(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd()
    assert http_request(server, "POST", "/topic/retention?topic=t&time=1h")[0] == 200
    with server.connect() as c:
        c.mpub("t", [b"a", b"b", b"c"])
    assert http_request(server, "POST", "/topic/retention?topic=t&time=0")[0] == 200
    assert drain(server, "t", "c", 3) == [b"a", b"b", b"c"]


def test_a_restart_without_the_retention_flag_still_delivers_the_backlog(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(retention_time=HOUR)
    with server.connect() as c:
        c.mpub("t", [b"a", b"b", b"c"])
    server.stop()
    server = make_nsqd()  # retention off now: the log's backlog moves to the topic's queue
    assert drain(server, "t", "c", 3) == [b"a", b"b", b"c"]
