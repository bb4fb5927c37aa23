"""nsqlookupd over real sockets: V1 transcripts (what Go nsqd sends), errors, the HTTP API."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
import uvloop

from pynsqd.lookupd.nsqlookupd import NSQLookupd
from pynsqd.lookupd.options import LookupdOptions

T = TypeVar("T")


class LookupdThread:
    def __init__(self, **overrides: Any) -> None:
        self.opts = LookupdOptions(
            tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", broadcast_address="lookupd-host"
        )
        for key, value in overrides.items():
            setattr(self.opts, key, value)
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.lookupd: NSQLookupd = self.call_async(self._start)

    async def _start(self) -> NSQLookupd:
        lookupd = NSQLookupd(self.opts, self.loop)
        await lookupd.start()
        return lookupd

    def call(self, fn: Callable[[], T]) -> T:
        fut: concurrent.futures.Future[T] = concurrent.futures.Future()

        def run() -> None:
            try:
                fut.set_result(fn())
            except BaseException as e:
                fut.set_exception(e)

        self.loop.call_soon_threadsafe(run)
        return fut.result(timeout=10)

    def call_async(self, coro_fn: Callable[[], Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro_fn(), self.loop).result(timeout=30)

    @property
    def tcp_address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.lookupd.real_tcp_port)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.lookupd.real_http_port}"

    def stop(self) -> None:
        if self.loop.is_running():
            self.call_async(self.lookupd.stop)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        self.loop.close()


@pytest.fixture
def make_lookupd() -> Iterator[Callable[..., LookupdThread]]:
    servers: list[LookupdThread] = []

    def make(**overrides: Any) -> LookupdThread:
        server = LookupdThread(**overrides)
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()


@pytest.fixture
def lookupd(make_lookupd: Callable[..., LookupdThread]) -> LookupdThread:
    return make_lookupd()


class V1Conn:
    """A raw nsqlookupd client: send bytes, read ``[size][data]`` responses."""

    def __init__(self, address: tuple[str, int], magic: bytes = b"  V1") -> None:
        self.sock = socket.create_connection(address, timeout=5)
        self.buf = b""
        if magic:
            self.sock.sendall(magic)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read(self) -> bytes:
        (size,) = struct.unpack(">l", self._read(4))
        return self._read(size)

    def command(self, data: bytes) -> bytes:
        self.send(data)
        return self.read()

    def assert_closed(self) -> None:
        assert self.buf == b""
        assert self.sock.recv(1) == b""
        self.sock.close()

    def close(self) -> None:
        self.sock.close()


def go_identify(port: int = 4150, http_port: int = 4151, address: str = "node1") -> bytes:
    """The bytes Go nsqd 1.3.0 sends (go-nsq's Identify: json.Marshal of a map, sorted keys)."""
    body = (
        f'{{"broadcast_address":"{address}","hostname":"{address}.local","http_port":{http_port},'
        f'"tcp_port":{port},"topology_region":"","topology_zone":"","version":"1.3.0"}}'
    ).encode()
    return b"IDENTIFY\n" + struct.pack(">l", len(body)) + body


def http(
    url: str, method: str = "GET", data: bytes | None = None
) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, method=method, data=data)
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read(), dict(err.headers)


def get_json(url: str) -> Any:
    status, body, headers = http(url)
    assert status == 200, body
    assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"
    assert headers["Content-Type"] == "application/json; charset=utf-8"
    return json.loads(body)


