"""The real ``nsqd`` process: kill -9 with durable flags, SIGTERM with everything in memory."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

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
