"""Hostile input over real sockets: deep JSON, malformed HTTP, compressed bodies."""

from __future__ import annotations

import gzip
import json
import logging
import socket
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ..conftest import ServerThread, http_request
from ..conftest import http_request as request
from .lookupd_helpers import LookupdThread, lookupd_factory
from .lookupd_helpers import http as lookupd_http

DEEP = b"[" * 100_000


# -- 9: deeply nested JSON ----------------------------------------------------------------------


def test_deep_json_in_nsqd_dat_is_quarantined(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    first = make_nsqd()
    with first.connect() as c:
        c.pub("kept", b"x")
    first.stop()
    (tmp_path / "nsqd.dat").write_bytes(DEEP)
    second = make_nsqd()  # starts: the file is kept as .bad, topics come from their queue files
    assert (tmp_path / "nsqd.dat.bad").read_bytes() == DEEP
    assert second.call(lambda: second.nsqd.topics["kept"].depth) == 1


def test_deep_json_in_config_is_a_400(nsqd: ServerThread) -> None:
    status, body = request(nsqd, "PUT", "/config/nsqlookupd_tcp_addresses", DEEP)
    assert (status, body) == (400, b'{"message":"INVALID_VALUE"}')


def test_deep_json_in_identify_is_e_bad_body(nsqd: ServerThread) -> None:
    with nsqd.connect() as c:
        c.send(b"IDENTIFY\n" + len(DEEP).to_bytes(4, "big") + DEEP)
        frame = c.read_frame()
        assert frame.data == b"E_BAD_BODY IDENTIFY failed to decode JSON body"


# -- 4: compressed HTTP bodies ------------------------------------------------------------------


def test_a_gzip_body_is_published_as_sent(nsqd: ServerThread) -> None:
    packed = gzip.compress(b"\0" * (64 << 20))  # 64 MiB inflated, about 64 KiB sent
    assert len(packed) < 1 << 20
    status, body = request(nsqd, "POST", "/pub?topic=t", packed, **{"Content-Encoding": "gzip"})
    assert (status, body) == (200, b"OK")
    bogus = b"not gzip at all"
    status, body = request(nsqd, "POST", "/pub?topic=t", bogus, **{"Content-Encoding": "gzip"})
    assert (status, body) == (200, b"OK")
    with nsqd.connect() as c:
        c.sub("t", "c", rdy=2)
        assert [m.body for m in c.read_messages(2)] == [packed, bogus]  # as Go nsqd: undecoded


# -- 10: malformed HTTP requests ----------------------------------------------------------------

MALFORMED = [
    b"GARBAGE\r\n\r\n",
    b"GET / HTTP/9.9\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n",
    b"POST /pub?topic=t HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
    b"POST /pub?topic=t HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
    b"POST /pub?topic=t HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nxx\r\n",
    b"GET /\xff\xfe HTTP/1.1\r\n\r\n",
    b"GET /ping HTTP/1.1\r\nX: " + b"a" * 100_000 + b"\r\n\r\n",
    b"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03" + b"\0" * 64,  # a TLS hello
]


@pytest.fixture
def lookupd() -> Iterator[LookupdThread]:
    servers = lookupd_factory()
    make = next(servers)
    yield make()
    next(servers, None)  # stops it


@pytest.mark.parametrize("server", ["nsqd", "nsqlookupd"])
@pytest.mark.parametrize("raw", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_request_logs_one_line_and_no_traceback(
    request: pytest.FixtureRequest, server: str, raw: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    if server == "nsqd":
        nsqd: ServerThread = request.getfixturevalue("nsqd")
        port = nsqd.http_port

        def ping() -> tuple[int, bytes]:
            return http_request(nsqd, "GET", "/ping")
    else:
        lookupd: LookupdThread = request.getfixturevalue("lookupd")
        port = lookupd.lookupd.real_http_port

        def ping() -> tuple[int, bytes]:
            status, body, _ = lookupd_http(f"{lookupd.http_url}/ping")
            return status, body

    caplog.set_level(logging.DEBUG)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        try:
            s.sendall(raw)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass
        except ConnectionResetError:
            pass
    # the server is fine and logged what it had to say by the time it answers the next request
    assert ping() == (200, b"OK")
    traced = [r for r in caplog.records if r.exc_info]
    assert not traced, traced[0].getMessage()
    loud = [r for r in caplog.records if r.levelno > logging.WARNING]
    assert not loud, loud[0].getMessage()
    lines = [r for r in caplog.records if "bad request" in r.getMessage()]
    assert len(lines) <= 1


# -- issue 13: MPUB as nsq.js and squeaky send it -------------------------------------------------


def test_mpub_with_a_declared_size_of_only_the_message_bytes(nsqd: ServerThread) -> None:
    # nsq.js's transcript: body size 9 (3 x 3 bytes), where the spec's size would be 25
    raw = b"MPUB t\n" + struct.pack(">ll", 9, 3)
    raw += b"".join(struct.pack(">l", 3) + b for b in (b"foo", b"bar", b"baz"))
    with nsqd.connect() as c:
        c.send(raw)
        assert c.read_response() == b"OK"
        c.send(b"NOP\n")  # the stream goes on after the messages
        c.pub("t", b"qux")
    with nsqd.connect() as c:
        c.sub("t", "c", rdy=4)
        assert [m.body for m in c.read_messages(4)] == [b"foo", b"bar", b"baz", b"qux"]


def test_many_pipelined_identifies_are_answered(nsqd: ServerThread) -> None:
    body = json.dumps({"client_id": "x"}).encode()
    one = b"IDENTIFY\n" + struct.pack(">l", len(body)) + body
    with nsqd.connect() as c:
        c.send(one * 1000 + b"NOP\n")  # nsqd allows IDENTIFY again and again before SUB
        for _ in range(1000):
            assert c.read_response() == b"OK"
        c.pub("t", b"still fine")


def test_topology_from_identify_shows_in_stats(nsqd: ServerThread) -> None:
    with nsqd.connect(topology_zone="z1", topology_region="r1") as c:
        c.sub("t", "c")
        _, body = request(nsqd, "GET", "/stats?format=json")
        client = json.loads(body)["topics"][0]["channels"][0]["clients"][0]
        assert (client["topology_zone"], client["topology_region"]) == ("z1", "r1")


def test_debug_level_logs_client_commands_without_bodies(
    nsqd: ServerThread, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="pynsqd")
    with nsqd.connect(client_id="dbg") as c:
        c.pub("t", b"secret-body")
        c.sub("t", "c")
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("IDENTIFY" in m and "'client_id': 'dbg'" in m for m in debug), debug
    assert any(m.endswith("] PUB t") for m in debug), debug
    assert any("state change to SUBSCRIBED on t:c" in m for m in debug), debug
    assert not any("secret-body" in m for m in debug)
