"""The real ``nsqd`` process: kill -9 with durable flags, SIGTERM with everything in memory."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ..wire import Conn

NSQD = str(Path(sys.executable).with_name("nsqd"))
_LISTENING = re.compile(r"TCP: listening on 127\.0\.0\.1:(\d+)")


class Proc:
    def __init__(self, data: Path, log: Path, *flags: str) -> None:
        self.log = log
        self.log_file = log.open("ab")
        start = log.stat().st_size
        self.p = subprocess.Popen(
            [NSQD, "--tcp-address=127.0.0.1:0", "--http-address=", f"--data-path={data}", *flags],
            stdout=subprocess.DEVNULL,
            stderr=self.log_file,
        )
        deadline = time.monotonic() + 20
        while True:
            m = _LISTENING.search(log.read_text(errors="replace")[start:])
            if m:
                self.port = int(m.group(1))
                return
            assert self.p.poll() is None, log.read_text()
            if time.monotonic() >= deadline:
                pytest.fail(log.read_text())
            time.sleep(0.02)

    def connect(self) -> Conn:
        return Conn(("127.0.0.1", self.port))

    def stop(self, sig: int) -> int:
        self.p.send_signal(sig)
        code = self.p.wait(timeout=20)
        self.log_file.close()
        return code


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
        [NSQD, "--tcp-address=127.0.0.1:0", "--http-address=", f"--data-path={data}"],
        capture_output=True,
        timeout=20,
    )
    assert second.returncode != 0
    assert b"cannot flock directory" in second.stderr
    assert b"possibly in use by another instance of nsqd" in second.stderr
    proc.stop(signal.SIGTERM)
