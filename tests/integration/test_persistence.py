"""Persistence through a real server: nsqd.dat, clean shutdown, deferred due times, corruption,
write errors."""

from __future__ import annotations

import json
import logging
import struct
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pynsqd.storage.metadata import DirLock, DirLockError

from ..conftest import ServerThread
from ..waiting import wait_for

MakeNSQD = Callable[..., ServerThread]


def test_metadata_round_trip(make_nsqd: MakeNSQD, tmp_path: Path) -> None:
    s = make_nsqd()
    with s.connect() as c:
        c.sub("t1", "c1")
    with s.connect() as c:
        c.sub("t1", "c2")
    with s.connect() as c:
        c.pub("t2", b"x")
        c.sub("t3#ephemeral", "c")
    with s.connect() as c:
        c.sub("t1", "c3#ephemeral")

    def pause() -> None:
        s.nsqd.get_topic("t2").pause()
        s.nsqd.get_topic("t1").channels["c2"].pause()

    s.call(pause)
    # pause is written at once (the HTTP API calls it the same way)
    doc = json.loads((tmp_path / "nsqd.dat").read_bytes())
    assert doc["topics"][1] == {"name": "t2", "paused": True, "channels": None}
    s.stop()
    raw = (tmp_path / "nsqd.dat").read_bytes()
    assert raw == (
        b'{"topics":[{"name":"t1","paused":false,"channels":[{"name":"c1","paused":false},'
        b'{"name":"c2","paused":true}]},{"name":"t2","paused":false,"channels":null}],'
        b'"version":"1.3.0"}'
    ).replace(b'"t2","paused":false', b'"t2","paused":true')
    assert not list(tmp_path.glob("*.tmp"))

    s = make_nsqd()

    def state() -> dict[str, object]:
        return {
            name: (t.paused, {cn: ch.paused for cn, ch in t.channels.items()})
            for name, t in s.nsqd.topics.items()
        }

    assert s.call(state) == {"t1": (False, {"c1": False, "c2": True}), "t2": (True, {})}
    s.call(lambda: s.nsqd.get_topic("t2").unpause())
    s.call(lambda: s.nsqd.get_topic("t1").delete_channel("c1"))
    s.call(lambda: s.nsqd.delete_existing_topic("t2"))
    doc = json.loads((tmp_path / "nsqd.dat").read_bytes())
    assert doc == {
        "topics": [{"name": "t1", "paused": False, "channels": [{"name": "c2", "paused": True}]}],
        "version": "1.3.0",
    }


