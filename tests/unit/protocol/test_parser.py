"""V2Parser against nsqd 1.3.0's V2 protocol and our differences from it, transcript by transcript.

Every case is fed the h11 way: all at once, one byte at a time, split in two at every offset
(short cases), and followed by a trailing ``NOP`` that must still be parsed unless the case ended
in an error. Error texts are compared byte for byte with what nsqd sends.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from functools import partial
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynsqd.protocol import parser as parser_module
from pynsqd.protocol.commands import (
    Auth,
    ClientState,
    Cls,
    Dpub,
    Fin,
    Identify,
    IdentifyData,
    Mpub,
    Nop,
    Pub,
    Rdy,
    Req,
    Sub,
    Touch,
)
from pynsqd.protocol.errors import ClientError, FatalClientError, ProtocolError
from pynsqd.protocol.identify import ProtocolConfig
from pynsqd.protocol.parser import Event, V2Parser, parse_mpub_body

# Small limits make every bound reachable; the rest are nsqd's defaults.
CFG = ProtocolConfig(max_msg_size=100, max_body_size=1000, max_rdy_count=50)
DEFAULT = ProtocolConfig()
TLS = ProtocolConfig(max_msg_size=100, max_body_size=1000, max_rdy_count=50, tls_required=True)

ID = b"0123456789abcdef"
ID2 = b"fedcba9876543210"

# Client states, reached by these transcripts.
INIT = b""
SUBSCRIBED = b"SUB t c\n"
CLOSING = b"SUB t c\nCLS\n"

IDENTITY = IdentifyData(
    client_id="",
    hostname="",
    user_agent="",
    heartbeat_interval_ms=30_000,
    output_buffer_size=16 * 1024,
    output_buffer_timeout_ms=250,
    sample_rate=0,
    msg_timeout_ms=60_000,
    feature_negotiation=False,
    tls_v1=False,
    snappy=False,
    deflate=False,
    deflate_level=0,
    topology_region="",
    topology_zone="",
)


# -- wire builders ------------------------------------------------------------------------------


def size(n: int) -> bytes:
    return struct.pack(">l", n)


def sized(body: bytes) -> bytes:
    return size(len(body)) + body


def identify(body: bytes = b"{}", head: bytes = b"IDENTIFY\n") -> bytes:
    return head + sized(body)


def auth(secret: bytes, head: bytes = b"AUTH\n") -> bytes:
    return head + sized(secret)


def pub(topic: bytes, body: bytes) -> bytes:
    return b"PUB " + topic + b"\n" + sized(body)


def dpub(topic: bytes, ms: bytes, body: bytes) -> bytes:
    return b"DPUB " + topic + b" " + ms + b"\n" + sized(body)


def mpub_body(*bodies: bytes) -> bytes:
    return size(len(bodies)) + b"".join(sized(b) for b in bodies)


def mpub(topic: bytes, *bodies: bytes) -> bytes:
    return b"MPUB " + topic + b"\n" + sized(mpub_body(*bodies))


class E:
    """An expected error event: the error frame's exact data and whether it is fatal."""

    def __init__(self, wire: bytes | str, fatal: bool = True) -> None:
        self.wire = wire.encode() if isinstance(wire, str) else wire
        self.fatal = fatal


# -- the three-way harness ----------------------------------------------------------------------


def feed(parser: V2Parser, chunks: Iterable[bytes]) -> list[Event]:
    """Feed chunks; after an IDENTIFY the parser pauses, and receive(b"") goes on."""
    out: list[Event] = []
    for chunk in chunks:
        batch = parser.receive(chunk)
        while batch:
            out += batch
            if type(batch[-1]) is not Identify:
                break
            batch = parser.receive(b"")
    return out


