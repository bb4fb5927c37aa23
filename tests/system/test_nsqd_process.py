"""The real ``nsqd`` process: unix sockets, its listening lines, and data directories in Go
nsqd 1.3.0's format written and read by code independent of ours (this file's own encoder)."""

from __future__ import annotations

import http.client
import json
import re
import socket
import struct
import time
from pathlib import Path

from ..processes import ServerProcess
from ..wire import Conn


class Proc(ServerProcess):
    """nsqd started with ``flags``; ``lines`` maps 'TCP'/'HTTP' to the address it logged."""

    def __init__(self, tmp: Path, *flags: str) -> None:
        want = ("TCP",) if "--http-address=" in flags else ("TCP", "HTTP")
        log = tmp / f"nsqd-{time.monotonic_ns()}.log"
        log.touch()
        super().__init__("nsqd", *flags, log=log, want=want, cwd=tmp)
        self.lines = self.addresses


def test_tcp_and_http_on_unix_sockets(tmp_path: Path) -> None:
    tcp_sock, http_sock = str(tmp_path / "nsqd.sock"), str(tmp_path / "http.sock")
    proc = Proc(
        tmp_path,
        f"--tcp-address={tcp_sock}",
        f"--http-address={http_sock}",
        f"--data-path={tmp_path}",
    )
    try:
        assert proc.lines == {"TCP": tcp_sock, "HTTP": http_sock}
        with Conn(tcp_sock) as pub, Conn(tcp_sock) as sub:
            sub.sub("t", "c", rdy=1)
            pub.pub("t", b"over a unix socket")
            assert sub.read_message().body == b"over a unix socket"
        # /info reports ports as -1 for unix sockets.
        s = socket.socket(socket.AF_UNIX)
        s.connect(http_sock)
        conn = http.client.HTTPConnection("localhost")
        conn.sock = s
        conn.request("GET", "/info")
        info = json.loads(conn.getresponse().read())
        conn.close()
        assert (info["tcp_port"], info["http_port"]) == (-1, -1)
    finally:
        assert proc.stop() == 0


def test_listening_lines_name_the_bound_ports(tmp_path: Path) -> None:
    proc = Proc(tmp_path, "--tcp-address=127.0.0.1:0", "--http-address=127.0.0.1:0")
    try:
        for what in ("TCP", "HTTP"):
            assert re.fullmatch(r"127\.0\.0\.1:[1-9]\d*", proc.lines[what])
        host, port = proc.lines["TCP"].split(":")
        with Conn((host, int(port))) as c:
            c.pub("t", b"x")
    finally:
        assert proc.stop() == 0
    # data path "" is the working directory, as in nsqd
    assert (tmp_path / "nsqd.dat").exists()


# -- Go's formats, written and read here independently of pynsqd's own code ------------------


def _record(msg_id: bytes, body: bytes, ts: int, attempts: int) -> bytes:
    payload = struct.pack(">qH", ts, attempts) + msg_id + body
    return struct.pack(">i", len(payload)) + payload


def _write_queue(data: Path, name: str, files: list[list[bytes]]) -> None:
    """A go-diskqueue as Go would leave it after a clean close: data files plus metadata."""
    depth = 0
    for num, records in enumerate(files):
        (data / f"{name}.diskqueue.{num:06d}.dat").write_bytes(b"".join(records))
        depth += len(records)
    last = len(b"".join(files[-1]))
    meta = f"{depth}\n0,0\n{len(files) - 1},{last}\n"
    (data / f"{name}.diskqueue.meta.dat").write_text(meta)


def _read_queue(data: Path, name: str) -> list[tuple[bytes, bytes, int]]:
    """Every unread record of a go-diskqueue, per its metadata: (id, body, attempts)."""
    lines = (data / f"{name}.diskqueue.meta.dat").read_text().split("\n")
    depth = int(lines[0])
    read_num, read_pos = map(int, lines[1].split(","))
    write_num, write_pos = map(int, lines[2].split(","))
    out = []
    for num in range(read_num, write_num + 1):
        buf = (data / f"{name}.diskqueue.{num:06d}.dat").read_bytes()
        pos = read_pos if num == read_num else 0
        end = write_pos if num == write_num else len(buf)
        while pos < end:
            (size,) = struct.unpack_from(">i", buf, pos)
            _, attempts = struct.unpack_from(">qH", buf, pos + 4)
            out.append((buf[pos + 14 : pos + 30], buf[pos + 30 : pos + 4 + size], attempts))
            pos += 4 + size
    assert len(out) == depth
    return out


