"""nsqd registering with nsqlookupd: the exact bytes (a raw fake lookupd records them), the
notifications, reconnects, run-time address changes, channel pre-creation, and lookupds that
are down, silent or mad never holding up publishing."""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from pynsqd.protocol import encode
from pynsqd.protocol.errors import FatalClientError
from pynsqd.protocol.frames import FRAME_TYPE_MESSAGE
from pynsqd.protocol.lookup import Identify, V1Parser, encode_response

from ..conftest import ServerThread
from ..waiting import wait_for
from .lookupd_helpers import LookupdThread, get_json, http, lookupd_factory


@pytest.fixture
def make_lookupd() -> Iterator[Callable[..., LookupdThread]]:
    yield from lookupd_factory()


class FakeLookupd:
    """A raw socket lookupd that records every byte. ``mode``: ``ok`` answers as nsqlookupd,
    ``silent`` never answers, ``garbage`` answers nonsense."""

    def __init__(self, mode: str = "ok", http_port: int = 1) -> None:
        self.mode = mode
        self.http_port = http_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.streams: list[bytearray] = []
        self.closed: list[bool] = []
        self.socks: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.server.accept()
            except OSError:
                return
            with self._lock:
                index = len(self.streams)
                self.streams.append(bytearray())
                self.closed.append(False)
                self.socks.append(sock)
            threading.Thread(target=self._serve, args=(sock, index), daemon=True).start()

    def _serve(self, sock: socket.socket, index: int) -> None:
        parser = V1Parser()
        try:
            while data := sock.recv(65536):
                self.streams[index] += data
                if self.mode == "silent":
                    continue
                if self.mode == "garbage":
                    sock.sendall(b"\x7f\xff\xff\xffgarbage")
                    continue
                parser.feed(data)
                out = b""
                while (cmd := parser.next_command()) is not None:
                    if isinstance(cmd, Identify):
                        info = {
                            "tcp_port": self.port,
                            "http_port": self.http_port,
                            "version": "1.3.0",
                            "broadcast_address": "127.0.0.1",
                            "hostname": "fake",
                        }
                        out += encode_response(json.dumps(info).encode())
                    else:
                        out += encode_response(b"OK")
                sock.sendall(out)
        except (OSError, FatalClientError):
            pass
        self.closed[index] = True
        sock.close()

    def stream(self, index: int = 0) -> bytes:
        with self._lock:
            return bytes(self.streams[index]) if index < len(self.streams) else b""

    def drop_connections(self) -> None:
        with self._lock:
            socks = list(self.socks)
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self.server.close()
        self.drop_connections()


@pytest.fixture
def make_fake() -> Iterator[Callable[..., FakeLookupd]]:
    fakes: list[FakeLookupd] = []

    def make(**kwargs: Any) -> FakeLookupd:
        fake = FakeLookupd(**kwargs)
        fakes.append(fake)
        return fake

    yield make
    for fake in fakes:
        fake.close()


def go_identify_bytes(server: ServerThread, broadcast: str) -> bytes:
    """What Go nsqd writes: go-nsq's IDENTIFY with json.Marshal of a map (sorted keys)."""
    body = (
        f'{{"broadcast_address":"{broadcast}","hostname":"{socket.gethostname()}",'
        f'"http_port":{server.http_port},"tcp_port":{server.tcp_port},'
        f'"topology_region":"","topology_zone":"","version":"1.3.0"}}'
    ).encode()
    return b"IDENTIFY\n" + struct.pack(">l", len(body)) + body


def fast(server: ServerThread) -> None:
    timings = server.nsqd.lookup.timings
    timings.ping_interval = 0.2
    timings.reconnect_min = 0.02
    timings.reconnect_max = 0.2


def test_registration_is_byte_for_byte_go_nsqd(
    make_nsqd: Callable[..., ServerThread], make_fake: Callable[..., FakeLookupd]
) -> None:
    fake = make_fake()
    server = make_nsqd(broadcast_address="node-b")
    nsqd = server.nsqd

    def setup() -> None:
        fast(server)
        nsqd.get_topic("t").get_channel("c")
        nsqd.get_topic("empty")
        nsqd.set_lookupd_addresses([fake.address])

    server.call(setup)
    expected = b"  V1" + go_identify_bytes(server, "node-b") + b"REGISTER t c\nREGISTER empty\n"
    wait_for(lambda: len(fake.stream().replace(b"PING\n", b"")) >= len(expected))
    assert fake.stream().replace(b"PING\n", b"") == expected
    # every create and delete is a notification
    server.call(lambda: nsqd.get_topic("t").get_channel("c2"))
    server.call(lambda: nsqd.get_topic("t").delete_channel("c2"))
    server.call(lambda: nsqd.get_topic("new"))
    server.call(lambda: nsqd.delete_existing_topic("t"))
    expected += b"REGISTER t c2\nUNREGISTER t c2\nREGISTER new\nUNREGISTER t\nUNREGISTER t c\n"
    wait_for(lambda: fake.stream().replace(b"PING\n", b"") == expected)
    wait_for(lambda: b"PING\n" in fake.stream())  # every ping_interval (15 s by default)
    assert server.nsqd.lookup.http_addresses() == ["127.0.0.1:1"]


