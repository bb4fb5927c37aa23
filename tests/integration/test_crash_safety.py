"""Nothing acknowledged is lost: crashes at the worst instants, and full disks.

A crash is simulated in two ways. In-process, the data directory is copied at a chosen instant
(every write has reached the kernel, so the copy is what a restart after ``kill -9`` would find)
and a fresh nsqd is started on the copy. With the real process, ``kill -9`` is sent while the
work is under way.
"""

from __future__ import annotations

import http.client
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..conftest import ServerThread
from ..wire import Conn

NSQD = str(Path(sys.executable).with_name("nsqd"))
DURABLE = {"mem_queue_size": 0, "sync_every": 1}


def wait_for(cond: Callable[[], bool], what: str, limit: float = 20) -> None:
    """Poll observable state; the limit only guards against a hang."""
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


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


class Proc:
    """The real nsqd process with TCP and HTTP on port 0."""

    _LISTENING = re.compile(r"(TCP|HTTP): listening on 127\.0\.0\.1:(\d+)")

    def __init__(self, data: Path, log: Path, *flags: str) -> None:
        self.log_file = log.open("ab")
        start = log.stat().st_size
        self.p = subprocess.Popen(
            [
                NSQD,
                "--tcp-address=127.0.0.1:0",
                "--http-address=127.0.0.1:0",
                f"--data-path={data}",
                *flags,
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log_file,
        )
        ports: dict[str, int] = {}

        def listening() -> bool:
            assert self.p.poll() is None, log.read_text()
            text = log.read_text(errors="replace")[start:]
            ports.update((k, int(v)) for k, v in self._LISTENING.findall(text))
            return len(ports) == 2

        wait_for(listening, "nsqd to listen")
        self.port, self.http_port = ports["TCP"], ports["HTTP"]

    def connect(self) -> Conn:
        return Conn(("127.0.0.1", self.port))

    def http(self, method: str, path: str) -> tuple[int, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=10)
        try:
            conn.request(method, path)
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def stats(self) -> dict[str, Any]:
        status, body = self.http("GET", "/stats?format=json")
        assert status == 200
        result: dict[str, Any] = json.loads(body)
        return result

    def stop(self, sig: int) -> int:
        self.p.send_signal(sig)
        code = self.p.wait(timeout=30)
        self.log_file.close()
        return code


@pytest.fixture
def proc_dir(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    data, log = tmp_path / "data", tmp_path / "nsqd.log"
    data.mkdir()
    log.touch()
    yield data, log


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