def wait_for(predicate: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


# -- TCP ----------------------------------------------------------------------------------------


def test_go_nsqd_registration_transcript(lookupd: LookupdThread) -> None:
    conn = V1Conn(lookupd.tcp_address)
    assert conn.command(b"PING\n") == b"OK"  # allowed before IDENTIFY
    info = json.loads(conn.command(go_identify()))
    assert info == {
        "tcp_port": lookupd.lookupd.real_tcp_port,
        "http_port": lookupd.lookupd.real_http_port,
        "version": "1.3.0",
        "broadcast_address": "lookupd-host",
        "hostname": socket.gethostname(),
    }
    assert conn.command(b"REGISTER topic1\n") == b"OK"
    assert conn.command(b"REGISTER topic1 ch1\n") == b"OK"
    assert conn.command(b"REGISTER topic2 ch2\n") == b"OK"
    assert conn.command(b"PING\n") == b"OK"
    local = f"127.0.0.1:{conn.sock.getsockname()[1]}"
    data = get_json(lookupd.http_url + "/lookup?topic=topic1")
    assert data == {
        "channels": ["ch1"],
        "producers": [
            {
                "remote_address": local,
                "hostname": "node1.local",
                "broadcast_address": "node1",
                "tcp_port": 4150,
                "http_port": 4151,
                "version": "1.3.0",
                "topology_zone": "",
                "topology_region": "",
            }
        ],
    }
    assert get_json(lookupd.http_url + "/topics") == {"topics": ["topic1", "topic2"]}
    assert get_json(lookupd.http_url + "/channels?topic=topic2") == {"channels": ["ch2"]}
    nodes = get_json(lookupd.http_url + "/nodes")["producers"]
    assert [(n["topics"], n["tombstones"]) for n in nodes] == [
        (["topic1", "topic2"], [False, False])
    ]
    # UNREGISTER of a channel, then of a topic
    assert conn.command(b"UNREGISTER topic1 ch1\n") == b"OK"
    assert get_json(lookupd.http_url + "/lookup?topic=topic1")["channels"] == ["ch1"]  # key stays
    assert conn.command(b"UNREGISTER topic2\n") == b"OK"
    assert get_json(lookupd.http_url + "/lookup?topic=topic2")["producers"] == []
    conn.close()


def test_disconnect_removes_node_everywhere(lookupd: LookupdThread) -> None:
    a = V1Conn(lookupd.tcp_address)
    b = V1Conn(lookupd.tcp_address)
    a.command(go_identify(address="a"))
    b.command(go_identify(address="b"))
    for conn in (a, b):
        assert conn.command(b"REGISTER t c\n") == b"OK"
    url = lookupd.http_url + "/lookup?topic=t"
    assert len(get_json(url)["producers"]) == 2
    a.close()
    wait_for(lambda: [p["broadcast_address"] for p in get_json(url)["producers"]] == ["b"])
    assert [n["broadcast_address"] for n in get_json(lookupd.http_url + "/nodes")["producers"]] == [
        "b"
    ]
    b.close()
    wait_for(lambda: get_json(url)["producers"] == [])
    # the registrations stay, with no producers
    assert get_json(lookupd.http_url + "/topics") == {"topics": ["t"]}
    assert get_json(url)["channels"] == ["c"]


def test_ephemeral_registrations_go_with_last_producer(lookupd: LookupdThread) -> None:
    conn = V1Conn(lookupd.tcp_address)
    conn.command(go_identify())
    conn.command(b"REGISTER t c#ephemeral\n")
    conn.command(b"REGISTER e#ephemeral\n")
    assert get_json(lookupd.http_url + "/channels?topic=t") == {"channels": ["c#ephemeral"]}
    conn.command(b"UNREGISTER t c#ephemeral\n")
    conn.command(b"UNREGISTER e#ephemeral\n")
    assert get_json(lookupd.http_url + "/channels?topic=t") == {"channels": []}
    assert get_json(lookupd.http_url + "/topics") == {"topics": ["t"]}
    conn.close()


ERRORS = [
    (b"", b"  V2", b"E_BAD_PROTOCOL"),
    (b"", b"GET / HTTP/1.1\r\n", b"E_BAD_PROTOCOL"),
    (b"  V1", b"FOO\n", b"E_INVALID invalid command FOO"),
    (b"  V1", b"REGISTER t\n", b"E_INVALID client must IDENTIFY"),
    (b"  V1", b"UNREGISTER t\n", b"E_INVALID client must IDENTIFY"),
    (b"  V1" + go_identify(), b"REGISTER\n", b"E_INVALID REGISTER insufficient number of params"),
    (b"  V1" + go_identify(), b"REGISTER b@d\n",
     b"E_BAD_TOPIC REGISTER topic name 'b@d' is not valid"),
    (b"  V1" + go_identify(), b"UNREGISTER t b@d\n",
     b"E_BAD_CHANNEL UNREGISTER channel name 'b@d' is not valid"),
    (b"  V1" + go_identify(), go_identify(), b"E_INVALID cannot IDENTIFY again"),
    (b"  V1", b"IDENTIFY\n\x00\x00\x00\x02{}", b"E_BAD_BODY IDENTIFY missing fields"),
    (b"  V1", b"IDENTIFY\n\x00\x00\x00\x02[]", b"E_BAD_BODY IDENTIFY failed to decode JSON body"),
    (b"  V1", b"IDENTIFY\n\xff\xff\xff\xff", b"E_BAD_BODY IDENTIFY failed to read body"),
]  # fmt: skip


@pytest.mark.parametrize(("setup", "bad", "error"), ERRORS)
def test_errors_are_sent_then_fatal(
    lookupd: LookupdThread, setup: bytes, bad: bytes, error: bytes
) -> None:
    other = V1Conn(lookupd.tcp_address)
    other.command(go_identify(address="good"))
    other.command(b"REGISTER t\n")
    conn = V1Conn(lookupd.tcp_address, magic=b"")
    conn.send(setup)
    if setup.startswith(b"  V1" + b"IDENTIFY"):
        conn.read()
    conn.send(bad)
    assert conn.read() == error
    conn.assert_closed()
    # the other node's registration is untouched, and it keeps working
    assert other.command(b"PING\n") == b"OK"
    producers = get_json(lookupd.http_url + "/lookup?topic=t")["producers"]
    assert [p["broadcast_address"] for p in producers] == ["good"]
    other.close()


def test_short_identify_body_at_half_close(lookupd: LookupdThread) -> None:
    conn = V1Conn(lookupd.tcp_address)
    conn.send(b"IDENTIFY\n\x00\x00")
    conn.sock.shutdown(socket.SHUT_WR)
    assert conn.read() == b"E_BAD_BODY IDENTIFY failed to read body size"
    conn.assert_closed()


def test_pipelined_commands_in_one_write(lookupd: LookupdThread) -> None:
    conn = V1Conn(lookupd.tcp_address, magic=b"")
    conn.send(b"  V1" + go_identify() + b"REGISTER a\nREGISTER b c\nPING\nBAD\nPING\n")
    assert json.loads(conn.read())["version"] == "1.3.0"
    assert [conn.read() for _ in range(4)] == [
        b"OK",
        b"OK",
        b"OK",
        b"E_INVALID invalid command BAD",
    ]
    conn.assert_closed()


# -- HTTP ---------------------------------------------------------------------------------------


def test_http_envelopes_and_errors(lookupd: LookupdThread) -> None:
    url = lookupd.http_url
    status, body, headers = http(url + "/ping")
    assert (status, body) == (200, b"OK")
    assert "X-NSQ-Content-Type" not in headers
    assert get_json(url + "/info") == {"version": "1.3.0"}
    assert get_json(url + "/topics") == {"topics": []}
    cases = [
        ("GET", "/nope", 404, "NOT_FOUND"),
        ("POST", "/ping", 405, "METHOD_NOT_ALLOWED"),
        ("POST", "/lookup?topic=t", 405, "METHOD_NOT_ALLOWED"),
        ("GET", "/lookup", 400, "MISSING_ARG_TOPIC"),
        ("GET", "/lookup?topic=t", 404, "TOPIC_NOT_FOUND"),
        ("GET", "/lookup?topic=%zz", 400, "INVALID_REQUEST"),
        ("GET", "/channels", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/create", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/topic/create?topic=b@d", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/topic/delete", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?topic=t", 400, "MISSING_ARG_CHANNEL"),
        ("POST", "/channel/create?channel=c", 400, "MISSING_ARG_TOPIC"),
        ("POST", "/channel/create?topic=b@d&channel=c", 400, "INVALID_ARG_TOPIC"),
        ("POST", "/channel/create?topic=t&channel=b@d", 400, "INVALID_ARG_CHANNEL"),
        ("POST", "/channel/delete?topic=t&channel=c", 404, "CHANNEL_NOT_FOUND"),
        ("POST", "/topic/tombstone?topic=t", 400, "MISSING_ARG_NODE"),
        ("POST", "/topic/tombstone?node=n:1", 400, "MISSING_ARG_TOPIC"),
    ]
    for method, path, code, token in cases:
        status, body, headers = http(url + path, method, b"" if method == "POST" else None)
        assert (status, json.loads(body)) == (code, {"message": token}), path
        assert headers["X-NSQ-Content-Type"] == "nsq; version=1.0"


def test_http_topic_and_channel_admin(lookupd: LookupdThread) -> None:
    url = lookupd.http_url
    assert http(url + "/topic/create?topic=t1", "POST", b"")[:2] == (200, b"")
    assert http(url + "/channel/create?topic=t2&channel=c", "POST", b"")[:2] == (200, b"")
    assert get_json(url + "/topics") == {"topics": ["t1", "t2"]}
    assert get_json(url + "/lookup?topic=t2") == {"channels": ["c"], "producers": []}
    assert http(url + "/channel/delete?topic=t2&channel=c", "POST", b"")[:2] == (200, b"")
    assert get_json(url + "/channels?topic=t2") == {"channels": []}
    assert http(url + "/topic/delete?topic=t2", "POST", b"")[:2] == (200, b"")
    assert http(url + "/topic/delete?topic=never", "POST", b"")[:2] == (200, b"")  # not checked
    assert get_json(url + "/topics") == {"topics": ["t1"]}
    assert get_json(url + "/channels?topic=") == {"channels": []}


def test_tombstone_hides_producer_for_lifetime(make_lookupd: Callable[..., LookupdThread]) -> None:
    lookupd = make_lookupd(tombstone_lifetime=0.5)
    a = V1Conn(lookupd.tcp_address)
    b = V1Conn(lookupd.tcp_address)
    a.command(go_identify(http_port=1001, address="a"))
    b.command(go_identify(http_port=1002, address="b"))
    a.command(b"REGISTER t\n")
    b.command(b"REGISTER t\n")
    b.command(b"REGISTER u\n")
    url = lookupd.http_url
    assert http(url + "/topic/tombstone?topic=t&node=a:1001", "POST", b"")[:2] == (200, b"")
    assert http(url + "/topic/tombstone?topic=t&node=x:1", "POST", b"")[0] == 200  # no match

    def visible() -> list[str]:
        return [p["broadcast_address"] for p in get_json(url + "/lookup?topic=t")["producers"]]

    assert visible() == ["b"]
    # /nodes still lists the node, with the tombstone flag for that topic
    nodes = {n["broadcast_address"]: n for n in get_json(url + "/nodes")["producers"]}
    assert (nodes["a"]["topics"], nodes["a"]["tombstones"]) == (["t"], [True])
    assert (nodes["b"]["topics"], nodes["b"]["tombstones"]) == (["t", "u"], [False, False])
    debug = get_json(url + "/debug")
    assert sorted(debug) == ["client::", "topic:t:", "topic:u:"]
    assert [e["tombstoned"] for e in debug["topic:t:"] if e["broadcast_address"] == "a"] == [True]
    wait_for(lambda: sorted(visible()) == ["a", "b"])
    a.close()
    b.close()


def test_inactive_producers_are_hidden_until_they_ping(
    make_lookupd: Callable[..., LookupdThread],
) -> None:
    lookupd = make_lookupd(inactive_producer_timeout=0.3)
    conn = V1Conn(lookupd.tcp_address)
    conn.command(go_identify())
    conn.command(b"REGISTER t\n")
    url = lookupd.http_url + "/lookup?topic=t"
    wait_for(lambda: get_json(url)["producers"] == [])
    assert get_json(lookupd.http_url + "/nodes") == {"producers": []}
    assert conn.command(b"PING\n") == b"OK"
    assert len(get_json(url)["producers"]) == 1
    conn.close()


def test_debug_pprof_index(lookupd: LookupdThread) -> None:
    status, body, _ = http(lookupd.http_url + "/debug/pprof")
    assert status == 200
    assert body