def test_reads_a_data_directory_in_go_nsqd_format(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    ts = time.time_ns()
    topic_files = [
        [_record(b"%016x" % i, b"topic-%d" % i, ts, 0) for i in range(0, 3)],
        [_record(b"%016x" % i, b"topic-%d" % i, ts, 0) for i in range(3, 5)],  # a rolled file
    ]
    _write_queue(data, "legacy", topic_files)
    channel = [_record(b"%016x" % (100 + i), b"chan-%d" % i, ts, 3) for i in range(4)]
    _write_queue(data, "legacy:ch", [channel])
    (data / "nsqd.dat").write_text(
        json.dumps(
            {
                "topics": [
                    {
                        "name": "legacy",
                        "paused": False,
                        "channels": [{"name": "ch", "paused": False}],
                    },
                    {"name": "paused_topic", "paused": True, "channels": None},
                ],
                "version": "1.3.0",
            }
        )
    )
    proc = Proc(tmp_path, "--tcp-address=127.0.0.1:0", "--http-address=", f"--data-path={data}")
    try:
        host, port = proc.lines["TCP"].split(":")
        with Conn((host, int(port))) as c:
            c.sub("legacy", "ch", rdy=100)
            got = {m.body: m for m in c.read_messages(9)}
            c.expect_nothing(0.3)
        assert set(got) == {b"topic-%d" % i for i in range(5)} | {b"chan-%d" % i for i in range(4)}
        assert all(got[b"chan-%d" % i].attempts == 4 for i in range(4))  # 3 before, +1 now
        assert all(got[b"topic-%d" % i].attempts == 1 for i in range(5))
        assert got[b"chan-0"].id == b"%016x" % 100  # IDs survive as they were
    finally:
        assert proc.stop() == 0
    saved = json.loads((data / "nsqd.dat").read_text())
    assert saved["version"] == "1.3.0"
    assert {t["name"]: t["paused"] for t in saved["topics"]} == {
        "legacy": False,
        "paused_topic": True,
    }


def test_leaves_a_data_directory_go_nsqd_can_read(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    flags = ["--tcp-address=127.0.0.1:0", "--http-address=", f"--data-path={data}"]
    proc = Proc(tmp_path, *flags, "--mem-queue-size=2")
    try:
        host, port = proc.lines["TCP"].split(":")
        with Conn((host, int(port))) as c:
            c.mpub("waiting", [b"w%d" % i for i in range(5)])  # no channel: kept by the topic
            c.sub("consumed", "ch", rdy=1)
        with Conn((host, int(port))) as c:
            c.mpub("consumed", [b"c%d" % i for i in range(3)])
    finally:
        assert proc.stop() == 0
    waiting = _read_queue(data, "waiting")
    # memory messages are flushed behind those already on disk at exit: no order, as in nsqd
    assert sorted(body for _, body, _ in waiting) == [b"w%d" % i for i in range(5)]
    assert all(re.fullmatch(rb"[0-9a-f]{16}", mid) for mid, _, _ in waiting)
    in_channel = _read_queue(data, "consumed:ch")
    assert sorted(body for _, body, _ in in_channel) == [b"c0", b"c1", b"c2"]
    saved = json.loads((data / "nsqd.dat").read_text())
    saved["topics"].sort(key=lambda t: t["name"])  # Go writes them in map order
    assert saved == {
        "topics": [
            {"name": "consumed", "paused": False, "channels": [{"name": "ch", "paused": False}]},
            {"name": "waiting", "paused": False, "channels": None},
        ],
        "version": "1.3.0",
    }