def test_metadata_invalid_names_are_skipped(
    make_nsqd: MakeNSQD, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    doc = {
        "topics": [
            {"name": "bad topic!", "paused": False, "channels": None},
            {
                "name": "good",
                "paused": False,
                "channels": [{"name": "bad/ch", "paused": False}, {"name": "ok", "paused": True}],
            },
        ],
        "version": "1.3.0",
    }
    (tmp_path / "nsqd.dat").write_text(json.dumps(doc))
    with caplog.at_level(logging.WARNING):
        s = make_nsqd()
    assert s.call(lambda: {n: list(t.channels) for n, t in s.nsqd.topics.items()}) == {
        "good": ["ok"]
    }
    assert "skipping creation of invalid topic bad topic!" in caplog.text
    assert "skipping creation of invalid channel bad/ch" in caplog.text


def test_data_dir_is_locked(make_nsqd: MakeNSQD, tmp_path: Path) -> None:
    s = make_nsqd()
    with pytest.raises(DirLockError, match=r"cannot flock directory .*another instance of nsqd"):
        DirLock(str(tmp_path)).lock()
    s.stop()
    with DirLock(str(tmp_path)):
        pass


def test_clean_shutdown_keeps_memory_in_flight_and_deferred(
    make_nsqd: MakeNSQD, tmp_path: Path
) -> None:
    s = make_nsqd(mem_queue_size=5)  # 10 messages: 5 in memory, 5 on disk
    consumer = s.connect()
    consumer.sub("t", "c", rdy=2)
    with s.connect() as c:
        c.mpub("t", [b"m%d" % i for i in range(10)])
        c.dpub("t", 60_000, b"deferred")
        c.dpub("lonely", 60_000, b"no channel yet")  # waits in the topic
    in_flight = consumer.read_messages(2)
    consumer.req(in_flight[0].id, 60_000)  # deferred by REQ
    in_flight.append(consumer.read_message())  # RDY 2 refills the window

    def ch_state() -> tuple[int, int, int]:
        ch = s.nsqd.get_topic("t").channels["c"]
        return len(ch.in_flight), len(ch.deferred), ch.depth

    deadline = time.monotonic() + 5
    while s.call(ch_state) != (2, 2, 7) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.call(ch_state) == (2, 2, 7)
    s.stop()
    consumer.close()

    s = make_nsqd(mem_queue_size=5)
    # the deferred messages are deferred again, with the rest of their delay
    assert s.call(ch_state) == (0, 0, 11)  # they come out of the backend as it is read
    with s.connect() as c:
        c.sub("t", "c", rdy=20)
        got = c.read_messages(9)
        c.expect_nothing(0.3)
    assert sorted(m.body for m in got) == sorted(
        [b"m%d" % i for i in range(10) if b"m%d" % i != in_flight[0].body]
    )
    attempts = {m.body: m.attempts for m in got}
    # in flight at exit: delivered once before
    assert {b for b, a in attempts.items() if a == 2} == {m.body for m in in_flight[1:]}
    assert {b for b, a in attempts.items() if a == 1} == {b"m%d" % i for i in range(10)} - {
        m.body for m in in_flight
    }

    def deferred() -> list[tuple[bytes, float]]:
        ch = s.nsqd.get_topic("t").channels["c"]
        now = s.nsqd.loop.time()
        return sorted((m.body, due - now) for due, m in ch.tq.live_entries() if m.client is None)

    left = s.call(deferred)
    assert [b for b, _ in left] == [b"deferred", in_flight[0].body]
    assert all(30 < d <= 60 for _, d in left)
    # a deferred message that waited in a channel-less topic keeps its due time too
    with s.connect() as c:
        c.sub("lonely", "c", rdy=1)
        c.expect_nothing(0.2)
    lonely = s.call(lambda: list(s.nsqd.get_topic("lonely").channels["c"].deferred))
    assert len(lonely) == 1


def test_deferred_overflow_to_disk_keeps_due_time(make_nsqd: MakeNSQD, tmp_path: Path) -> None:
    s = make_nsqd(mem_queue_size=0)
    with s.connect() as c:
        c.mpub("t", [b"a", b"b"])
        c.dpub("t", 60_000, b"later")
        c.pub("t", b"c")
    side = tmp_path / "t.diskqueue.deferred.dat"
    assert side.stat().st_size == 24
    with s.connect() as c:
        c.sub("t", "ch", rdy=10)
        got = c.read_messages(3)
        c.expect_nothing(0.2)
    assert [m.body for m in got] == [b"a", b"b", b"c"]
    assert s.call(lambda: len(s.nsqd.get_topic("t").channels["ch"].deferred)) == 1
    assert not side.exists()  # no due time left on disk
    # the side file does not change the go-diskqueue files: a reader ignoring it sees 4 records


def _pub_topic_to_disk(make_nsqd: MakeNSQD, n: int) -> None:
    s = make_nsqd(mem_queue_size=0, max_bytes_per_file=200)
    with s.connect() as c:
        c.mpub("t", [b"body-%02d" % i for i in range(n)])  # 4 + 26 + 7 = 37 bytes per record
    s.stop()


def test_corrupt_files_are_renamed_bad_and_intact_messages_served(
    make_nsqd: MakeNSQD, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _pub_topic_to_disk(make_nsqd, 15)  # 5 records per file: files 0, 1, 2
    f0 = tmp_path / "t.diskqueue.000000.dat"
    f1 = tmp_path / "t.diskqueue.000001.dat"
    data = bytearray(f0.read_bytes())
    struct.pack_into(">i", data, 37, 0x7FFFFFFF)  # an impossible length for record 1
    f0.write_bytes(bytes(data))
    f1.write_bytes(f1.read_bytes()[:-10])  # a truncated tail
    s = make_nsqd(mem_queue_size=0, max_bytes_per_file=200)
    with s.connect() as c:
        c.sub("t", "c", rdy=20)
        got = c.read_messages(10)
        c.expect_nothing(0.3)
    assert [m.body for m in got] == [b"body-%02d" % i for i in [0, 5, 6, 7, 8, 10, 11, 12, 13, 14]]
    assert (tmp_path / "t.diskqueue.000000.dat.bad").exists()
    assert (tmp_path / "t.diskqueue.000001.dat.bad").exists()
    assert "invalid message read size" in caplog.text
    assert s.call(lambda: s.nsqd.health_error) is None


def test_write_error_fails_the_publish_and_marks_health(
    make_nsqd: MakeNSQD, tmp_path: Path
) -> None:
    s = make_nsqd(mem_queue_size=0)
    moved = tmp_path.with_name(tmp_path.name + "-moved")
    tmp_path.rename(moved)
    tmp_path.write_bytes(b"")  # the data directory is now a file: every open fails
    try:
        with s.connect() as c:
            c.send(b"PUB t\n" + struct.pack(">i", 1) + b"x")
            assert c.read_error().startswith(b"E_PUB_FAILED PUB failed")
            c.expect_closed()
        with s.connect() as c:
            c.send(b"MPUB t\n" + struct.pack(">ii", 9, 1) + struct.pack(">i", 1) + b"x")
            assert c.read_error().startswith(b"E_MPUB_FAILED MPUB failed")
        assert s.call(lambda: s.nsqd.health_error)
    finally:
        tmp_path.unlink()
        moved.rename(tmp_path)
    # the server stayed up, and the disk is back
    with s.connect() as c:
        c.pub("t", b"y")
        c.sub("t", "c", rdy=1)
        assert c.read_message().body == b"y"


def test_unreadable_nsqd_dat_is_kept_and_topics_recovered_from_queue_files(
    make_nsqd: MakeNSQD, tmp_path: Path
) -> None:
    s = make_nsqd(mem_queue_size=0)
    with s.connect() as c:
        c.sub("kept", "ch", rdy=0)
        c.pub("kept", b"a")
        c.mpub("topic_only", [b"b", b"c"])
    s.stop()
    (tmp_path / "nsqd.dat").write_bytes(b'{"topics": [{"name": "kept", trunca')

    s = make_nsqd(mem_queue_size=0)
    assert (tmp_path / "nsqd.dat.bad").read_bytes().endswith(b"trunca")
    names = s.call(lambda: {t: sorted(s.nsqd.topics[t].channels) for t in s.nsqd.topics})
    assert names == {"kept": ["ch"], "topic_only": []}
    with s.connect() as c:
        c.sub("kept", "ch", rdy=5)
        assert c.read_message().body == b"a"
    with s.connect() as c:
        c.sub("topic_only", "new", rdy=5)
        assert sorted(m.body for m in c.read_messages(2)) == [b"b", b"c"]
    # and the rewritten nsqd.dat is whole again
    assert json.loads((tmp_path / "nsqd.dat").read_bytes())["version"] == "1.3.0"


def test_creating_many_topics_coalesces_metadata_writes(
    make_nsqd: MakeNSQD, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import http.client

    s = make_nsqd()
    caplog.set_level(logging.DEBUG, logger="pynsqd")
    conn = http.client.HTTPConnection("127.0.0.1", s.http_port, timeout=10)
    n = 200
    for i in range(n):
        for path in (f"/topic/create?topic=t{i}", f"/channel/create?topic=t{i}&channel=a"):
            conn.request("POST", path)
            assert conn.getresponse().read() == b""
    conn.close()

    def on_disk() -> int:
        try:
            return len(json.loads((tmp_path / "nsqd.dat").read_bytes())["topics"])
        except (OSError, ValueError):
            return -1

    # Written in the background, soon after the burst.
    wait_for(lambda: on_disk() == n, f"the {n} topics in nsqd.dat")
    writes = [r for r in caplog.records if r.getMessage().startswith("NSQ: persisted metadata")]
    assert 1 <= len(writes) < n // 2  # not one (with an fsync) per creation


def test_shutdown_leaves_idle_queues_untouched(make_nsqd: MakeNSQD, tmp_path: Path) -> None:
    s = make_nsqd()
    with s.connect() as c:
        for i in range(20):
            c.pub(f"t{i}", b"x")
    s.stop()  # every queue synced and closed
    metas = sorted(tmp_path.glob("*.diskqueue.meta.dat"))
    assert len(metas) == 20
    inodes = {p: p.stat().st_ino for p in metas}

    s = make_nsqd()
    s.stop()  # nothing happened: no queue needs an fsync or a new metadata file
    assert {p: p.stat().st_ino for p in metas} == inodes
