"""Helpers for the nsqlookupd tests: an in-process nsqlookupd, a raw V1 client, HTTP."""

from __future__ import annotations

import json
import socket
import struct
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from pynsqd.lookupd.nsqlookupd import NSQLookupd
from pynsqd.lookupd.options import LookupdOptions
from tests.conftest import LoopThread


class LookupdThread(LoopThread):
    def __init__(self, **overrides: Any) -> None:
        super().__init__()
        self.opts = LookupdOptions(
            tcp_address="127.0.0.1:0", http_address="127.0.0.1:0", broadcast_address="lookupd-host"
        )
        for key, value in overrides.items():
            setattr(self.opts, key, value)
        self.lookupd: NSQLookupd = self.call_async(self._start)

    async def _start(self) -> NSQLookupd:
        lookupd = NSQLookupd(self.opts, self.loop)
        await lookupd.start()
        return lookupd

    @property
    def tcp_address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.lookupd.real_tcp_port)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.lookupd.real_http_port}"

    def stop(self) -> None:
        self.stop_loop(self.lookupd.stop)


def lookupd_factory() -> Iterator[Callable[..., LookupdThread]]:
    """The body of a ``make_lookupd`` fixture: every server made is stopped at the end."""
    servers: list[LookupdThread] = []

    def make(**overrides: Any) -> LookupdThread:
        server = LookupdThread(**overrides)
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.stop()


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
