"""Nothing acknowledged is lost: crashes at the worst instants, and full disks.

A crash is simulated in two ways. In-process, the data directory is copied at a chosen instant
(every write has reached the kernel, so the copy is what a restart after ``kill -9`` would find)
and a fresh nsqd is started on the copy. With the real process, ``kill -9`` is sent while the
work is under way.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pynsqd.protocol import encode

from ..conftest import ServerThread, http_request
from ..disks import fill, tmpfs
from ..processes import NsqdProcess as Proc
from ..processes import reap_all
from ..waiting import wait_for

NSQD = str(Path(sys.executable).with_name("nsqd"))
DURABLE = {"mem_queue_size": 0, "sync_every": 1}


def snapshot_on_first_call(obj: Any, method: str, src: Path, dst: Path) -> None:
    """Copy ``src`` to ``dst`` when ``obj.method`` is first called, before it runs."""
    original = getattr(obj, method)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if not dst.exists():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.lock"))
        return original(*args, **kwargs)

    setattr(obj, method, wrapper)


def channel_depth(server: ServerThread, topic: str, channel: str) -> int:
    def depth() -> int:
        t = server.nsqd.topics.get(topic)
        ch = t.channels.get(channel) if t else None
        return ch.depth if ch else -1

    return server.call(depth)


# -- 1: a topic's backlog moving to its channels ------------------------------------------------


def test_crash_while_the_backlog_moves_to_channels_loses_nothing(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    n = 5000
    data = tmp_path / "data"
    data.mkdir()
    server = make_nsqd(data_path=str(data), http_address="", **DURABLE)
    with server.connect() as c:
        c.mpub("t", [b"m%05d" % i for i in range(n)])  # no channel yet: all in the topic

    crashed = tmp_path / "crashed"

    def prepare() -> None:
        topic = server.nsqd.topics["t"]
        topic.pause()
        for name in ("a", "b"):
            ch = topic.get_channel(name)
            # the instant the second channel is about to store the first batch
            if name == "b":
                snapshot_on_first_call(ch.queue.backend.dq, "put_many", data, crashed)  # type: ignore[attr-defined]
        topic.unpause()

    server.call(prepare)
    wait_for(lambda: channel_depth(server, "t", "b") == n, "the backlog to reach the channels")
    assert crashed.exists()

    restarted = make_nsqd(data_path=str(crashed), http_address="", **DURABLE)
    for name in ("a", "b"):
        with restarted.connect() as c:
            c.sub("t", name, rdy=1000)
            got: set[bytes] = set()
            while len(got) < n:
                m = c.read_message()  # times out (fails) if a message is missing
                got.add(m.body)
                c.fin(m.id)
        assert got == {b"m%05d" % i for i in range(n)}


@pytest.fixture(autouse=True)
def _no_process_left() -> Iterator[None]:
    """A failing test must not leave its nsqd running."""
    yield
    reap_all()


def consume_all(proc: Proc, topic: str, channel: str, expected: set[bytes]) -> set[bytes]:
    got: set[bytes] = set()
    with proc.connect() as c:
        c.sub(topic, channel, rdy=2000)
        while not expected <= got:
            m = c.read_message()  # times out (fails) if an acknowledged message is missing
            got.add(m.body)
            c.fin(m.id)
    return got


def test_kill_9_while_an_unpaused_backlog_moves_loses_nothing(
    proc_dir: tuple[Path, Path],
) -> None:
    data, log = proc_dir
    flags = ("--mem-queue-size=0", "--sync-every=1")
    rng = random.Random(12)
    expected: set[bytes] = set()
    for cycle in range(3):
        proc = Proc(data, log, *flags)
        assert proc.http("POST", "/topic/create?topic=t")[0] == 200
        assert proc.http("POST", "/channel/create?topic=t&channel=c")[0] == 200
        assert proc.http("POST", "/topic/pause?topic=t")[0] == 200
        with proc.connect() as c:
            for b in range(40):
                batch = [b"c%d-%05d" % (cycle, b * 1000 + i) for i in range(1000)]
                c.mpub("t", batch)
                expected.update(batch)
        proc.http("POST", "/topic/unpause?topic=t")
        time.sleep(rng.uniform(0.005, 0.06))  # the crash lands at a random instant of the move
        proc.stop(signal.SIGKILL)
    proc = Proc(data, log, *flags)
    consume_all(proc, "t", "c", expected)
    proc.stop(signal.SIGTERM)


def test_kill_9_while_large_messages_are_written_loses_nothing_acknowledged(
    proc_dir: tuple[Path, Path],
) -> None:
    # Bodies from 2 kB go to the disk queue from their pieces (pwritev). kill -9 lands at a
    # random instant while MPUBs of 8 kB messages are being written: after a restart every
    # acknowledged message is there, and nothing torn (every body is whole).
    data, log = proc_dir
    flags = ("--mem-queue-size=0", "--sync-every=1")
    rng = random.Random(7)
    acked: set[bytes] = set()
    for cycle in range(3):
        proc = Proc(data, log, *flags)
        assert proc.http("POST", "/topic/create?topic=big")[0] == 200
        assert proc.http("POST", "/channel/create?topic=big&channel=c")[0] == 200

        def publish(cycle: int = cycle, proc: Proc = proc) -> None:
            with contextlib.suppress(Exception), proc.connect() as c:  # ends with the kill
                for b in range(100_000):
                    batch = [b"%d-%06d-" % (cycle, b * 10 + i) + b"x" * 8000 for i in range(10)]
                    c.mpub("big", batch)
                    acked.update(batch)

        writer = threading.Thread(target=publish, daemon=True)
        writer.start()
        enough = 100 * (cycle + 1)
        wait_for(lambda n=enough: len(acked) >= n, "some MPUBs acknowledged")
        time.sleep(rng.uniform(0.0, 0.05))  # the crash lands at a random instant of a write
        proc.stop(signal.SIGKILL)
        writer.join(10)
    proc = Proc(data, log, *flags)
    got = consume_all(proc, "big", "c", set(acked))
    proc.stop(signal.SIGTERM)
    assert all(len(body) == len(body.split(b"-")[0]) + 8 + 8000 for body in got)


# -- 2: in-flight messages handed back when their consumer leaves ---------------------------------


def test_messages_of_a_departed_consumer_respect_the_memory_bound(
    proc_dir: tuple[Path, Path],
) -> None:
    data, log = proc_dir
    flags = ("--mem-queue-size=0", "--sync-every=1")
    proc = Proc(data, log, *flags)
    bodies = [b"m%04d" % i for i in range(1000)]
    with proc.connect() as c:
        c.mpub("t", bodies)
    consumer = proc.connect()
    consumer.sub("t", "c", rdy=1000)
    consumer.read_messages(1000)  # all in flight
    consumer.close()  # gone without FIN: they are handed back at once

    def handed_back() -> bool:
        ch = proc.stats()["topics"][0]["channels"][0]
        return bool(ch["depth"] == 1000 and ch["in_flight_count"] == 0)

    wait_for(handed_back, "the in-flight messages to be requeued")
    ch = proc.stats()["topics"][0]["channels"][0]
    assert ch["requeue_count"] == 1000  # counted as requeued, as the consumer never FIN'd them
    proc.stop(signal.SIGKILL)

    proc = Proc(data, log, *flags)
    consume_all(proc, "t", "c", set(bodies))
    proc.stop(signal.SIGTERM)


# -- 3: consumers that never read ------------------------------------------------------------


def test_a_consumer_that_never_reads_pins_a_bounded_amount(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    server = make_nsqd(max_msg_size=2 << 20, max_body_size=4 << 20)
    body = b"x" * (1 << 20)
    n = 64
    with server.connect() as pub:
        pub.sub("t", "c")  # the channel exists: the backlog waits there
        for _ in range(n):
            pub.pub("t", body)
    stuck = []
    try:
        for _ in range(2):
            c = server.connect()
            c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            c.sub("t", "c", rdy=1000)  # a window of 1000 MiB, and it never reads
            stuck.append(c)
        _check_pinned(server, n)
    finally:
        for c in stuck:
            c.close()
    wait_for(
        lambda: server.call(lambda: server.nsqd.topics["t"].channels["c"].depth) == n,
        "the messages to return to the channel",
    )
    # and another consumer gets them all
    with server.connect() as c:
        c.sub("t", "c", rdy=4)
        for _ in range(n):
            m = c.read_message()
            c.fin(m.id)


def _check_pinned(server: ServerThread, n: int) -> None:
    def pinned() -> tuple[int, int, int]:
        ch = server.nsqd.topics["t"].channels["c"]
        clients = [server.nsqd.clients[cid] for cid in ch.clients]
        held = sum(c.transport.get_write_buffer_size() + c._out_bytes for c in clients)  # type: ignore[union-attr]
        return len(ch.in_flight), held, ch.depth

    wait_for(lambda: server.call(pinned)[0] > 0, "delivery to start")
    wait_for(
        lambda: all(c.write_paused for c in server.nsqd.clients.values() if c.channel),
        "back-pressure",
    )
    in_flight, held, depth = server.call(pinned)
    # each holds about the 4 MiB high-water mark plus one message, not its whole RDY window
    # (the kernel socket buffers take a few more)
    assert in_flight <= 2 * 12, in_flight
    assert held <= 2 * 6 * (1 << 20), held
    assert depth == n - in_flight  # the rest waits in the channel


# -- 6: a corrupt due time in the deferred side file ---------------------------------------------


def test_an_out_of_range_due_time_is_quarantined_and_shutdown_flushes_the_rest(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    data = tmp_path / "data"
    data.mkdir()
    first = make_nsqd(data_path=str(data), http_address="")
    with first.connect() as c:
        c.sub("t1", "c")
        c.dpub("t1", 60_000, b"deferred")
        wait_for(
            lambda: first.call(lambda: len(first.nsqd.topics["t1"].channels["c"].deferred)) == 1,
            "DPUB",
        )
    first.stop()
    side = data / "t1:c.diskqueue.deferred.dat"
    record = side.read_bytes()
    assert len(record) == 24
    side.write_bytes(record[:16] + struct.pack(">q", 2**63 - 1))  # ~year 2262: corrupt

    second = make_nsqd(data_path=str(data), http_address="")
    with second.connect() as c:
        c.sub("t1", "c", rdy=1)
        m = c.read_message()  # delivered at once rather than in 240 years
        assert m.body == b"deferred"
        c.req(m.id, 60_000)  # deferred again, properly this time
    with second.connect() as c:
        c.mpub("t2", [b"m%04d" % i for i in range(5000)])  # memory only, no channel
    assert (data / "t1:c.diskqueue.deferred.dat.bad").exists()
    second.stop()

    third = make_nsqd(data_path=str(data), http_address="")
    assert third.call(lambda: third.nsqd.topics["t2"].depth) == 5000
    assert third.call(lambda: len(third.nsqd.topics["t1"].channels["c"].queue)) == 1


# -- 7, 8: a full disk -------------------------------------------------------------------------


def test_ping_recovers_once_the_disk_has_room_again(
    make_nsqd: Callable[..., ServerThread], small_disk: Path
) -> None:
    server = make_nsqd(data_path=str(small_disk), mem_queue_size=0)
    with server.connect() as c:
        c.pub("t", b"before")
    filler = fill(small_disk)
    with server.connect() as c:
        c.send(b"PUB t\n" + struct.pack(">l", 4096) + b"x" * 4096)
        err = c.read_frame()
        assert err.data.startswith(b"E_PUB_FAILED"), err
    assert http_request(server, "GET", "/ping")[0] == 500
    filler.unlink()
    with server.connect() as c:
        c.pub("t", b"after")  # publishing works again
    assert http_request(server, "GET", "/ping") == (200, b"OK")


def test_a_large_mpub_on_a_filling_disk_leaves_no_partial_record(
    make_nsqd: Callable[..., ServerThread], small_disk: Path
) -> None:
    # Large messages go to the disk queue from their pieces (pwritev). With room for part of
    # the batch the write comes up short: the publish fails whole, nothing half-written stays
    # in the queue, and what was published before and after is delivered, once.
    server = make_nsqd(data_path=str(small_disk), mem_queue_size=0)
    before = [b"b%03d" % i + b"." * 8000 for i in range(5)]
    after = [b"a%03d" % i + b"." * 8000 for i in range(5)]
    with server.connect() as c:
        c.mpub("t", before)
    filler = fill(small_disk)
    os.truncate(filler, os.path.getsize(filler) - 200_000)  # room for about 24 of the 100
    with server.connect() as c:
        c.send(encode.mpub("t", [b"x%03d" % i + b"." * 8000 for i in range(100)]))
        assert c.read_error().startswith(b"E_MPUB_FAILED")
    filler.unlink()
    with server.connect() as c:
        c.mpub("t", after)
    with server.connect() as consumer:
        consumer.sub("t", "c", rdy=100)
        got = [m.body for m in consumer.read_messages(10)]
        # Nothing else to deliver: no partial record left behind (server state, not a wait).
        stats = json.loads(http_request(server, "GET", "/stats?format=json&topic=t")[1])
        channel = stats["topics"][0]["channels"][0]
        assert (channel["depth"], channel["in_flight_count"]) == (0, 10)
    assert got == before + after


def test_messages_coming_due_on_a_full_disk_are_kept(
    make_nsqd: Callable[..., ServerThread], small_disk: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = make_nsqd(data_path=str(small_disk), mem_queue_size=0)
    with server.connect() as p:
        # Bodies large enough that no batch of them fits in what a file's last page has left.
        pad = b"." * 300
        p.mpub(
            "t",
            [b"timeout-%02d" % i + pad for i in range(20)]
            + [b"req-%02d" % i + pad for i in range(20)],
        )
    consumer = server.connect(msg_timeout=1000)
    consumer.sub("t", "c", rdy=100)
    first = consumer.read_messages(40)
    with server.connect() as p:
        for i in range(20):
            p.dpub("t", 300, b"dpub-%02d" % i)
    fill(small_disk)
    for m in first:
        if m.body.startswith(b"req"):
            consumer.req(m.id, 200)
    # the timed-out, REQ-deferred and DPUB messages come due while nothing can be written
    got = {m.body for m in consumer.read_messages(60)}
    assert got == {m.body for m in first} | {b"dpub-%02d" % i for i in range(20)}
    consumer.close()
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
    stats = json.loads(http_request(server, "GET", "/stats?format=json")[1])
    # The 20 REQ'd after the disk was full came due on it (the timeouts and DPUBs may have
    # come due before: filling it took longer than 300 ms on a loaded machine).
    assert stats["topics"][0]["channels"][0]["overflow_count"] >= 20


# -- issue 13: a data path that cannot be written ------------------------------------------------


def test_an_unwritable_data_path_stops_start_up_with_one_line(tmp_path: Path) -> None:
    with tmpfs(tmp_path / "ro", "ro,size=1m") as data:
        proc = subprocess.run(
            [NSQD, "--tcp-address=127.0.0.1:0", "--http-address=", f"--data-path={data}"],
            capture_output=True,
            timeout=30,
        )
    assert proc.returncode != 0
    err = proc.stderr.decode()
    assert f"data path {data} is not writable - Read-only file system" in err
    assert "Traceback" not in err
