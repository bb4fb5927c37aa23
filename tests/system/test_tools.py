"""The NSQ command-line tools (``to_nsq``, ``nsq_tail``) as processes, against a real pynsqd,
directly and through a real nsqlookupd."""

from __future__ import annotations

import base64
import contextlib
import http.server
import json
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from queue import Queue
from typing import IO, Any

import pytest

from pynsqd.client import ClientOptions, Connection, lookup_topics

from ..conftest import ServerThread, http_request
from ..integration.lookupd_helpers import LookupdThread
from ..integration.secure_client import Certs
from ..integration.servers import BIN, tool
from ..processes import NsqdProcess as Proc
from ..processes import free_port
from ..waiting import wait_for


def test_to_nsq_then_nsq_tail(nsqd: ServerThread) -> None:
    addr = f"127.0.0.1:{nsqd.tcp_port}"
    res = tool("to_nsq", "--topic=logs", f"--nsqd-tcp-address={addr}", stdin=b"a\nb\n\nc")
    assert res.returncode == 0, res.stderr
    assert res.stderr == b"to_nsq: published 3 messages to logs\n"  # the empty line is skipped
    res = tool("nsq_tail", "--topic=logs", "--channel=c", f"--nsqd-tcp-address={addr}", "--n=3")
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"a\nb\nc\n"
    ch = nsqd.call(lambda: nsqd.nsqd.topics["logs"].channels["c"])
    assert nsqd.call(lambda: (ch.depth, ch.message_count)) == (0, 3)