def test_reconnect_registers_everything_again(
    make_nsqd: Callable[..., ServerThread], make_fake: Callable[..., FakeLookupd]
) -> None:
    fake = make_fake()
    server = make_nsqd(broadcast_address="node-r")
    nsqd = server.nsqd

    def setup() -> None:
        fast(server)
        nsqd.get_topic("t").get_channel("c")
        nsqd.set_lookupd_addresses([fake.address])

    server.call(setup)
    first = b"  V1" + go_identify_bytes(server, "node-r") + b"REGISTER t c\n"
    wait_for(lambda: fake.stream(0).startswith(first))
    fake.drop_connections()
    server.call(lambda: nsqd.get_topic("t2"))  # made while (maybe) disconnected
    again = b"  V1" + go_identify_bytes(server, "node-r") + b"REGISTER t c\nREGISTER t2\n"
    wait_for(lambda: any(fake.stream(i).startswith(again) for i in range(1, len(fake.streams))))


def test_set_lookupd_addresses_at_run_time(
    make_nsqd: Callable[..., ServerThread], make_fake: Callable[..., FakeLookupd]
) -> None:
    old, new = make_fake(), make_fake()
    server = make_nsqd(lookupd_tcp_addresses=[old.address])
    wait_for(lambda: b"IDENTIFY" in old.stream())
    status, body, _ = http(
        server.http_url + "/config/nsqlookupd_tcp_addresses",
        "PUT",
        json.dumps([new.address]).encode(),
    )
    assert status == 200, body
    assert json.loads(body) == [new.address]
    wait_for(lambda: b"IDENTIFY" in new.stream())
    wait_for(lambda: old.closed[0])
    assert server.call(lambda: list(server.nsqd.lookup.peers)) == [new.address]
    # the same through the method the HTTP API calls
    server.call(lambda: server.nsqd.set_lookupd_addresses([]))
    wait_for(lambda: new.closed[0])
    assert server.nsqd.opts.lookupd_tcp_addresses == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_bad_lookupds_never_block_publishing_or_consuming(
    make_nsqd: Callable[..., ServerThread], make_fake: Callable[..., FakeLookupd]
) -> None:
    # an HTTP port that accepts and never answers: the channel query for a new topic hangs
    hang = socket.create_server(("127.0.0.1", 0))
    try:
        fakes = [
            make_fake(mode="silent"),
            make_fake(mode="garbage"),
            make_fake(mode="ok", http_port=hang.getsockname()[1]),
        ]
        dead = f"127.0.0.1:{_free_port()}"
        server = make_nsqd(lookupd_tcp_addresses=[dead] + [f.address for f in fakes])
        server.call(lambda: fast(server))
        wait_for(lambda: all(b"IDENTIFY" in f.stream() for f in fakes))
        for i in range(3):
            with server.connect() as conn:
                conn.send(encode.pub(f"topic{i}", b"hello"))
                assert conn.read_response() == b"OK"
                conn.send(encode.sub(f"topic{i}", "ch") + encode.rdy(1))
                assert conn.read_response() == b"OK"
                frame = conn.read_frame()
                assert frame.frame_type == FRAME_TYPE_MESSAGE
                assert frame.data.endswith(b"hello")
        # the garbage lookupd is dropped and dialled again, and keeps being so
        wait_for(lambda: len(fakes[1].streams) >= 2)
    finally:
        hang.close()


def test_new_topic_precreates_lookupd_channels(
    make_nsqd: Callable[..., ServerThread], make_lookupd: Callable[..., LookupdThread]
) -> None:
    lookupd = make_lookupd(broadcast_address="127.0.0.1")
    for channel in ("a", "b", "z%23ephemeral"):
        url = f"{lookupd.http_url}/channel/create?topic=t&channel={channel}"
        assert http(url, "POST", b"")[0] == 200
    server = make_nsqd(lookupd_tcp_addresses=[f"127.0.0.1:{lookupd.lookupd.real_tcp_port}"])
    wait_for(lambda: server.call(lambda: server.nsqd.lookup.http_addresses()) != [])
    wait_for(lambda: get_json(lookupd.http_url + "/nodes")["producers"] != [])
    with server.connect() as conn:
        conn.send(encode.pub("t", b"first"))
        assert conn.read_response() == b"OK"
    topic = server.nsqd.topics["t"]
    wait_for(lambda: server.call(lambda: sorted(topic.channels)) == ["a", "b"])
    # the message published before the channels existed reached both
    wait_for(lambda: server.call(lambda: [topic.channels[c].depth for c in ("a", "b")]) == [1, 1])
    # and nsqd registered them back
    wait_for(
        lambda: (
            get_json(lookupd.http_url + "/lookup?topic=t")["producers"] != []
            and len(get_json(lookupd.http_url + "/debug").get("channel:t:a", [])) == 1
        )
    )
