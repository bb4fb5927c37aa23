"""The real ``nsqd`` process: kill -9 with durable flags, SIGTERM with everything in memory."""

from __future__ import annotations

import contextlib
import random
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from ..processes import BIN, ServerProcess
from ..wire import Conn


class Proc(ServerProcess):
    def __init__(self, data: Path, log: Path, *flags: str) -> None:
        super().__init__(
            "nsqd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=",
            f"--data-path={data}",
            *flags,
            log=log,
            want=("TCP",),
        )
        self.port = self.port_of("TCP")

    def connect(self) -> Conn:
        return Conn(("127.0.0.1", self.port))


def test_kill_9_loses_no_acknowledged_message(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "nsqd.log"
    data.mkdir()
    log.touch()
    flags = ("--mem-queue-size=0", "--sync-every=1")
    proc = Proc(data, log, *flags)
    acked: list[bytes] = []
    done = threading.Event()

    def publish() -> None:
        try:
            with proc.connect() as c:
                i = 0
                while True:
                    if i % 2:
                        batch = [b"msg-%06d" % (i + k) for k in range(5)]
                        c.mpub("t", batch)
                        acked.extend(batch)
                        i += 5
                    else:
                        c.pub("t", b"msg-%06d" % i)
                        acked.append(b"msg-%06d" % i)
                        i += 1
        except (ConnectionError, OSError, AssertionError):
            pass
        finally:
            done.set()

    publisher = threading.Thread(target=publish)
    publisher.start()
    deadline = time.monotonic() + 20
    while len(acked) < 300 and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.stop(signal.SIGKILL)  # mid-stream
    assert done.wait(10)
    publisher.join()
    assert len(acked) >= 300

    proc = Proc(data, log, *flags)
    got: set[bytes] = set()
    with proc.connect() as c:
        c.sub("t", "c", rdy=1000)
        while not set(acked) <= got:
            m = c.read_message()  # times out (fails) if an acknowledged message is missing
            got.add(m.body)
            c.fin(m.id)
    proc.stop(signal.SIGTERM)


def test_sigterm_keeps_memory_in_flight_and_deferred(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "nsqd.log"
    data.mkdir()
    log.touch()
    proc = Proc(data, log)
    consumer = proc.connect()
    consumer.sub("t", "c", rdy=2)
    with proc.connect() as c:
        c.mpub("t", [b"m%02d" % i for i in range(20)])
        c.dpub("t", 2500, b"deferred")
    due = time.time() + 2.5
    in_flight = consumer.read_messages(2)
    consumer.req(in_flight[0].id, 2500)  # deferred by REQ, due about when the DPUB is
    in_flight.append(consumer.read_message())
    assert proc.stop(signal.SIGTERM) == 0
    consumer.close()
    assert "NSQ: bye" in log.read_text()

    proc = Proc(data, log)
    restarted = time.time()
    with proc.connect() as c:
        c.sub("t", "c", rdy=100)
        got = c.read_messages(21)
        arrived = time.time()
    proc.stop(signal.SIGTERM)
    bodies = [m.body for m in got]
    assert sorted(bodies) == sorted([b"m%02d" % i for i in range(20)] + [b"deferred"])
    attempts = {m.body: m.attempts for m in got}
    assert {b for b, a in attempts.items() if a == 2} == {m.body for m in in_flight}
    # the deferred ones come not before they are due (they kept their due time), so after the
    # others when the restart was quick
    assert arrived >= due - 0.05
    if restarted < due - 0.5:
        assert set(bodies[-2:]) == {b"deferred", in_flight[0].body}


def test_second_instance_on_the_same_directory_exits(tmp_path: Path) -> None:
    data, log = tmp_path / "data", tmp_path / "nsqd.log"
    data.mkdir()
    log.touch()
    proc = Proc(data, log)
    second = subprocess.run(
        [str(BIN / "nsqd"), "--tcp-address=127.0.0.1:0", "--http-address=", f"--data-path={data}"],
        capture_output=True,
        timeout=20,
    )
    assert second.returncode != 0
    assert b"cannot flock directory" in second.stderr
    assert b"possibly in use by another instance of nsqd" in second.stderr
    proc.stop(signal.SIGTERM)


@pytest.mark.parametrize("kind", ["plain", "retained"])
def test_kill_9_keeps_messages_in_flight_and_requeued_with_durable_flags(
    tmp_path: Path, kind: str
) -> None:
    """``--mem-queue-size=0``: a message delivered and not finished when the process is
    killed is delivered again after the restart, with its ID and its attempts counted; one
    finished before the kill is not; one REQ'd with a timeout comes back too, at its due time
    (Go nsqd loses both kinds: nsqio/nsq#1142, #1386). The same on a retained topic, whose
    log hands its messages to the channel's queue."""
    data, log = tmp_path / "data", tmp_path / "nsqd.log"
    data.mkdir()
    log.touch()
    flags: tuple[str, ...] = ("--mem-queue-size=0", "--sync-every=1")
    if kind == "retained":
        flags += ("--retention-time=1h",)
    proc = Proc(data, log, *flags)
    bodies = [b"m%02d" % i for i in range(30)]
    with proc.connect() as c:
        c.mpub("t", bodies)
    consumer = proc.connect()
    consumer.sub("t", "c", rdy=10)
    first = consumer.read_messages(10)
    consumer.req(first[0].id, 2500)  # deferred: the oldest is not done
    due = time.time() + 2.5
    for m in first[1:5]:
        consumer.fin(m.id)  # finished after it: each must be remembered as done
    more = consumer.read_messages(5)  # room for 5 more: the FINs and the REQ were taken
    in_flight = first[5:] + more
    proc.stop(signal.SIGKILL)
    consumer.close()

    proc = Proc(data, log, *flags)
    finished = {m.body for m in first[1:5]}
    with proc.connect() as c:
        c.sub("t", "c", rdy=100)
        got = []
        arrived: dict[bytes, float] = {}
        for _ in range(26):
            got.append(c.read_message())
            arrived[got[-1].body] = time.time()
        with proc.connect() as p:
            p.pub("t", b"end")
        assert c.read_message().body == b"end"  # nothing else comes: the finished ones stay done
    proc.stop(signal.SIGTERM)
    assert sorted(m.body for m in got) == sorted(set(bodies) - finished)
    again = {m.body: m for m in got}
    for m in in_flight:
        assert again[m.body].id == m.id
        assert again[m.body].attempts == 2, m.body
    assert again[first[0].body].attempts == 2  # the REQ'd one, not before its due time
    assert arrived[first[0].body] >= due - 0.05


def test_kill_9_at_random_instants_loses_no_message_not_finished(tmp_path: Path) -> None:
    """Durable flags, three kill -9 at random instants while a publisher writes and a consumer
    finishes some messages, requeues some and holds the rest: after the last restart every
    acknowledged message that was never FIN'd is delivered (a FIN may be lost with the
    process, so a FIN'd one may come again; none may be missing)."""
    data, log = tmp_path / "data", tmp_path / "nsqd.log"
    data.mkdir()
    log.touch()
    flags = ("--mem-queue-size=0", "--sync-every=1", "--max-bytes-per-file=20000")
    rng = random.Random()
    acked: set[bytes] = set()
    fin_sent: set[bytes] = set()
    for cycle in range(3):
        proc = Proc(data, log, *flags)

        def publish(cycle: int = cycle, proc: Proc = proc) -> None:
            with contextlib.suppress(OSError, AssertionError), proc.connect() as c:
                for i in range(100_000):
                    body = b"c%d-%06d" % (cycle, i)
                    c.pub("t", body)
                    acked.add(body)

        def consume(proc: Proc = proc) -> None:
            with contextlib.suppress(OSError, AssertionError), proc.connect() as c:
                c.sub("t", "c", rdy=25)
                while True:
                    m = c.read_message()
                    roll = rng.random()
                    if roll < 0.6:
                        fin_sent.add(m.body)
                        c.fin(m.id)
                    elif roll < 0.8:
                        c.req(m.id, rng.choice([0, 0, 1500]))
                    # else held: in flight until the kill

        threads = [threading.Thread(target=publish), threading.Thread(target=consume)]
        for t in threads:
            t.start()
        kill_at = len(acked) + rng.randrange(100, 400)
        deadline = time.monotonic() + 60
        while len(acked) < kill_at and time.monotonic() < deadline:
            time.sleep(0.002)
        proc.stop(signal.SIGKILL)
        for t in threads:
            t.join(30)
        assert len(acked) >= kill_at

    proc = Proc(data, log, *flags)
    missing = set(acked) - fin_sent
    with proc.connect() as c:
        c.sub("t", "c", rdy=500)
        while missing:
            m = c.read_message()  # times out (fails) while an unfinished message is missing
            missing.discard(m.body)
            c.fin(m.id)
    proc.stop(signal.SIGTERM)


def test_kill_9_keeps_a_deferred_publish_with_durable_flags(tmp_path: Path) -> None:
    """``--mem-queue-size=0``: a DPUB acknowledged to its publisher and not yet due when the
    process is killed is delivered after the restart, not before its due time (Go nsqd keeps
    it in memory only)."""
    data, log = tmp_path / "data", tmp_path / "nsqd.log"
    data.mkdir()
    log.touch()
    flags = ("--mem-queue-size=0", "--sync-every=1")
    proc = Proc(data, log, *flags)
    consumer = proc.connect()
    consumer.sub("t", "c", rdy=5)  # the channel exists, with a consumer ready
    with proc.connect() as c:
        c.dpub("t", 4000, b"later")  # due well after "now" arrives, even on a loaded machine
    due = time.time() + 4.0
    c = proc.connect()
    c.pub("t", b"now")  # answered after the DPUB was taken: it is in the channel
    c.close()
    assert consumer.read_message().body == b"now"
    proc.stop(signal.SIGKILL)
    consumer.close()

    proc = Proc(data, log, *flags)
    with proc.connect() as c:
        c.sub("t", "c", rdy=5)
        m = c.read_message()
        if m.body == b"now":  # in flight at the kill (not finished): it comes again first
            m = c.read_message()
        arrived = time.time()
    proc.stop(signal.SIGTERM)
    assert m.body == b"later"
    assert arrived >= due - 0.05