def norm(events: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Comparable events. NamedTuples compare as tuples (Nop() == Cls()), so keep the type name;
    consecutive FINs merge, since how they are batched depends on how the bytes arrived."""
    out: list[tuple[Any, ...]] = []
    for ev in events:
        if isinstance(ev, E):
            out.append(("error", ev.wire, ev.fatal))
        elif isinstance(ev, ProtocolError):
            assert isinstance(ev, FatalClientError) == ev.fatal
            out.append(("error", ev.wire, ev.fatal))
        elif type(ev) is Fin and out and out[-1][0] == "Fin":
            out[-1] = ("Fin", out[-1][1] + list(ev.ids))
        elif type(ev) is Fin:
            out.append(("Fin", list(ev.ids)))
        else:
            out.append((type(ev).__name__, *ev))
    return out


def parser_in(state: bytes, config: ProtocolConfig = CFG) -> V2Parser:
    parser = V2Parser(config, expect_magic=False)
    events = feed(parser, [state])
    assert not any(isinstance(ev, ProtocolError) for ev in events), events
    assert parser.buffered == 0
    return parser


def check(
    state: bytes,
    data: bytes,
    expected: Sequence[Any],
    config: ProtocolConfig = CFG,
    trailing_events: Sequence[Any] = (Nop(),),
) -> None:
    want = norm(expected)
    is_error = bool(want) and want[-1][0] == "error"
    ways: dict[str, list[bytes]] = {
        "all at once": [data],
        "byte at a time": [data[i : i + 1] for i in range(len(data))],
    }
    if len(data) <= 200:
        for i in range(1, len(data)):
            ways[f"split at {i}"] = [data[:i], data[i:]]
    for way, chunks in ways.items():
        parser = parser_in(state, config)
        assert norm(feed(parser, chunks)) == want, way
        if is_error:
            assert parser.receive(b"NOP\n") == [], way  # the first error ends the stream
            assert parser.buffered == 0, way
        else:
            assert parser.buffered == 0, way

    parser = parser_in(state, config)
    got = norm(feed(parser, [data + b"NOP\n"]))
    if is_error:
        assert got == want, "with trailing data"
    else:
        assert got == norm([*expected, *trailing_events]), "with trailing data"


# -- magic ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(b"  V2", [], id="magic alone"),
        pytest.param(b"  V2NOP\n", [Nop()], id="magic then command"),
        pytest.param(b"  V1NOP\n", [E("E_BAD_PROTOCOL")], id="V1"),
        pytest.param(b"V2  NOP\n", [E("E_BAD_PROTOCOL")], id="swapped"),
        pytest.param(b"  v2", [E("E_BAD_PROTOCOL")], id="lowercase"),
        pytest.param(b"NOP\n", [E("E_BAD_PROTOCOL")], id="no magic"),
        pytest.param(b"\x00\x00\x00\x00", [E("E_BAD_PROTOCOL")], id="zeros"),
    ],
)
def test_magic(data: bytes, expected: list[Any]) -> None:
    for chunks in ([data], [data[i : i + 1] for i in range(len(data))]):
        parser = V2Parser(CFG)
        assert norm(feed(parser, chunks)) == norm(expected)


def test_magic_partial_waits() -> None:
    parser = V2Parser(CFG)
    assert parser.receive(b"  V") == []
    assert parser.receive(b"2") == []
    assert parser.receive(b"NOP\n") == [Nop()]


def test_bad_magic_wire_is_exactly_e_bad_protocol() -> None:
    (err,) = V2Parser(CFG).receive(b"HTTP")
    assert isinstance(err, FatalClientError)
    assert err.wire == b"E_BAD_PROTOCOL"
    assert err.code == "E_BAD_PROTOCOL"


# -- framing: line endings, splitting, unknown commands, line length ----------------


@pytest.mark.parametrize(
    ("state", "data", "expected"),
    [
        pytest.param(INIT, b"NOP\r\n", [Nop()], id="crlf"),
        pytest.param(INIT, b"NOP extra args\n", [Nop()], id="NOP ignores params"),
        pytest.param(INIT, b"NOP\rX\n", [E("E_INVALID invalid command NOP\rX")], id="inner cr"),
        pytest.param(INIT, b"NOP\r\r\n", [E("E_INVALID invalid command NOP\r")], id="one cr"),
        pytest.param(INIT, b"\n", [E("E_INVALID invalid command ")], id="empty line"),
        pytest.param(INIT, b"\r\n", [E("E_INVALID invalid command ")], id="empty crlf"),
        pytest.param(INIT, b" NOP\n", [E("E_INVALID invalid command ")], id="leading space"),
        pytest.param(INIT, b"nop\n", [E("E_INVALID invalid command nop")], id="case-sensitive"),
        pytest.param(INIT, b"FOO bar\n", [E("E_INVALID invalid command FOO")], id="unknown"),
        pytest.param(
            INIT, b"\xff\xfe x\n", [E(b"E_INVALID invalid command \xff\xfe")], id="raw bytes"
        ),
        pytest.param(
            SUBSCRIBED, b"NOP\nNOP\r\nNOP\n", [Nop(), Nop(), Nop()], id="several commands"
        ),
    ],
)
def test_framing(state: bytes, data: bytes, expected: list[Any]) -> None:
    check(state, data, expected)


MAX_LINE = 16 * 1024
TOO_LONG = E(f"E_INVALID command line too long (more than {MAX_LINE} bytes)")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        # nsqd's 16 KiB bufio.Reader holds a line of 16384 bytes including its "\n".
        pytest.param(b"NOP " + b"x" * (MAX_LINE - 5) + b"\n", [Nop()], id="16384 with lf"),
        pytest.param(b"NOP " + b"x" * (MAX_LINE - 6) + b"\r\n", [Nop()], id="16384 with crlf"),
        pytest.param(b"NOP " + b"x" * (MAX_LINE - 4) + b"\n", [TOO_LONG], id="16385"),
        # nsqd closes silently; we send E_INVALID as soon as 16384 bytes hold no "\n".
        pytest.param(b"NOP " + b"x" * (MAX_LINE - 4), [TOO_LONG], id="16384 without lf"),
    ],
)
def test_line_length(data: bytes, expected: list[Any]) -> None:
    check(INIT, data, expected, config=DEFAULT)


def test_line_just_under_limit_waits_for_newline() -> None:
    parser = parser_in(INIT, DEFAULT)
    assert parser.receive(b"NOP " + b"x" * (MAX_LINE - 5)) == []
    assert parser.buffered == MAX_LINE - 1
    assert parser.receive(b"\n") == [Nop()]


# -- IDENTIFY -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "data", "expected"),
    [
        pytest.param(INIT, identify(), [Identify(IDENTITY)], id="empty object"),
        pytest.param(INIT, identify(b"null"), [Identify(IDENTITY)], id="null"),
        pytest.param(
            INIT,
            identify(b'{"client_id":"c","hostname":"h","feature_negotiation":true}'),
            [Identify(IDENTITY._replace(client_id="c", hostname="h", feature_negotiation=True))],
            id="fields",
        ),
        pytest.param(
            INIT, identify(head=b"IDENTIFY\r\n"), [Identify(IDENTITY)], id="crlf before body"
        ),
        pytest.param(
            INIT, identify(head=b"IDENTIFY ignored params\n"), [Identify(IDENTITY)], id="params"
        ),
        pytest.param(
            INIT,
            identify(b'{"client_id":"a"}') + identify(b'{"client_id":"b"}'),
            [
                Identify(IDENTITY._replace(client_id="a")),
                Identify(IDENTITY._replace(client_id="b")),
            ],
            id="repeated in init",
        ),
        pytest.param(
            INIT,
            identify(b"{}" + b" " * 998),
            [Identify(IDENTITY)],
            id="body of exactly max-body-size",
        ),
        pytest.param(
            SUBSCRIBED,
            b"IDENTIFY\n",
            [E("E_INVALID cannot IDENTIFY in current state")],
            id="subscribed, before the body",
        ),
        pytest.param(
            CLOSING,
            identify(),
            [E("E_INVALID cannot IDENTIFY in current state")],
            id="closing",
        ),
        pytest.param(
            INIT,
            b"IDENTIFY\n" + size(1001),
            [E("E_BAD_BODY IDENTIFY body too big 1001 > 1000")],
            id="too big",
        ),
        pytest.param(
            INIT, b"IDENTIFY\n" + size(0), [E("E_BAD_BODY IDENTIFY invalid body size 0")], id="0"
        ),
        pytest.param(
            INIT,
            b"IDENTIFY\n\xff\xff\xff\xff",
            [E("E_BAD_BODY IDENTIFY invalid body size -1")],
            id="negative size is int32",
        ),
        pytest.param(
            INIT,
            identify(b"{"),
            [E("E_BAD_BODY IDENTIFY failed to decode JSON body")],
            id="bad json",
        ),
        pytest.param(
            INIT,
            identify(b"[]"),
            [E("E_BAD_BODY IDENTIFY failed to decode JSON body")],
            id="not an object",
        ),
        pytest.param(
            INIT,
            identify(b'{"sample_rate":100}'),
            [E("E_BAD_BODY IDENTIFY sample rate (100) is invalid")],
            id="field validation",
        ),
    ],
)
def test_identify(state: bytes, data: bytes, expected: list[Any]) -> None:
    check(state, data, expected)


def test_identify_nsqd_test_string() -> None:
    # nsqd/protocol_v2_test.go:436, with nsqd's default --max-heartbeat-interval of 60 s.
    check(
        INIT,
        identify(b'{"heartbeat_interval":300001}'),
        [E("E_BAD_BODY IDENTIFY heartbeat interval (300001) is invalid")],
        config=DEFAULT,
    )


def test_identify_pauses_until_receive_empty() -> None:
    parser = parser_in(INIT)
    events = parser.receive(identify() + b"NOP\nNOP\n")
    assert norm(events) == norm([Identify(IDENTITY)])
    assert parser.buffered == len(b"NOP\nNOP\n")  # left alone: it may be a TLS handshake
    assert parser.receive(b"") == [Nop(), Nop()]
    assert parser.buffered == 0


def test_identify_pause_then_more_data_continues() -> None:
    parser = parser_in(INIT)
    assert norm(parser.receive(identify() + b"NOP\n")) == norm([Identify(IDENTITY)])
    assert parser.receive(b"NOP\n") == [Nop(), Nop()]


def test_take_buffered_after_identify_hands_over_the_rest() -> None:
    parser = parser_in(INIT)
    rest = b"\x16\x03\x01 tls client hello, or a compressed stream"
    assert norm(parser.receive(identify(b'{"tls_v1":true}') + rest)) == norm(
        [Identify(IDENTITY._replace(tls_v1=True))]
    )
    assert parser.take_buffered() == rest
    assert parser.buffered == 0
    assert parser.receive(b"") == []
    assert parser.receive(b"NOP\n") == [Nop()]


def test_identify_heartbeats_disabled_blocks_sub() -> None:
    check(
        INIT,
        identify(b'{"heartbeat_interval":-1}') + b"SUB t c\n",
        [
            Identify(IDENTITY._replace(heartbeat_interval_ms=0)),
            E("E_INVALID cannot SUB with heartbeats disabled"),
        ],
    )
    # nsqd checks heartbeats before the parameter count.
    check(
        INIT,
        identify(b'{"heartbeat_interval":-1}') + b"SUB\n",
        [
            Identify(IDENTITY._replace(heartbeat_interval_ms=0)),
            E("E_INVALID cannot SUB with heartbeats disabled"),
        ],
    )


def test_identify_latest_heartbeat_applies() -> None:
    # the latest IDENTIFY applies; one that re-enables heartbeats allows SUB again.
    parser = parser_in(INIT)
    events = feed(
        parser,
        [identify(b'{"heartbeat_interval":-1}') + identify(b'{"heartbeat_interval":5000}')],
    )
    assert len(events) == 2
    assert parser.heartbeats_disabled is False
    assert parser.receive(b"SUB t c\n") == [Sub("t", "c")]


# -- AUTH ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "data", "expected"),
    [
        pytest.param(INIT, auth(b"secret"), [Auth(b"secret")], id="ok"),
        pytest.param(INIT, auth(b"\x00\n\r "), [Auth(b"\x00\n\r ")], id="binary secret"),
        pytest.param(INIT, auth(b"s", b"AUTH\r\n"), [Auth(b"s")], id="crlf"),
        pytest.param(
            SUBSCRIBED, b"AUTH\n", [E("E_INVALID cannot AUTH in current state")], id="subscribed"
        ),
        pytest.param(
            CLOSING, auth(b"s"), [E("E_INVALID cannot AUTH in current state")], id="closing"
        ),
        pytest.param(
            SUBSCRIBED,
            b"AUTH x\n",
            [E("E_INVALID cannot AUTH in current state")],
            id="state before params",
        ),
        pytest.param(
            INIT, b"AUTH x\n", [E("E_INVALID AUTH invalid number of parameters")], id="param"
        ),
        pytest.param(
            INIT, b"AUTH \n", [E("E_INVALID AUTH invalid number of parameters")], id="empty param"
        ),
        pytest.param(
            INIT,
            b"AUTH\n" + size(1001),
            [E("E_BAD_BODY AUTH body too big 1001 > 1000")],
            id="too big",
        ),
        pytest.param(INIT, b"AUTH\n" + size(0), [E("E_BAD_BODY AUTH invalid body size 0")], id="0"),
        pytest.param(
            INIT, b"AUTH\n" + size(-7), [E("E_BAD_BODY AUTH invalid body size -7")], id="negative"
        ),
    ],
)
def test_auth(state: bytes, data: bytes, expected: list[Any]) -> None:
    check(state, data, expected)


# -- SUB -----------------------------------------------------------------------------------------

NAME_64 = b"a" * 54 + b"#ephemeral"


@pytest.mark.parametrize(
    ("state", "data", "expected"),
    [
        pytest.param(INIT, b"SUB t c\n", [Sub("t", "c")], id="ok"),
        pytest.param(INIT, b"SUB t c\r\n", [Sub("t", "c")], id="crlf"),
        pytest.param(INIT, b"SUB t c extra\n", [Sub("t", "c")], id="extra params"),
        pytest.param(
            INIT,
            b"SUB t.-_9 c#ephemeral\n",
            [Sub("t.-_9", "c#ephemeral")],
            id="ephemeral channel",
        ),
        pytest.param(
            INIT,
            b"SUB " + NAME_64 + b" " + NAME_64 + b"\n",
            [Sub(NAME_64.decode(), NAME_64.decode())],
            id="64 chars incl suffix",
        ),
        pytest.param(
            SUBSCRIBED, b"SUB t c\n", [E("E_INVALID cannot SUB in current state")], id="twice"
        ),
        pytest.param(
            CLOSING, b"SUB t c\n", [E("E_INVALID cannot SUB in current state")], id="closing"
        ),
        pytest.param(
            SUBSCRIBED, b"SUB\n", [E("E_INVALID cannot SUB in current state")], id="state first"
        ),
        pytest.param(
            INIT, b"SUB\n", [E("E_INVALID SUB insufficient number of parameters")], id="no params"
        ),
        pytest.param(
            INIT, b"SUB t\n", [E("E_INVALID SUB insufficient number of parameters")], id="1 param"
        ),
        pytest.param(
            INIT,
            b"SUB a$ c\n",
            [E('E_BAD_TOPIC SUB topic name "a$" is not valid')],
            id="bad topic",
        ),
        pytest.param(
            INIT,
            b"SUB  c\n",
            [E('E_BAD_TOPIC SUB topic name "" is not valid')],
            id="empty topic",
        ),
        pytest.param(
            INIT,
            b"SUB t  \n",
            [E('E_BAD_CHANNEL SUB channel name "" is not valid')],
            id="empty channel",
        ),
        pytest.param(
            INIT,
            b"SUB a\tb\x01\xff c\n",
            [E(b'E_BAD_TOPIC SUB topic name "a\\tb\\x01\\xff" is not valid')],
            id="go quoting",
        ),
        pytest.param(
            INIT,
            b"SUB $ $\n",
            [E('E_BAD_TOPIC SUB topic name "$" is not valid')],
            id="topic before channel",
        ),
        pytest.param(
            INIT,
            b"SUB t c#ephemeral#ephemeral\n",
            [E('E_BAD_CHANNEL SUB channel name "c#ephemeral#ephemeral" is not valid')],
            id="bad channel",
        ),
        pytest.param(
            INIT,
            b"SUB t a" + NAME_64 + b"\n",
            [E(f'E_BAD_CHANNEL SUB channel name "a{NAME_64.decode()}" is not valid')],
            id="65 chars",
        ),
    ],
)
def test_sub(state: bytes, data: bytes, expected: list[Any]) -> None:
    check(state, data, expected)


# -- RDY -----------------------------------------------------------------------------------

U64 = 1 << 64


@pytest.mark.parametrize(
    ("state", "data", "expected"),
    [
        pytest.param(SUBSCRIBED, b"RDY 10\n", [Rdy(10)], id="ok"),
        pytest.param(SUBSCRIBED, b"RDY 10\r\n", [Rdy(10)], id="crlf"),
        pytest.param(SUBSCRIBED, b"RDY\n", [Rdy(1)], id="no argument is 1"),
        pytest.param(SUBSCRIBED, b"RDY \n", [Rdy(0)], id="empty is 0"),
        pytest.param(SUBSCRIBED, b"RDY 0\n", [Rdy(0)], id="0"),
        pytest.param(SUBSCRIBED, b"RDY 0050\n", [Rdy(50)], id="leading zeros, max"),
        pytest.param(SUBSCRIBED, b"RDY 5 extra\n", [Rdy(5)], id="extra params"),
        pytest.param(CLOSING, b"RDY 10\n", [], id="ignored while closing"),
        pytest.param(CLOSING, b"RDY x\n", [], id="even garbage while closing"),
        pytest.param(CLOSING, b"RDY 51\n", [], id="even out of range while closing"),
        pytest.param(INIT, b"RDY 1\n", [E("E_INVALID cannot RDY in current state")], id="init"),
        pytest.param(
            SUBSCRIBED, b"RDY x\n", [E("E_INVALID RDY could not parse count x")], id="not a number"
        ),
        pytest.param(
            SUBSCRIBED, b"RDY -1\n", [E("E_INVALID RDY could not parse count -1")], id="minus"
        ),
        pytest.param(
            SUBSCRIBED, b"RDY +1\n", [E("E_INVALID RDY could not parse count +1")], id="plus"
        ),
        pytest.param(
            SUBSCRIBED, b"RDY 1.5\n", [E("E_INVALID RDY could not parse count 1.5")], id="dot"
        ),
        pytest.param(
            SUBSCRIBED,
            b"RDY \xff\n",
            [E(b"E_INVALID RDY could not parse count \xff")],
            id="raw bytes echoed",
        ),
        pytest.param(
            SUBSCRIBED, b"RDY 51\n", [E("E_INVALID RDY count 51 out of range 0-50")], id="51"
        ),
        # ByteToBase10 accumulates in a uint64 and RDY converts it to int64.
        pytest.param(
            SUBSCRIBED,
            b"RDY %d\n" % (U64 - 1),
            [E("E_INVALID RDY count -1 out of range 0-50")],
            id="uint64 max is -1",
        ),
        pytest.param(SUBSCRIBED, b"RDY %d\n" % U64, [Rdy(0)], id="2**64 wraps to 0"),
        pytest.param(SUBSCRIBED, b"RDY %d\n" % (U64 + 5), [Rdy(5)], id="2**64+5 wraps to 5"),
        pytest.param(
            SUBSCRIBED,
            b"RDY 99999999999999999999\n",
            [E("E_INVALID RDY count 7766279631452241919 out of range 0-50")],
            id="20 digits",
        ),
        pytest.param(
            SUBSCRIBED,
            b"RDY " + b"1" * 5000 + b"\n",
            [E(f"E_INVALID RDY count {((10**5000 - 1) // 9) % U64} out of range 0-50")],
            id="5000 digits",
        ),
    ],
)
def test_rdy(state: bytes, data: bytes, expected: list[Any]) -> None:
    check(state, data, expected)


def test_rdy_nsqd_default_limit() -> None:
    check(SUBSCRIBED, b"RDY 2500\n", [Rdy(2500)], config=DEFAULT)
    check(SUBSCRIBED, b"RDY 2501\n", [E("E_INVALID RDY count 2501 out of range 0-2500")], DEFAULT)


# -- FIN, REQ, TOUCH -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "data", "expected"),
    [
        pytest.param(SUBSCRIBED, b"FIN " + ID + b"\n", [Fin([ID])], id="ok"),
        pytest.param(CLOSING, b"FIN " + ID + b"\n", [Fin([ID])], id="closing"),
        pytest.param(SUBSCRIBED, b"FIN " + ID + b"\r\n", [Fin([ID])], id="crlf"),
        pytest.param(SUBSCRIBED, b"FIN " + ID + b" x\n", [Fin([ID])], id="extra params"),
        pytest.param(
            SUBSCRIBED,
            b"FIN " + ID + b"\nFIN " + ID2 + b"\r\nFIN " + ID + b"\n",
            [Fin([ID, ID2, ID])],
            id="a run",
        ),
        pytest.param(
            SUBSCRIBED,
            b"FIN 0123456\r89abcdef\n",
            [Fin([b"0123456\r89abcdef"])],
            id="inner cr is part of the id",
        ),
        pytest.param(
            SUBSCRIBED,
            b"FIN \x00\x01\x02\x03\x04\x05\x06\x07\x08\t\x0b\x0c\x0e\xff\xfe\x80\n",
            [Fin([b"\x00\x01\x02\x03\x04\x05\x06\x07\x08\t\x0b\x0c\x0e\xff\xfe\x80"])],
            id="only the length is checked",
        ),
        pytest.param(
            INIT, b"FIN " + ID + b"\n", [E("E_INVALID cannot FIN in current state")], id="init"
        ),
        pytest.param(
            SUBSCRIBED, b"FIN\n", [E("E_INVALID FIN insufficient number of params")], id="no id"
        ),
        pytest.param(SUBSCRIBED, b"FIN abc\n", [E("E_INVALID invalid message ID")], id="short"),
        pytest.param(
            SUBSCRIBED, b"FIN " + ID + b"0\n", [E("E_INVALID invalid message ID")], id="17 bytes"
        ),
        pytest.param(
            SUBSCRIBED,
            b"FIN  " + ID + b"\n",
            [E("E_INVALID invalid message ID")],
            id="two spaces",
        ),
        pytest.param(
            SUBSCRIBED,
            b"FIN 0123456789abcde\r\n",
            [E("E_INVALID invalid message ID")],
            id="15 bytes then crlf",
        ),
        pytest.param(
            SUBSCRIBED,
            b"FIN 0123456789\nbcdef\n",  # 16 bytes between "FIN " and the last "\n"
            [E("E_INVALID invalid message ID")],
            id="newline inside",
        ),
        pytest.param(
            SUBSCRIBED,
            b"FIN " + ID + b"\nFIN short\n",
            [Fin([ID]), E("E_INVALID invalid message ID")],
            id="good then bad",
        ),
    ],
)
def test_fin(state: bytes, data: bytes, expected: list[Any]) -> None:
    check(state, data, expected)


@pytest.mark.parametrize(
    ("state", "data", "expected"),
    [
        pytest.param(SUBSCRIBED, b"REQ " + ID + b" 1000\n", [Req(ID, 1000, 1000)], id="ok"),
        pytest.param(CLOSING, b"REQ " + ID + b" 0\n", [Req(ID, 0, 0)], id="closing"),
        pytest.param(SUBSCRIBED, b"REQ " + ID + b" 5\r\n", [Req(ID, 5, 5)], id="crlf"),
        pytest.param(SUBSCRIBED, b"REQ " + ID + b" \n", [Req(ID, 0, 0)], id="empty is 0"),
        pytest.param(
            SUBSCRIBED,
            b"REQ " + ID + b" 3600000\n",
            [Req(ID, 3_600_000, 3_600_000)],
            id="max",
        ),
        pytest.param(
            SUBSCRIBED,
            b"REQ " + ID + b" 3600001\n",
            [Req(ID, 3_600_000, 3_600_001)],
            id="clamped, not an error",
        ),
        pytest.param(
            SUBSCRIBED,
            b"REQ " + ID + b" " + b"9" * 30 + b"\n",
            [Req(ID, 3_600_000, (10**30 - 1) % U64)],
            id="huge is clamped",
        ),
        pytest.param(
            INIT, b"REQ " + ID + b" 0\n", [E("E_INVALID cannot REQ in current state")], id="init"
        ),
        pytest.param(
            SUBSCRIBED,
            b"REQ " + ID + b"\n",
            [E("E_INVALID REQ insufficient number of params")],
            id="no timeout",
        ),
        pytest.param(
            SUBSCRIBED, b"REQ\n", [E("E_INVALID REQ insufficient number of params")], id="bare"
        ),
        pytest.param(
            SUBSCRIBED,
            b"REQ short x\n",
            [E("E_INVALID invalid message ID")],
            id="id before timeout",
        ),
        pytest.param(
            SUBSCRIBED,
            b"REQ " + ID + b" -1\n",
            [E("E_INVALID REQ could not parse timeout -1")],
            id="negative",
        ),
        pytest.param(
            SUBSCRIBED,
            b"REQ " + ID + b" 1s\n",
            [E("E_INVALID REQ could not parse timeout 1s")],
            id="not a number",
        ),
    ],
)
def test_req(state: bytes, data: bytes, expected: list[Any]) -> None:
    check(state, data, expected)


def test_req_clamps_to_configured_max() -> None:
    config = ProtocolConfig(max_req_timeout_ms=500)
    check(SUBSCRIBED, b"REQ " + ID + b" 501\n", [Req(ID, 500, 501)], config=config)


@pytest.mark.parametrize(
    ("state", "data", "expected"),
    [
        pytest.param(SUBSCRIBED, b"TOUCH " + ID + b"\n", [Touch(ID)], id="ok"),
        pytest.param(CLOSING, b"TOUCH " + ID + b"\r\n", [Touch(ID)], id="closing, crlf"),
        pytest.param(
            INIT, b"TOUCH " + ID + b"\n", [E("E_INVALID cannot TOUCH in current state")], id="init"
        ),
        pytest.param(
            SUBSCRIBED, b"TOUCH\n", [E("E_INVALID TOUCH insufficient number of params")], id="bare"
        ),
        pytest.param(SUBSCRIBED, b"TOUCH x\n", [E("E_INVALID invalid message ID")], id="bad id"),
    ],
)
def test_touch(state: bytes, data: bytes, expected: list[Any]) -> None:
    check(state, data, expected)


# -- CLS and NOP ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "data", "expected"),
    [
        pytest.param(SUBSCRIBED, b"CLS\n", [Cls()], id="ok"),
        pytest.param(SUBSCRIBED, b"CLS\r\n", [Cls()], id="crlf"),
        pytest.param(SUBSCRIBED, b"CLS\nRDY 5\n", [Cls()], id="RDY ignored after"),
        pytest.param(
            SUBSCRIBED,
            b"CLS\nFIN " + ID + b"\nREQ " + ID + b" 1\nTOUCH " + ID + b"\n",
            [Cls(), Fin([ID]), Req(ID, 1, 1), Touch(ID)],
            id="FIN REQ TOUCH after",
        ),
        pytest.param(INIT, b"CLS\n", [E("E_INVALID cannot CLS in current state")], id="init"),
        pytest.param(CLOSING, b"CLS\n", [E("E_INVALID cannot CLS in current state")], id="closing"),
        pytest.param(INIT, b"NOP\n", [Nop()], id="NOP init"),
        pytest.param(SUBSCRIBED, b"NOP\n", [Nop()], id="NOP subscribed"),
        pytest.param(CLOSING, b"NOP\n", [Nop()], id="NOP closing"),
    ],
)
def test_cls_nop(state: bytes, data: bytes, expected: list[Any]) -> None:
    check(state, data, expected)


# -- PUB -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "data", "expected"),
    [
        pytest.param(INIT, pub(b"t", b"hello"), [Pub("t", b"hello")], id="ok"),
        pytest.param(SUBSCRIBED, pub(b"t", b"x"), [Pub("t", b"x")], id="subscribed"),
        pytest.param(CLOSING, pub(b"t", b"x"), [Pub("t", b"x")], id="closing"),
        pytest.param(
            INIT, b"PUB t\r\n" + sized(b"\r\n\x00"), [Pub("t", b"\r\n\x00")], id="crlf, binary"
        ),
        pytest.param(INIT, b"PUB t x\n" + sized(b"b"), [Pub("t", b"b")], id="extra params"),
        pytest.param(INIT, pub(b"t", b"m" * 100), [Pub("t", b"m" * 100)], id="max-msg-size"),
        pytest.param(
            INIT, pub(b"t#ephemeral", b"x"), [Pub("t#ephemeral", b"x")], id="ephemeral topic"
        ),
        pytest.param(
            INIT, b"PUB\n", [E("E_INVALID PUB insufficient number of parameters")], id="no topic"
        ),
        pytest.param(
            INIT,
            pub(b"a/b", b"x"),
            [E('E_BAD_TOPIC PUB topic name "a/b" is not valid')],
            id="bad topic",
        ),
        pytest.param(
            INIT,
            b"PUB \n",
            [E('E_BAD_TOPIC PUB topic name "" is not valid')],
            id="empty topic, before the body",
        ),
        pytest.param(
            INIT,
            b"PUB t\n" + size(0),
            [E("E_BAD_MESSAGE PUB invalid message body size 0")],
            id="0",
        ),
        pytest.param(
            INIT,
            b"PUB t\n" + size(-2),
            [E("E_BAD_MESSAGE PUB invalid message body size -2")],
            id="negative",
        ),
        pytest.param(
            INIT,
            b"PUB t\n" + size(101),
            [E("E_BAD_MESSAGE PUB message too big 101 > 100")],
            id="too big, before the body",
        ),
    ],
)
def test_pub(state: bytes, data: bytes, expected: list[Any]) -> None:
    check(state, data, expected)


def test_pub_nsqd_test_string() -> None:
    # nsqd/protocol_v2_test.go: "E_BAD_MESSAGE PUB message too big 105 > 100"
    config = ProtocolConfig(max_msg_size=100)
    check(INIT, pub(b"t", b"x" * 105), [E("E_BAD_MESSAGE PUB message too big 105 > 100")], config)


# -- MPUB  -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "data", "expected"),
    [
        pytest.param(INIT, mpub(b"t", b"a", b"bc"), [Mpub("t", [b"a", b"bc"])], id="ok"),
        pytest.param(SUBSCRIBED, mpub(b"t", b"a"), [Mpub("t", [b"a"])], id="subscribed"),
        pytest.param(CLOSING, mpub(b"t", b"a"), [Mpub("t", [b"a"])], id="closing"),
        pytest.param(
            INIT,
            b"MPUB t\r\n" + sized(mpub_body(b"x" * 100)),
            [Mpub("t", [b"x" * 100])],
            id="crlf, max-msg-size",
        ),
        pytest.param(
            INIT,
            mpub(b"t", *[b"x"] * 199),
            [Mpub("t", [b"x"] * 199)],
            id="max count (1000-4)//5",
        ),
        pytest.param(
            INIT, b"MPUB\n", [E("E_INVALID MPUB insufficient number of parameters")], id="no topic"
        ),
        pytest.param(
            INIT,
            b"MPUB a!\n",
            [E('E_BAD_TOPIC E_BAD_TOPIC MPUB topic name "a!" is not valid')],
            id="code twice",
        ),
        pytest.param(
            INIT, b"MPUB t\n" + size(0), [E("E_BAD_BODY MPUB invalid body size 0")], id="size 0"
        ),
        pytest.param(
            INIT,
            b"MPUB t\n" + size(-1),
            [E("E_BAD_BODY MPUB invalid body size -1")],
            id="size negative",
        ),
        pytest.param(
            INIT,
            b"MPUB t\n" + size(1001),
            [E("E_BAD_BODY MPUB body too big 1001 > 1000")],
            id="too big",
        ),
        pytest.param(
            INIT,
            b"MPUB t\n" + sized(b"\x00\x00\x01"),
            [E("E_BAD_BODY MPUB failed to read message count")],
            id="no count",
        ),
        pytest.param(
            INIT,
            b"MPUB t\n" + sized(size(0)),
            [E("E_BAD_BODY MPUB invalid message count 0")],
            id="count 0",
        ),
        pytest.param(
            INIT,
            b"MPUB t\n" + sized(size(-3)),
            [E("E_BAD_BODY MPUB invalid message count -3")],
            id="count negative",
        ),
        pytest.param(
            INIT,
            b"MPUB t\n" + sized(size(200) + sized(b"x")),
            [E("E_BAD_BODY MPUB invalid message count 200")],
            id="count over (max-body-size-4)/5",
        ),
        pytest.param(
            INIT,
            b"MPUB t\n" + sized(size(2) + sized(b"x") + size(0)),
            [E("E_BAD_MESSAGE MPUB invalid message(1) body size 0")],
            id="message size 0",
        ),
        pytest.param(
            INIT,
            b"MPUB t\n" + sized(size(1) + size(-5)),
            [E("E_BAD_MESSAGE MPUB invalid message(0) body size -5")],
            id="message size negative",
        ),
        pytest.param(
            INIT,
            b"MPUB t\n" + sized(size(1) + sized(b"x" * 101)),
            [E("E_BAD_MESSAGE MPUB message too big 101 > 100")],
            id="message too big",
        ),
        pytest.param(
            INIT,
            # nsq.js and squeaky declare only the messages' bytes (9 here); nsqd frames the
            # messages by their count and sizes and only range-checks the declared size
            b"MPUB t\n" + size(9) + size(3) + sized(b"foo") + sized(b"bar") + sized(b"baz"),
            [Mpub("t", [b"foo", b"bar", b"baz"])],
            id="declared size short of the messages",
        ),
        pytest.param(
            INIT,
            # a declared size past the messages: what follows them is the next command
            b"MPUB t\n" + sized(mpub_body(b"a") + b"NOP\n"),
            [Mpub("t", [b"a"]), Nop()],
            id="declared size past the messages",
        ),
    ],
)
def test_mpub(state: bytes, data: bytes, expected: list[Any]) -> None:
    check(state, data, expected)


def _parsed_or_error(body: bytes | memoryview, parse: Any) -> list[bytes] | bytes:
    try:
        return list(parse(body, MPUB_CONFIG))
    except FatalClientError as err:
        return err.wire


MPUB_CONFIG = ProtocolConfig(max_msg_size=1000, max_body_size=5000)


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(mpub_body(*[b"abc"] * 7), id="all one size"),
        pytest.param(mpub_body(b"abc", b"abc", b"ab"), id="one size but the last"),
        pytest.param(mpub_body(b"abc", b"abc", b"abcd", b"abc"), id="one size but one"),
        # Sizes that differ but add up to one size's total, with bodies that look like size
        # fields where a stride would read them: only the one differing byte tells.
        pytest.param(mpub_body(b"abc", b"abc\0\0", b"a"), id="sizes differ in their last byte"),
        pytest.param(
            mpub_body(b"x" * 300, b"\x00\x00\x01\x2c" * 139, b"z" * 44),
            id="sizes differ in byte 2",
        ),
        pytest.param(size(2) + sized(b"abc") + b"\xff\x00\x00\x03abc", id="differ in byte 0"),
        pytest.param(mpub_body(*[b"abc"] * 3) + b"z", id="one size, a byte after"),
        pytest.param(mpub_body(*[b"abc"] * 3)[:-1], id="one size, a byte short"),
        pytest.param(size(4) + sized(b"abc") * 3, id="one size, a message short"),
        pytest.param(mpub_body(*[b"x" * 1001] * 2), id="one size, too big"),
        pytest.param(size(2) + size(0) + size(0), id="one size, zero"),
        pytest.param(size(2) + size(-1) + size(-1), id="one size, negative"),
    ],
)
def test_mpub_bodies_of_one_size_cut_at_a_stride_as_the_checked_loop_cuts_them(
    body: bytes,
) -> None:
    # Equal sizes are cut at a stride (strided slices check every size in C); whatever that
    # path accepts or refuses, the answer is the checked loop's, the reference.
    want = _parsed_or_error(body, parser_module._parse_mpub_body_checked)
    assert _parsed_or_error(body, parse_mpub_body) == want
    assert _parsed_or_error(memoryview(body), parse_mpub_body) == want


@given(
    bodies=st.lists(st.sampled_from([b"a", b"bb", b"ccc", b"x" * 1000, b"y" * 1001]), max_size=6),
    same=st.booleans(),
    flip=st.none() | st.tuples(st.integers(0, 10_000), st.integers(0, 255)),
    cut=st.integers(-3, 3),
)
def test_mpub_bodies_fast_paths_agree_with_the_checked_loop(
    bodies: list[bytes], same: bool, flip: tuple[int, int] | None, cut: int
) -> None:
    if same and bodies:
        bodies = [bodies[0]] * len(bodies)
    data = bytearray(mpub_body(*bodies))
    if flip is not None:
        data[flip[0] % len(data)] = flip[1]
    if cut < 0:
        del data[cut:]
    else:
        data += b"z" * cut
    body = bytes(data)
    want = _parsed_or_error(body, parser_module._parse_mpub_body_checked)
    assert _parsed_or_error(body, parse_mpub_body) == want
    assert _parsed_or_error(memoryview(body), parse_mpub_body) == want
    # Cut from the input as read, between other bytes (the TCP parser's common case): the
    # stride stops at the MPUB's end.
    read = b"MPUB t\n" + body + b"\x00\x00\x00\x05" * 300
    inside = partial(parse_mpub_body, start=7, end=7 + len(body))
    assert _parsed_or_error(read, inside) == want


# -- DPUB ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("state", "data", "expected"),
    [
        pytest.param(INIT, dpub(b"t", b"1000", b"x"), [Dpub("t", 1000, b"x")], id="ok"),
        pytest.param(SUBSCRIBED, dpub(b"t", b"0", b"x"), [Dpub("t", 0, b"x")], id="subscribed"),
        pytest.param(CLOSING, dpub(b"t", b"1", b"x"), [Dpub("t", 1, b"x")], id="closing"),
        pytest.param(INIT, dpub(b"t", b"", b"x"), [Dpub("t", 0, b"x")], id="empty is 0"),
        pytest.param(
            INIT, dpub(b"t", b"3600000", b"x"), [Dpub("t", 3_600_000, b"x")], id="max-req-timeout"
        ),
        pytest.param(
            INIT,
            b"DPUB t 5\r\n" + sized(b"m" * 100),
            [Dpub("t", 5, b"m" * 100)],
            id="crlf, max-msg-size",
        ),
        pytest.param(
            INIT,
            b"DPUB t\n",
            [E("E_INVALID DPUB insufficient number of parameters")],
            id="no timeout",
        ),
        pytest.param(
            INIT,
            b"DPUB a:b 10\n",
            [E('E_BAD_TOPIC DPUB topic name "a:b" is not valid')],
            id="bad topic",
        ),
        pytest.param(
            INIT,
            b"DPUB a:b x\n",
            [E('E_BAD_TOPIC DPUB topic name "a:b" is not valid')],
            id="topic before timeout",
        ),
        pytest.param(
            INIT,
            b"DPUB t -1\n",
            [E("E_INVALID DPUB could not parse timeout -1")],
            id="negative",
        ),
        pytest.param(
            INIT,
            b"DPUB t 10ms\n",
            [E("E_INVALID DPUB could not parse timeout 10ms")],
            id="not a number",
        ),
        pytest.param(
            INIT,
            b"DPUB t 3600100\n",
            [E("E_INVALID DPUB timeout 3600100 out of range 0-3600000")],
            id="out of range is fatal, before the body",
        ),
        pytest.param(
            INIT,
            b"DPUB t 18446744073709551615\n",
            [E("E_INVALID DPUB timeout 18446744073709551615 out of range 0-3600000")],
            id="uint64 max",
        ),
        pytest.param(
            INIT,
            b"DPUB t 0\n" + size(0),
            [E("E_BAD_MESSAGE DPUB invalid message body size 0")],
            id="body size 0",
        ),
        pytest.param(
            INIT,
            b"DPUB t 0\n" + size(101),
            [E("E_BAD_MESSAGE DPUB message too big 101 > 100")],
            id="too big",
        ),
    ],
)
def test_dpub(state: bytes, data: bytes, expected: list[Any]) -> None:
    check(state, data, expected)


# -- the state machine, every command in every state --------------------------------------

VALID = {
    "IDENTIFY": (identify(), Identify(IDENTITY)),
    "AUTH": (auth(b"s"), Auth(b"s")),
    "SUB": (b"SUB t2 c2\n", Sub("t2", "c2")),
    "RDY": (b"RDY 3\n", Rdy(3)),
    "FIN": (b"FIN " + ID + b"\n", Fin([ID])),
    "REQ": (b"REQ " + ID + b" 7\n", Req(ID, 7, 7)),
    "TOUCH": (b"TOUCH " + ID + b"\n", Touch(ID)),
    "CLS": (b"CLS\n", Cls()),
    "PUB": (pub(b"t", b"x"), Pub("t", b"x")),
    "MPUB": (mpub(b"t", b"x"), Mpub("t", [b"x"])),
    "DPUB": (dpub(b"t", b"1", b"x"), Dpub("t", 1, b"x")),
    "NOP": (b"NOP\n", Nop()),
}
STATES = {"init": INIT, "subscribed": SUBSCRIBED, "closing": CLOSING}
# "ok", "ignored" (RDY while closing) or "rejected" (E_INVALID cannot <CMD> ...).
TABLE = {
    "IDENTIFY": ("ok", "rejected", "rejected"),
    "AUTH": ("ok", "rejected", "rejected"),
    "SUB": ("ok", "rejected", "rejected"),
    "RDY": ("rejected", "ok", "ignored"),
    "FIN": ("rejected", "ok", "ok"),
    "REQ": ("rejected", "ok", "ok"),
    "TOUCH": ("rejected", "ok", "ok"),
    "CLS": ("rejected", "ok", "rejected"),
    "PUB": ("ok", "ok", "ok"),
    "MPUB": ("ok", "ok", "ok"),
    "DPUB": ("ok", "ok", "ok"),
    "NOP": ("ok", "ok", "ok"),
}
AFTER = {"SUB": ClientState.SUBSCRIBED, "CLS": ClientState.CLOSING}
STATE_OF = {
    "init": ClientState.INIT,
    "subscribed": ClientState.SUBSCRIBED,
    "closing": ClientState.CLOSING,
}


@pytest.mark.parametrize(
    ("cmd", "state"),
    [(cmd, state) for cmd in TABLE for state in STATES],
)
def test_state_machine(cmd: str, state: str) -> None:
    outcome = TABLE[cmd][list(STATES).index(state)]
    data, command = VALID[cmd]
    expected: list[Any] = {
        "ok": [command],
        "ignored": [],
        "rejected": [E(f"E_INVALID cannot {cmd} in current state")],
    }[outcome]
    check(STATES[state], data, expected)
    parser = parser_in(STATES[state])
    feed(parser, [data])
    want = AFTER.get(cmd, STATE_OF[state]) if outcome == "ok" else STATE_OF[state]
    assert parser.state == want


# -- --tls-required -----------------------------------------------------------------------


def tls_error(cmd: str) -> E:
    return E(f"E_INVALID cannot {cmd} in current state (TLS required)")


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(identify(), [Identify(IDENTITY)], id="IDENTIFY is allowed"),
        *[
            pytest.param(VALID[cmd][0], [tls_error(cmd)], id=cmd)
            for cmd in VALID
            if cmd != "IDENTIFY"
        ],
        pytest.param(b"PUB\n", [tls_error("PUB")], id="before the parameter check"),
        pytest.param(b"FOO\n", [tls_error("FOO")], id="before the unknown-command check"),
        pytest.param(b"\n", [tls_error("")], id="empty line"),
    ],
)
def test_tls_required(data: bytes, expected: list[Any]) -> None:
    check(INIT, data, expected, config=TLS, trailing_events=[tls_error("NOP")])


def test_tls_required_lifted_once_upgraded() -> None:
    parser = parser_in(INIT, TLS)
    assert norm(parser.receive(identify(b'{"tls_v1":true}'))) == norm(
        [Identify(IDENTITY._replace(tls_v1=True))]
    )
    parser.tls = True
    assert parser.receive(b"SUB t c\nNOP\nFIN " + ID + b"\n") == [Sub("t", "c"), Nop(), Fin([ID])]


# -- buffering -----------------------------------------------------------------------------------


def test_partial_body_after_other_commands_completes() -> None:
    # Regression: the bytes still needed were counted from the start of the old buffer.
    parser = parser_in(INIT)
    assert parser.receive(b"NOP\nPUB t\n" + size(5) + b"hel") == [Nop()]
    assert parser.receive(b"lo") == [Pub("t", b"hello")]
    assert parser.buffered == 0


def test_large_body_trickles_in() -> None:
    parser = parser_in(INIT, DEFAULT)
    body = bytes(range(256)) * 4096  # 1 MiB, max-msg-size
    data = pub(b"t", body)
    for i in range(0, len(data), 65536):
        events = parser.receive(data[i : i + 65536])
        assert parser.buffered <= len(data)
    assert events == [Pub("t", body)]
    assert parser.buffered == 0


def test_incomplete_commands_wait_without_error() -> None:
    for data in (
        b"PUB t",
        b"PUB t\n",
        b"PUB t\n\x00\x00",
        b"PUB t\n" + size(3) + b"ab",
        b"MPUB t\n" + size(9) + size(1),
        b"IDENTIFY\n" + size(2) + b"{",
        b"AUTH\n" + size(2),
        b"DPUB t 10\n",
    ):
        parser = parser_in(INIT)
        assert parser.receive(data) == [], data
        assert parser.buffered == len(data)


def test_error_clears_the_buffer_and_ends_the_stream() -> None:
    parser = parser_in(INIT)
    events = parser.receive(b"NOP\nBAD\nNOP\n" + b"x" * 1000)
    assert norm(events) == norm([Nop(), E("E_INVALID invalid command BAD")])
    assert parser.buffered == 0
    assert parser.receive(b"NOP\n") == []
    assert parser.receive(b"") == []


def test_fin_run_is_one_command() -> None:
    parser = parser_in(SUBSCRIBED)
    ids = [b"%016x" % i for i in range(50)]
    assert parser.receive(b"".join(b"FIN " + i + b"\n" for i in ids)) == [Fin(ids)]


def _fins(events: Sequence[Event]) -> list[Any]:
    """Events with runs of FINs merged: how a run was cut into Fin events does not matter."""
    out: list[Any] = []
    for ev in events:
        if isinstance(ev, Fin) and out and isinstance(out[-1], list):
            out[-1].extend(ev.ids)
        elif isinstance(ev, Fin):
            out.append(list(ev.ids))
        else:
            out.append(norm([ev]))
    return out


# Ids that are hex, or hold the bytes that make a FIN line unusual: a space, "\n", "\r",
# "FIN " itself.
_ids = st.one_of(
    st.integers(0, 2**64 - 1).map(lambda i: b"%016x" % i),
    st.binary(min_size=16, max_size=16).filter(lambda b: b"\n" not in b[:15]),
    st.sampled_from([b"FIN 0123456789ab", b"0123456789abcd\r\n"[:16], b"01234567 9abcdef"]),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_ids, st.just(b"NOP")), min_size=1, max_size=60))
def test_fin_runs_parse_the_same_whole_and_line_by_line(items: list[bytes]) -> None:
    data = b"".join(b"NOP\n" if i == b"NOP" else b"FIN " + i + b"\n" for i in items)
    whole = parser_in(SUBSCRIBED).receive(data)
    lines = parser_in(SUBSCRIBED)
    one_by_one: list[Event] = []
    for line in data.split(b"\n")[:-1]:
        one_by_one += lines.receive(line + b"\n")
    assert _fins(whole) == _fins(one_by_one)


# -- errors module -------------------------------------------------------------------------------


def test_error_kinds() -> None:
    fatal = FatalClientError("E_INVALID", "cannot FIN in current state")
    assert fatal.fatal is True
    assert fatal.wire == b"E_INVALID cannot FIN in current state"
    soft = ClientError("E_FIN_FAILED", "FIN 0123456789abcdef failed ID not in flight")
    assert soft.fatal is False
    assert soft.wire == b"E_FIN_FAILED FIN 0123456789abcdef failed ID not in flight"
    assert isinstance(soft, ProtocolError)
    assert FatalClientError("E_BAD_PROTOCOL").wire == b"E_BAD_PROTOCOL"


@pytest.mark.parametrize("split", [1, 10, 20])
def test_mpub_cut_from_a_buffered_body_whole_or_failing(split: int) -> None:
    # The messages are cut from a view of the parser's buffer; on success and on error the
    # view is released, so the buffer can be consumed (or cleared) after.
    good = struct.pack(">l", 2) + struct.pack(">l", 3) + b"abc" + struct.pack(">l", 2) + b"de"
    bad = struct.pack(">l", 2) + struct.pack(">l", 3) + b"abc" + struct.pack(">l", 500) + b"x"
    for payload, want in (
        (good, [Mpub("t", [b"abc", b"de"]), Nop()]),
        (bad, [E("E_BAD_MESSAGE MPUB message too big 500 > 100")]),
    ):
        data = b"MPUB t\n" + struct.pack(">l", len(payload)) + payload + b"NOP\n"
        parser = parser_in(SUBSCRIBED)
        events = parser.receive(data[:split]) + parser.receive(data[split:])
        assert norm(events) == norm(want)
        assert parser.buffered == 0