def test_to_nsq_says_how_many_records_were_acknowledged_when_one_is_refused(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    """Issue 54: a failed run did not say how far it got (what to publish again)."""
    nsqd = make_nsqd(max_msg_size=16)
    addr = f"--nsqd-tcp-address=127.0.0.1:{nsqd.tcp_port}"
    res = tool("to_nsq", "--topic=t", addr, stdin=b"a\nb\n" + b"x" * 40 + b"\nc\n")
    assert res.returncode == 1
    (line,) = res.stderr.decode().splitlines()
    assert line.startswith("to_nsq: E_BAD_MESSAGE"), line
    assert line.endswith("(record 3: not acknowledged; the 2 records before it were)"), line
    assert nsqd.call(lambda: nsqd.nsqd.topics["t"].message_count) == 2


def test_to_nsq_says_how_many_records_were_acknowledged_when_its_connection_drops(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    """Issue 54: when the connection dropped, the run did not say how far it got."""
    nsqd = make_nsqd()
    command = [sys.executable, "-m", "pynsqd.tools.to_nsq", "--topic=t"]
    proc = subprocess.Popen(
        [*command, f"--nsqd-tcp-address=127.0.0.1:{nsqd.tcp_port}"],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stderr is not None
    try:
        proc.stdin.write(b"a\nb\nc\n")
        proc.stdin.flush()
        topics = nsqd.nsqd.topics
        wait_for(
            lambda: nsqd.call(lambda: "t" in topics and topics["t"].message_count == 3),
            "three records published",
        )
        nsqd.stop()  # the node goes away: its connections drop
        proc.stdin.write(b"d\ne\n")
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.communicate()
    assert proc.returncode == 1
    (line,) = err.decode().splitlines()
    assert line.endswith("(record 4: not acknowledged; the 3 records before it were)"), line


def test_nsq_tail_says_a_nodes_connection_error_once_while_it_retries(tmp_path: Path) -> None:
    """Issue 54: through nsqlookupd, a dead node still listed was retried every 15 s with an
    error line each time (go-nsq stays quiet). The error is said once; the retries go on. The
    node here accepts and closes each connection (so each attempt is seen and fails alike); the
    lookup answer lists it, as nsqlookupd lists a node until it has timed out."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted = []

    def refuse() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(1)
            conn.close()

    answer = json.dumps(
        {
            "channels": [],
            "producers": [
                {
                    "remote_address": f"127.0.0.1:{port}",
                    "hostname": "dead",
                    "broadcast_address": "127.0.0.1",
                    "tcp_port": port,
                    "http_port": 1,
                    "version": "1.3.0",
                }
            ],
        }
    ).encode()

    class Lookup(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: object) -> None:
            pass

    lookupd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Lookup)
    threading.Thread(target=refuse, daemon=True).start()
    threading.Thread(target=lookupd.serve_forever, daemon=True).start()
    lookup = f"--lookupd-http-address=127.0.0.1:{lookupd.server_address[1]}"
    err = (tmp_path / "err").open("w+b")
    proc = subprocess.Popen(
        [str(BIN / "nsq_tail"), "--topic=t", lookup], stdout=subprocess.DEVNULL, stderr=err
    )
    try:
        wait_for(lambda: len(accepted) >= 3, "three attempts to connect", 30)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        listener.close()
        lookupd.shutdown()
        lookupd.server_close()
    err.seek(0)
    said = [line for line in err.read().decode().splitlines() if f"127.0.0.1:{port}" in line]
    err.close()
    assert len(said) == 1, said


def test_to_nsq_delimiter_and_every_destination(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    one, two = make_nsqd(data_path=str(tmp_path / "a")), make_nsqd(data_path=str(tmp_path / "b"))
    args = [f"--nsqd-tcp-address=127.0.0.1:{s.tcp_port}" for s in (one, two)]
    res = tool("to_nsq", "--topic=t", "--delimiter=,", *args, stdin=b"x,y,z")
    assert res.returncode == 0, res.stderr
    for server in (one, two):  # as Go's to_nsq: every record to every nsqd
        assert server.call(lambda s=server: s.nsqd.topics["t"].message_count) == 3


def test_nsq_tail_tails_every_topic_given(nsqd: ServerThread) -> None:
    """Found by a new user (issue 41): ``--topic=a --topic=b`` tailed only b, silently (Go
    tails both)."""
    addr = f"127.0.0.1:{nsqd.tcp_port}"
    for topic in ("a", "b"):  # the channel exists before the messages (a fixed channel)
        with nsqd.connect() as c:
            c.sub(topic, "tail", rdy=0)
    with nsqd.connect() as p:
        p.pub("a", b"one")
        p.pub("b", b"two")
    res = tool(
        "nsq_tail",
        "--topic=a",
        "--topic=b",
        "--channel=tail",
        f"--nsqd-tcp-address={addr}",
        "--n=2",
        "--print-topic",
    )
    assert res.returncode == 0, res.stderr
    assert sorted(res.stdout.splitlines()) == [b"a | one", b"b | two"]


@pytest.mark.parametrize(
    ("name", "args", "line"),
    [
        ("to_nsq", ["--topic=bad topic!"], b"to_nsq: --topic: invalid topic name 'bad topic!'"),
        ("nsq_tail", ["--topic=bad topic!"], b"nsq_tail: --topic: invalid topic name"),
        ("nsq_tail", ["--topic=t", "--channel=c h"], b"nsq_tail: --channel: invalid channel"),
    ],
)
def test_a_bad_name_is_named_before_anything_is_sent(
    nsqd: ServerThread, name: str, args: list[str], line: bytes
) -> None:
    """Found by a new user (issue 41): ``to_nsq --topic='bad topic!'`` published to ``bad``
    and said "published 1 messages to bad topic!"; nsq_tail blamed ``E_BAD_CHANNEL
    "topic!"``."""
    res = tool(name, *args, f"--nsqd-tcp-address=127.0.0.1:{nsqd.tcp_port}", stdin=b"x\n")
    assert res.returncode == 1
    assert res.stderr.startswith(line) and res.stderr.count(b"\n") == 1, res.stderr
    assert nsqd.call(lambda: sorted(nsqd.nsqd.topics)) == []  # nothing was published


def test_nsq_log_says_how_to_get_a_log_for_a_topic_without_one(nsqd: ServerThread) -> None:
    """Found by a new user (issue 41): raw ``HTTP 400 {"message":"TOPIC_NOT_RETAINED"}``."""
    with nsqd.connect() as p:
        p.pub("plain", b"x")
    res = tool("nsq_log", "--topic=plain", f"--nsqd-http-address=127.0.0.1:{nsqd.http_port}")
    assert res.returncode == 1
    assert res.stderr.startswith(b"nsq_log: topic plain keeps no log on 127.0.0.1:")
    assert b"--retention-time" in res.stderr and res.stderr.count(b"\n") == 1, res.stderr


def test_nsq_tail_finds_the_nodes_through_nsqlookupd(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    lookupd = LookupdThread()
    try:
        host, port = lookupd.tcp_address
        server = make_nsqd(lookupd_tcp_addresses=[f"{host}:{port}"], broadcast_address="127.0.0.1")
        with server.connect() as c:
            c.mpub("t", [b"one", b"two"])
        res = tool(
            "nsq_tail",
            "--topic=t",
            f"--lookupd-http-address={lookupd.http_url.removeprefix('http://')}",
            "--n=2",
            "--print-topic",
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout == b"t | one\nt | two\n"
    finally:
        lookupd.stop()


@pytest.mark.parametrize(
    ("name", "args", "code", "line"),
    [
        ("to_nsq", ["--bogus"], 2, b"to_nsq: flag provided but not defined: -bogus\n"),
        ("to_nsq", ["--nsqd-tcp-address=127.0.0.1:1"], 1, b"to_nsq: --topic required\n"),
        ("nsq_tail", ["--topic=t"], 1, b"nsq_tail: use --nsqd-tcp-address or"),
        (
            "nsq_tail",
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:1"],
            1,
            b"nsq_tail: cannot connect",
        ),
        ("nsq_to_http", ["--topic=t", "--nsqd-tcp-address=h:1"], 1, b"nsq_to_http: --get or"),
        (
            "nsq_to_http",
            ["--topic=t", "--nsqd-tcp-address=h:1", "--get=http://h/x"],
            1,
            b"nsq_to_http: --get=http://h/x: the URL needs a %s",
        ),
        (
            "nsq_to_http",
            ["--topic=t", "--nsqd-tcp-address=h:1", "--post=http://h/", "--header=bad"],
            1,
            b"nsq_to_http: --header=bad: expected Name: value",
        ),
    ],
)
def test_bad_input_is_one_line(name: str, args: list[str], code: int, line: bytes) -> None:
    res = tool(name, *args)
    assert res.returncode == code
    assert res.stderr.startswith(line) and res.stderr.count(b"\n") == 1, res.stderr


def test_nsq_stat_prints_gos_columns(nsqd: ServerThread) -> None:
    with nsqd.connect() as c:
        c.sub("t", "c", rdy=0)
        with nsqd.connect() as p:
            p.mpub("t", [b"a"] * 7)
        res = tool(
            "nsq_stat",
            "--topic=t",
            "--channel=c",
            f"--nsqd-http-address=127.0.0.1:{nsqd.http_port}",
            "--interval=100ms",
            "--count=1",
        )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.decode().splitlines()
    assert lines[0] == (
        "------rate------+----------------depth----------------+"
        "--------------metadata---------------"
    )
    header = "ingress egress | total mem disk inflt def | req t-o msgs clients"
    assert lines[1].split() == header.split()
    row = "0 0 | 7 7 0 0 0 | 0 0 7 1"
    assert lines[2].split() == row.split()
    assert len(lines) == 3


def test_nsq_stat_names_a_missing_channel(nsqd: ServerThread) -> None:
    with nsqd.connect() as p:
        p.pub("t", b"x")
    res = tool(
        "nsq_stat", "--topic=t", "--channel=nope", f"--nsqd-http-address=127.0.0.1:{nsqd.http_port}"
    )
    assert res.returncode == 1
    assert res.stderr == b"nsq_stat: failed to find channel(nope) in stats metadata for topic(t)\n"


def test_nsq_stat_finds_the_nodes_through_nsqlookupd(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    """Through the client's one nsqlookupd reader: the nodes' numbers summed (one node here
    holds 2, the other 3), whichever address kind each node registered."""
    lookupd = LookupdThread()
    try:
        host, port = lookupd.tcp_address
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
        servers = [
            make_nsqd(
                lookupd_tcp_addresses=[f"{host}:{port}"],
                broadcast_address="127.0.0.1",
                data_path=str(tmp_path / name),
            )
            for name in ("a", "b")
        ]
        for server, n in zip(servers, (2, 3), strict=True):
            with server.connect() as c:
                c.sub("t", "c", rdy=0)
                with server.connect() as p:
                    p.mpub("t", [b"m"] * n)

        def both_registered() -> bool:
            res = tool(
                "nsq_stat",
                "--topic=t",
                "--channel=c",
                f"--lookupd-http-address={lookupd.http_url.removeprefix('http://')}",
                "--interval=100ms",
                "--count=1",
            )
            row = res.stdout.decode().splitlines()[2].split() if res.returncode == 0 else []
            return row[2:4] == ["|", "5"]  # total depth

        wait_for(both_registered, "nsq_stat to sum both nodes' depth through nsqlookupd")
    finally:
        lookupd.stop()


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--nsqd-http-address=127.0.0.1:1"],
            b"nsq_stat: failed to get nsqd stats - nsqd 127.0.0.1:1 unreachable",
        ),
        (
            ["--lookupd-http-address=127.0.0.1:1"],
            b"nsq_stat: failed to get topic producers - no nsqlookupd answered",
        ),
    ],
)
def test_nsq_stat_names_what_did_not_answer_in_one_line(args: list[str], line: bytes) -> None:
    res = tool("nsq_stat", "--topic=t", "--channel=c", *args)
    assert res.returncode == 1
    assert res.stderr.startswith(line) and res.stderr.count(b"\n") == 1, res.stderr


def test_nsq_to_file_writes_gzip_files_and_fins_after_sync(
    nsqd: ServerThread, tmp_path: Path
) -> None:
    import gzip
    import signal

    with nsqd.connect() as p:
        p.mpub("t", [b"line %d" % i for i in range(500)])
    out, work = tmp_path / "out", tmp_path / "work"
    path = BIN / "nsq_to_file"
    command = [str(path)] if path.exists() else [sys.executable, "-m", "pynsqd.tools.nsq_to_file"]
    proc = subprocess.Popen(
        [
            *command,
            "--topic=t",
            f"--nsqd-tcp-address=127.0.0.1:{nsqd.tcp_port}",
            f"--output-dir={out}",
            f"--work-dir={work}",
            "--gzip",
            "--sync-interval=100ms",
            "--rotate-size=2000",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:

        def drained() -> bool:
            assert proc.poll() is None, "nsq_to_file exited early"
            topic = nsqd.call(lambda: nsqd.nsqd.topics.get("t"))
            ch = topic.channels.get("nsq_to_file") if topic else None
            return ch is not None and nsqd.call(lambda: (ch.depth, len(ch.in_flight))) == (0, 0)

        wait_for(drained, "every message written, synced and FIN'd", 30)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    files = sorted(out.iterdir())
    assert len(files) > 1  # rotated by size
    assert all(f.name.startswith("t.") and f.name.endswith(".log.gz") for f in files)
    assert [f.name for f in work.iterdir()] == []  # every file moved out of the work dir
    lines = b"".join(gzip.decompress(f.read_bytes()) for f in files).splitlines()
    assert sorted(lines) == sorted(b"line %d" % i for i in range(500))


class Lines:
    """A child's output, line by line, read on a thread (so a test waits on what it printed)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self.lines: Queue[bytes] = Queue()
        self.seen: list[bytes] = []
        self.stream = stream
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        """After the child exited: the rest read, the pipe closed."""
        self.thread.join(10)
        self.stream.close()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            self.lines.put(line)

    def take(self, n: int, timeout: float = 30) -> list[bytes]:
        got = [self.lines.get(timeout=timeout) for _ in range(n)]
        self.seen += got
        return got

    def until(self, text: bytes, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.seen):
            self.seen.append(self.lines.get(timeout=max(0.01, deadline - time.monotonic())))


def _stop(proc: subprocess.Popen[bytes], err: Lines, node: Proc) -> None:
    """The tool stopped as a user stops it (SIGTERM), its stderr reader and the node (kill -9)."""
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    err.close()
    node.p.kill()
    node.p.wait()
    node.log_file.close()


@contextlib.contextmanager
def tool_output(*args: str) -> Iterator[tuple[subprocess.Popen[bytes], Lines, Lines]]:
    """A tool run with its stdout and stderr read line by line; killed (if it still runs)
    and its pipes closed after."""
    proc = subprocess.Popen(
        [*_tool_command(args[0]), *args[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        yield proc, out, err
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        out.close()
        err.close()


def _tool_command(name: str) -> list[str]:
    path = BIN / name
    return [str(path)] if path.exists() else [sys.executable, "-m", f"pynsqd.tools.{name}"]


def test_nsq_tail_waits_for_the_topic_and_rides_out_a_node_restart(tmp_path: Path) -> None:
    """Like go-nsq's consumer: a topic nobody has yet is waited for (it exited: "no nsqd has
    topic"), a node killed and restarted is connected again (it exited: "connection closed"),
    and a node that comes back at new ports is found through nsqlookupd."""
    lookupd = LookupdThread()
    host, port = lookupd.tcp_address
    flags = (f"--lookupd-tcp-address={host}:{port}", "--broadcast-address=127.0.0.1")
    (tmp_path / "data").mkdir()
    node = Proc(tmp_path / "data", tmp_path / "nsqd.log", *flags)
    tail = subprocess.Popen(
        [
            *_tool_command("nsq_tail"),
            "--topic=late",
            "--channel=c",
            f"--lookupd-http-address={lookupd.http_url.removeprefix('http://')}",
            "--lookupd-poll-interval=100ms",
            "--n=20",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert tail.stdout is not None and tail.stderr is not None
    out, err = Lines(tail.stdout), Lines(tail.stderr)
    try:
        err.until(b"no nsqd has topic late yet")
        with Connection(f"127.0.0.1:{node.port}").connect() as c:
            c.mpub("late", [b"a%d" % i for i in range(10)])
        assert sorted(out.take(10)) == sorted(b"a%d\n" % i for i in range(10))
        node.p.kill()
        node.p.wait()
        node.log_file.close()
        err.until(b"connection closed")
        node = Proc(tmp_path / "data", tmp_path / "nsqd.log", *flags)  # at new ports
        with Connection(f"127.0.0.1:{node.port}").connect() as c:
            c.mpub("late", [b"b%d" % i for i in range(10)])
        assert sorted(out.take(10)) == sorted(b"b%d\n" % i for i in range(10))
        assert tail.wait(30) == 0
    finally:
        if tail.poll() is None:
            tail.kill()
        tail.wait()
        out.close()
        err.close()
        node.p.kill()
        node.p.wait()
        node.log_file.close()
        lookupd.stop()


def test_nsq_to_file_rides_out_a_node_restart_and_loses_nothing(tmp_path: Path) -> None:
    """A node restarted under ``nsq_to_file`` (given directly, on fixed ports): it connects
    again and goes on (it exited, rc 1); every message is in the files once it is FIN'd (a
    message written but not FIN'd before the kill comes again: at-least-once)."""
    tcp, http_port = free_port(), free_port()
    fixed = (f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http_port}")
    (tmp_path / "data").mkdir()
    node = Proc(tmp_path / "data", tmp_path / "nsqd.log", *fixed, "--mem-queue-size=0")
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [
            *_tool_command("nsq_to_file"),
            "--topic=t",
            f"--nsqd-tcp-address=127.0.0.1:{tcp}",
            f"--output-dir={out}",
            "--sync-interval=50ms",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    want = [b"m%04d" % i for i in range(600)]

    def written() -> set[bytes]:
        return {line for f in out.glob("*.log") for line in f.read_bytes().splitlines()}

    assert proc.stderr is not None
    err = Lines(proc.stderr)
    try:
        with Connection(f"127.0.0.1:{tcp}").connect() as c:
            c.mpub("t", want[:300])
        wait_for(lambda: written() >= set(want[:300]), "the first 300 written")
        node.p.kill()  # kill -9: on disk (--mem-queue-size=0), what was not FIN'd comes again
        node.p.wait()
        node.log_file.close()
        err.until(b"connection closed")
        node = Proc(tmp_path / "data", tmp_path / "nsqd.log", *fixed, "--mem-queue-size=0")
        err.until(b"connected to nsqd again")
        with Connection(f"127.0.0.1:{tcp}").connect() as c:
            c.mpub("t", want[300:])
        wait_for(lambda: written() >= set(want), "all 600 written")
        assert proc.poll() is None  # it went on
    finally:
        _stop(proc, err, node)
    assert proc.returncode == 0
    assert written() == set(want)


def test_nsq_to_file_names_its_files_as_gos(nsqd: ServerThread, tmp_path: Path) -> None:
    """Go's nsq_to_file 1.3.0 (checked by running it): without gzip or a work directory the
    file is ``<topic>.<host>.<datetime>.log``, appended to by the next run; with ``--gzip`` each
    run writes the next revision (``-000000``, ``-000001``). Ours always added ``-000000``."""
    host = socket.gethostname()
    stamp = "HOUR"  # --datetime-format without a field: the names do not depend on the clock

    def run(topic: str, *extra: str) -> None:
        proc = subprocess.Popen(
            [
                *_tool_command("nsq_to_file"),
                f"--topic={topic}",
                f"--nsqd-tcp-address=127.0.0.1:{nsqd.tcp_port}",
                f"--output-dir={tmp_path}",
                "--sync-interval=50ms",
                f"--datetime-format={stamp}",
                *extra,
            ],
            stderr=subprocess.DEVNULL,
        )
        try:

            def drained() -> bool:
                t = nsqd.call(lambda: nsqd.nsqd.topics.get(topic))
                ch = t.channels.get("nsq_to_file") if t else None
                return ch is not None and nsqd.call(lambda: (ch.depth, len(ch.in_flight))) == (0, 0)

            wait_for(drained, "every message written and FIN'd")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0

    for body in (b"first", b"second"):
        with nsqd.connect() as c:
            c.pub("plain", body)
            c.pub("zipped", body)
        run("plain")
        run("zipped", "--gzip")
    assert (tmp_path / f"plain.{host}.{stamp}.log").read_bytes() == b"first\nsecond\n"
    zipped = sorted(p.name for p in tmp_path.glob("zipped.*"))
    assert zipped == [f"zipped.{host}-00000{i}.{stamp}.log.gz" for i in (0, 1)]


def test_the_tools_reach_a_tls_only_nsqd_through_go_nsq_config_keys(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    """``--producer-opt``/``--consumer-opt`` take go-nsq's config keys, as Go's tools do: an
    nsqd with ``--tls-required`` is reached with ``tls_v1`` and ``tls_root_ca_file`` (the
    tools could not reach it at all); a key the tools cannot honour is refused by name."""
    certs = Certs(tmp_path)
    server = make_nsqd(**certs.server_options(tls_required="true"))
    addr = f"--nsqd-tcp-address=127.0.0.1:{server.tcp_port}"
    tls = ("tls_v1,true", f"tls_root_ca_file,{certs.ca_file}")
    res = tool("to_nsq", "--topic=s", addr, *(f"--producer-opt={o}" for o in tls), stdin=b"1\n2\n")
    assert res.returncode == 0, res.stderr
    res = tool(
        "nsq_tail", "--topic=s", "--channel=c", addr, "--n=2", *(f"--consumer-opt={o}" for o in tls)
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"1\n2\n"
    plain = tool("to_nsq", "--topic=s", addr, stdin=b"3\n")
    assert plain.returncode == 1  # nsqd requires TLS
    res = tool("nsq_tail", "--topic=s", addr, "--consumer-opt=snappy,true")
    assert res.returncode == 1
    assert res.stderr == (
        b"nsq_tail: --consumer-opt: go-nsq config 'snappy' is not supported by this tool\n"
    )


def test_nsq_log_prints_a_retained_topic_from_an_offset_or_a_time_and_follows_it(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    server = make_nsqd(retention_time=3600.0)
    http = f"--nsqd-http-address=127.0.0.1:{server.http_port}"
    with server.connect() as c:
        c.mpub("t", [b"alpha", b"beta", b"\xff\xfe"])
    res = tool("nsq_log", "--topic=t", http, "--format=json")
    assert res.returncode == 0, res.stderr
    docs = [json.loads(line) for line in res.stdout.splitlines()]
    assert [d["offset"] for d in docs] == [0, 1, 2]
    assert [d.get("body") for d in docs] == ["alpha", "beta", None]
    assert base64.b64decode(docs[2]["body_base64"]) == b"\xff\xfe"  # not UTF-8: as base64
    assert all(len(d["id"]) == 16 and d["attempts"] == 0 for d in docs)
    res = tool("nsq_log", "--topic=t", http, "--offset=1", "--n=1")
    assert res.stdout == b"beta\n"
    assert tool("nsq_log", "--topic=t", http, "--offset=latest").stdout == b""
    since = docs[0]["timestamp"] // 1_000_000 + 1  # ms after the batch: nothing yet
    assert tool("nsq_log", "--topic=t", http, f"--since={since}").stdout == b""
    # --follow: what is appended after it started, as it arrives.
    follow = subprocess.Popen(
        [*_tool_command("nsq_log"), "--topic=t", http, "--offset=3", "--follow", "--n=2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert follow.stdout is not None
    lines = Lines(follow.stdout)
    try:
        with server.connect() as c:
            c.pub("t", b"gamma")
            c.pub("t", b"delta")
        assert lines.take(2) == [b"gamma\n", b"delta\n"]
        assert follow.wait(30) == 0
    finally:
        if follow.poll() is None:
            follow.kill()
        follow.wait()
        lines.close()
        assert follow.stderr is not None
        follow.stderr.close()
    # A topic without retention: one line, naming what nsqd said.
    (tmp_path / "plain").mkdir()
    server2 = make_nsqd(data_path=str(tmp_path / "plain"))
    with server2.connect() as c:
        c.pub("plain", b"x")
    res = tool("nsq_log", "--topic=plain", f"--nsqd-http-address=127.0.0.1:{server2.http_port}")
    assert res.returncode == 1 and res.stderr.count(b"\n") == 1
    assert b"TOPIC_NOT_RETAINED" in res.stderr, res.stderr


def test_nsq_log_reads_every_workers_partition_of_a_node_and_follows_them(
    tmp_path: Path,
) -> None:
    """``--workers 2``: each worker keeps its own partition of a retained topic. Without
    ``--partition`` nsq_log reads both (each line's JSON names its partition, offsets dense in
    each), follows both, and an ``--offset`` number without ``--partition`` is one line
    saying which partitions there are."""
    node = Proc(tmp_path / "data", tmp_path / "nsqd.log", "--workers=2", "--retention-time=1h")
    http = f"--nsqd-http-address=127.0.0.1:{node.http_port}"
    try:
        wait_for(lambda: node.http("GET", "/ping") == (200, b"OK"), "the node to be ready")
        conns = [node.connect() for _ in range(6)]  # over both workers
        try:
            for i, c in enumerate(conns):
                c.identify()
                c.mpub("t", [f"m{i}-{j}".encode() for j in range(3)])
        finally:
            for c in conns:
                c.close()
        res = tool("nsq_log", "--topic=t", http, "--format=json")
        assert res.returncode == 0, res.stderr
        docs = [json.loads(line) for line in res.stdout.splitlines()]
        assert sorted(d["body"] for d in docs) == sorted(
            f"m{i}-{j}" for i in range(6) for j in range(3)
        )
        by_partition: dict[int, list[int]] = {}
        for d in docs:
            by_partition.setdefault(d["partition"], []).append(d["offset"])
        assert len(by_partition) == 2, by_partition  # both workers took publishes
        assert all(offs == list(range(len(offs))) for offs in by_partition.values())
        res = tool("nsq_log", "--topic=t", http, "--offset=1")
        assert res.returncode == 1 and res.stderr.count(b"\n") == 1
        assert b"one partition per worker" in res.stderr and b"--partition" in res.stderr
        (first, _) = sorted(by_partition)
        res = tool("nsq_log", "--topic=t", http, "--offset=1", f"--partition={first}", "--n=1")
        assert res.returncode == 0 and res.stdout.count(b"\n") == 1, res.stderr
        # --since a time before the later publishes (whenever nsq_log gets to read the
        # offsets): what each partition takes from then, as it arrives.
        since = f"--since={int(time.time() * 1000)}"
        with tool_output("nsq_log", "--topic=t", http, since, "--follow", "--n=6") as (
            follow,
            lines,
            _,
        ):
            later = [node.connect() for _ in range(6)]
            try:
                for i, c in enumerate(later):
                    c.identify()
                    c.pub("t", f"late{i}".encode())
            finally:
                for c in later:
                    c.close()
            assert sorted(lines.take(6)) == sorted(f"late{i}\n".encode() for i in range(6))
            assert follow.wait(30) == 0
    finally:
        node.stop()


def test_nsq_to_nsq_copies_filters_and_spreads_fin_after_the_destinations_ok(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    """Go's nsq_to_nsq: messages of one nsqd's topic published to others (``--mode
    round-robin`` takes them in turn), JSON filtered by field and value and cut to the
    whitelisted fields; a source message is FIN'd only after the destination's OK."""
    dirs = [tmp_path / n for n in ("src", "d1", "d2")]
    for d in dirs:
        d.mkdir()
    src, d1, d2 = (make_nsqd(data_path=str(d)) for d in dirs)
    docs = [{"kind": "x" if i % 2 else "y", "n": i, "secret": "s"} for i in range(40)]
    with src.connect() as c:
        c.mpub("events", [json.dumps(d).encode() for d in docs] + [b"not json"])
    proc = subprocess.Popen(
        [
            *_tool_command("nsq_to_nsq"),
            "--topic=events",
            f"--nsqd-tcp-address=127.0.0.1:{src.tcp_port}",
            f"--destination-nsqd-tcp-address=127.0.0.1:{d1.tcp_port}",
            f"--destination-nsqd-tcp-address=127.0.0.1:{d2.tcp_port}",
            "--destination-topic=xs",
            "--mode=round-robin",
            "--require-json-field=kind",
            "--require-json-value=x",
            "--whitelist-json-field=kind",
            "--whitelist-json-field=n",
            "--status-every=10",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def count(server: ServerThread) -> int:
        return int(server.call(lambda: getattr(server.nsqd.topics.get("xs"), "message_count", 0)))

    def drained() -> bool:
        t = src.call(lambda: src.nsqd.topics.get("events"))
        ch = t.channels.get("nsq_to_nsq") if t else None
        return ch is not None and src.call(lambda: (ch.depth, len(ch.in_flight))) == (0, 0)

    try:
        wait_for(drained, "every source message FIN'd")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert count(d1) == count(d2) == 10  # 20 of kind x, in turn
    got = []
    for server in (d1, d2):
        with server.connect() as c:
            c.sub("xs", "check", rdy=20)
            for _ in range(10):
                frame = c.read_message()
                got.append(json.loads(frame.body))
    assert sorted(d["n"] for d in got) == [d["n"] for d in docs if d["kind"] == "x"]
    assert all(set(d) == {"kind", "n"} for d in got)  # only the whitelisted fields
    assert b"10 published" in err


class Endpoint(http.server.BaseHTTPRequestHandler):
    """A real HTTP server's handler for nsq_to_http: records each request; the server's
    ``fail`` first requests are answered 500."""

    server: Recorder

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length)
        with self.server.lock:
            self.server.seen.append((self.command, self.path, dict(self.headers), body))
            failing = self.server.fail > 0
            self.server.fail -= failing
        self.send_response(500 if failing else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


class Recorder(http.server.ThreadingHTTPServer):
    def __init__(self, fail: int = 0) -> None:
        super().__init__(("127.0.0.1", 0), Endpoint)
        self.lock = threading.Lock()
        self.seen: list[tuple[str, str, dict[str, str], bytes]] = []
        self.fail = fail
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def close(self) -> None:
        self.shutdown()
        self.server_close()

    def ok_bodies(self) -> list[bytes]:
        return [b for *_, b in self.seen]


def _to_http(server: ServerThread, topic: str, *args: str) -> tuple[int, bytes]:
    """nsq_to_http on ``topic`` until every message is FIN'd, then SIGTERM: (rc, stderr)."""
    proc = subprocess.Popen(
        [
            *_tool_command("nsq_to_http"),
            f"--topic={topic}",
            f"--nsqd-tcp-address=127.0.0.1:{server.tcp_port}",
            *args,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def drained() -> bool:
        t = server.call(lambda: server.nsqd.topics.get(topic))
        ch = t.channels.get("nsq_to_http") if t else None
        return ch is not None and server.call(
            lambda: (ch.depth, len(ch.in_flight), len(ch.deferred), ch.message_count)
        ) == (0, 0, 0, t.message_count)

    try:
        wait_for(drained, "every message FIN'd")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    return proc.returncode, err


def test_nsq_to_http_posts_in_turn_and_fins_only_after_a_2xx(nsqd: ServerThread) -> None:
    """Go's nsq_to_http: each message one POST (``--mode round-robin`` over the URLs) with
    ``--content-type`` and every ``--header``; a 500 requeues the message, which comes again
    and is FIN'd only once a server answered 2xx."""
    first, second = Recorder(fail=3), Recorder()
    bodies = [b"event-%02d" % i for i in range(30)]
    with nsqd.connect() as c:
        c.mpub("hooks", bodies)
    try:
        rc, err = _to_http(
            nsqd,
            "hooks",
            f"--post={first.url}/in?k=v",
            f"--post={second.url}/in",
            "--mode=round-robin",
            "--content-type=application/x-test",
            "--header=X-Token: abc",
            "--n=4",
            "--status-every=10",
        )
        assert rc == 0, err
        answered_ok = first.ok_bodies()[3:] + second.ok_bodies()
        assert sorted(answered_ok) == bodies  # each once, after its retries
        assert len(first.seen) >= 3 + 10 and len(second.seen) >= 10  # spread in turn
        method, path, headers, _ = first.seen[-1]
        assert (method, path) == ("POST", "/in?k=v")
        assert headers["Content-Type"] == "application/x-test"
        assert headers["X-Token"] == "abc"
        assert b"got status code 500; requeued" in err
        assert b"finished 10 requests - 99th:" in err
    finally:
        first.close()
        second.close()


def test_nsq_to_http_gets_with_the_body_escaped_and_sample_zero_sends_nothing(
    nsqd: ServerThread,
) -> None:
    server = Recorder()
    with nsqd.connect() as c:
        c.mpub("gets", [b"a b&c=d", "é/%+".encode()])
        c.mpub("none", [b"x"] * 5)
    try:
        rc, err = _to_http(nsqd, "gets", f"--get={server.url}/hit?data=%s")
        assert rc == 0, err
        got = sorted(
            urllib.parse.parse_qs(urllib.parse.urlsplit(p).query)["data"][0]
            for _, p, _, _ in server.seen
        )
        assert got == sorted(["a b&c=d", "é/%+"])
        rc, err = _to_http(nsqd, "none", f"--get={server.url}/hit?data=%s", "--sample=0")
        assert rc == 0, err
        assert len(server.seen) == 2  # the five were FIN'd unsent
    finally:
        server.close()


def test_nsq_to_file_topic_pattern_finds_topics_through_nsqlookupd_as_they_appear(
    tmp_path: Path,
) -> None:
    """Go's ``--topic-pattern``: without ``--topic``, every topic nsqlookupd knows that matches
    is written, including one created after the start (found at the next
    ``--topic-refresh``); others are not. ``--log-prefix`` and ``--log-level`` shape the lines."""
    lookupd = LookupdThread()
    host, port = lookupd.tcp_address
    flags = (f"--lookupd-tcp-address={host}:{port}", "--broadcast-address=127.0.0.1")
    (tmp_path / "data").mkdir()
    node = Proc(tmp_path / "data", tmp_path / "nsqd.log", *flags)
    out = tmp_path / "out"
    with Connection(f"127.0.0.1:{node.port}").connect() as c:
        c.pub("app.a", b"a1")
        c.pub("other", b"o1")
    wait_for(lambda: {"app.a", "other"} <= set(lookupd_topics(lookupd)), "lookupd has both")
    proc = subprocess.Popen(
        [
            *_tool_command("nsq_to_file"),
            r"--topic-pattern=^app\.",
            f"--lookupd-http-address={lookupd.http_url.removeprefix('http://')}",
            "--topic-refresh=100ms",
            "--lookupd-poll-interval=100ms",
            f"--output-dir={out}",
            "--sync-interval=50ms",
            "--log-prefix=[tofile] ",
            "--log-level=info",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )

    def lines(topic: str) -> set[bytes]:
        return {x for f in out.glob(f"{topic}.*.log") for x in f.read_bytes().splitlines()}

    assert proc.stderr is not None
    err = Lines(proc.stderr)
    try:
        err.until(b"[tofile] consuming topic app.a")
        wait_for(lambda: lines("app.a") == {b"a1"}, "app.a written")
        with Connection(f"127.0.0.1:{node.port}").connect() as c:
            c.mpub("app.b", [b"b1", b"b2"])
        err.until(b"[tofile] consuming topic app.b")
        wait_for(lambda: lines("app.b") == {b"b1", b"b2"}, "app.b, created later, written")
    finally:
        _stop(proc, err, node)
        lookupd.stop()
    assert proc.returncode == 0
    assert not list(out.glob("other.*"))
    res = tool("nsq_to_file", "--topic-pattern=(", "--lookupd-http-address=127.0.0.1:1")
    assert res.returncode == 1 and res.stderr.startswith(b"nsq_to_file: --topic-pattern: ")
    res = tool("nsq_to_file", "--topic-pattern=x", "--nsqd-tcp-address=127.0.0.1:1")
    assert res.stderr == (
        b"nsq_to_file: --lookupd-http-address must be specified when no --topic specified\n"
    )


def lookupd_topics(lookupd: LookupdThread) -> list[str]:
    return lookup_topics([lookupd.http_url])


def test_the_tools_accept_every_flag_of_gos(tmp_path: Path) -> None:
    """Each tool's ``--help`` lists every flag Go NSQ 1.3.0's lists (taken from the binaries'
    ``--help``), so existing command lines and unit files work."""
    missing = {}
    for name, flags in GO_FLAGS.items():
        res = tool(name, "--help")
        ours = {
            line.split()[0].lstrip("-")
            for line in res.stdout.decode().splitlines() + res.stderr.decode().splitlines()
            if line.startswith("  -")
        }
        gone = sorted(set(flags.split()) - ours)
        if gone:
            missing[name] = gone
    assert missing == {}


#: Go NSQ 1.3.0's flags per program (``<program> --help``).
GO_FLAGS = {
    "to_nsq": "delimiter nsqd-tcp-address producer-opt rate topic",
    "nsq_tail": "channel consumer-opt lookupd-http-address max-in-flight n nsqd-tcp-address "
    "print-topic topic version",
    "nsq_stat": "channel count http-client-connect-timeout http-client-request-timeout "
    "interval lookupd-http-address nsqd-http-address topic version",
    "nsq_to_file": "channel consumer-opt datetime-format filename-format gzip gzip-level "
    "host-identifier http-client-connect-timeout http-client-request-timeout log-level "
    "log-prefix lookupd-http-address max-in-flight nsqd-tcp-address output-dir "
    "rotate-interval rotate-size skip-empty-files sync-interval topic topic-pattern "
    "topic-refresh version work-dir",
    "nsq_to_nsq": "channel consumer-opt destination-nsqd-tcp-address destination-topic "
    "lookupd-http-address max-in-flight mode nsqd-tcp-address producer-opt "
    "require-json-field require-json-value status-every topic version whitelist-json-field",
    "nsq_to_http": "channel consumer-opt content-type get header http-client-connect-timeout "
    "http-client-request-timeout lookupd-http-address max-in-flight mode n nsqd-tcp-address "
    "post sample status-every topic version",
    "nsqd": "auth-http-address broadcast-address broadcast-http-port broadcast-tcp-port "
    "config data-path deflate e2e-processing-latency-percentile "
    "e2e-processing-latency-window-time http-address http-client-connect-timeout "
    "http-client-request-timeout https-address log-level log-prefix lookupd-tcp-address "
    "max-body-size max-bytes-per-file max-channel-consumers max-deflate-level "
    "max-heartbeat-interval max-msg-size max-msg-timeout max-output-buffer-size "
    "max-output-buffer-timeout max-rdy-count max-req-timeout mem-queue-size "
    "min-output-buffer-timeout msg-timeout node-id output-buffer-timeout "
    "queue-scan-selection-count queue-scan-worker-pool-max snappy statsd-address "
    "statsd-exclude-ephemeral statsd-interval statsd-mem-stats statsd-prefix "
    "statsd-udp-packet-size sync-every sync-timeout tcp-address tls-cert "
    "tls-client-auth-policy tls-key tls-min-version tls-required tls-root-ca-file verbose "
    "version worker-id",
    "nsqlookupd": "broadcast-address config http-address inactive-producer-timeout log-level "
    "log-prefix tcp-address tombstone-lifetime verbose version",
    "nsqadmin": "acl-http-header admin-user allow-config-from-cidr base-path config "
    "dev-static-dir graphite-url http-address http-client-connect-timeout "
    "http-client-request-timeout http-client-tls-cert http-client-tls-insecure-skip-verify "
    "http-client-tls-key http-client-tls-root-ca-file log-level log-prefix "
    "lookupd-http-address notification-http-endpoint nsqd-http-address proxy-graphite "
    "statsd-counter-format statsd-gauge-format statsd-interval statsd-prefix verbose version",
}


def test_the_tools_carry_message_headers(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    """``docs/headers.md``: ``to_nsq --message-header`` publishes them, ``nsq_tail
    --message-headers`` prints them before each body, ``nsq_to_nsq --message-headers`` and
    ``nsq_to_http --message-headers`` pass them on (the latter as ``Nsq-Header-*``)."""
    (tmp_path / "src").mkdir()
    (tmp_path / "dst").mkdir()
    src = make_nsqd(data_path=str(tmp_path / "src"))
    dst = make_nsqd(data_path=str(tmp_path / "dst"))
    addr = f"127.0.0.1:{src.tcp_port}"
    assert http_request(src, "POST", "/topic/create?topic=logs")[0] == 200
    for channel in ("tail", "nsq_to_nsq", "nsq_to_http"):  # each gets every message
        status, _ = http_request(src, "POST", f"/channel/create?topic=logs&channel={channel}")
        assert status == 200
    res = tool(
        "to_nsq",
        "--topic=logs",
        f"--nsqd-tcp-address={addr}",
        "--message-header=tenant=acme",
        "--message-header=trace=00-1-01",
        stdin=b"a\nb\n",
    )
    assert res.returncode == 0, res.stderr
    res = tool(
        "nsq_tail",
        "--topic=logs",
        "--channel=tail",
        f"--nsqd-tcp-address={addr}",
        "--message-headers",
        "--n=2",
    )
    assert res.returncode == 0, res.stderr
    line = b'{"tenant":"acme","trace":"00-1-01"}\t'
    assert res.stdout == line + b"a\n" + line + b"b\n"
    bad = tool("to_nsq", "--topic=logs", f"--nsqd-tcp-address={addr}", "--message-header=A B=1")
    assert bad.returncode == 1 and bad.stderr.startswith(b"to_nsq: --message-header 'A B=1'")
    proc = subprocess.Popen(
        [
            *_tool_command("nsq_to_nsq"),
            "--topic=logs",
            f"--nsqd-tcp-address={addr}",
            f"--destination-nsqd-tcp-address=127.0.0.1:{dst.tcp_port}",
            "--message-headers",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(
            lambda: dst.call(lambda: getattr(dst.nsqd.topics.get("logs"), "message_count", 0)) == 2,
            "both copied",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
    recorder = Recorder()
    try:
        rc, err = _to_http(src, "logs", f"--post={recorder.url}/in", "--message-headers")
        assert rc == 0, err
        assert sorted(b for *_, b in recorder.seen) == [b"a", b"b"]
        for _, _, sent, _ in recorder.seen:
            folded = {k.lower(): v for k, v in sent.items()}
            assert (folded["nsq-header-tenant"], folded["nsq-header-trace"]) == ("acme", "00-1-01")
    finally:
        recorder.close()
    with Connection(f"127.0.0.1:{dst.tcp_port}", ClientOptions(headers=True)).connect() as c:
        got: list[list[tuple[str, bytes]]] = []

        def on_messages(conn: Connection, *cols: Any) -> None:
            got.extend(cols[4])
            conn.fin_many(cols[2])

        c.subscribe("logs", "check", on_messages, rdy=10)
        wait_for(lambda: len(got) >= 2, "the copies")
    assert got == [[("tenant", b"acme"), ("trace", b"00-1-01")]] * 2
