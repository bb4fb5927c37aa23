"""Random input: the parser emits only commands and ProtocolErrors, and bounds its buffer.

Only the protocol's own error may escape the parser (STYLE.md, h11): anything else is a bug.
"""

from __future__ import annotations

import itertools
import json
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pynsqd.internal.names import is_valid_name
from pynsqd.protocol.commands import (
    Auth,
    ClientState,
    Cls,
    Dpub,
    Fin,
    Identify,
    Mpub,
    Nop,
    Pub,
    Rdy,
    Req,
    Sub,
    Touch,
)
from pynsqd.protocol.errors import FatalClientError, ProtocolError
from pynsqd.protocol.identify import ProtocolConfig
from pynsqd.protocol.parser import V2Parser

COMMANDS = (Identify, Auth, Sub, Pub, Mpub, Dpub, Rdy, Fin, Req, Touch, Cls, Nop)
# Small limits, so that random input reaches every bound, the line length included.
CONFIG = ProtocolConfig(
    max_msg_size=48, max_body_size=160, max_rdy_count=50, max_req_timeout_ms=1000
)
CONFIGS = st.sampled_from(
    [
        CONFIG,
        ProtocolConfig(max_msg_size=48, max_body_size=160, max_line_length=40),
        ProtocolConfig(max_msg_size=200, max_body_size=64, max_line_length=24, tls_required=True),
    ]
)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)] or [b""]


def check_id(msg_id: bytes) -> None:
    # What survives nsqd's line splitting: 16 bytes, no space, no "\n". (It may end in "\r":
    # "FIN <15 bytes>\r\r\n" loses only one "\r".)
    assert len(msg_id) == 16 and b" " not in msg_id and b"\n" not in msg_id, msg_id


def check_command(event: object, config: ProtocolConfig) -> None:
    """Whatever the input, a command that comes out is one nsqd would have accepted."""
    if isinstance(event, Fin):
        assert event.ids
        for msg_id in event.ids:
            check_id(msg_id)
    elif isinstance(event, Touch):
        check_id(event.id)
    elif isinstance(event, Req):
        check_id(event.id)
        assert 0 <= event.timeout_ms <= config.max_req_timeout_ms
        assert event.timeout_ms == min(event.requested_ms, config.max_req_timeout_ms)
    elif isinstance(event, Rdy):
        assert 0 <= event.ready_count <= config.max_rdy_count
    elif isinstance(event, Sub):
        assert is_valid_name(event.topic) and is_valid_name(event.channel)
    elif isinstance(event, Pub | Dpub):
        assert is_valid_name(event.topic)
        assert 0 < len(event.body) <= config.max_msg_size
        if isinstance(event, Dpub):
            assert 0 <= event.defer_ms <= config.max_req_timeout_ms
    elif isinstance(event, Mpub):
        assert is_valid_name(event.topic)
        assert event.bodies
        assert all(0 < len(b) <= config.max_msg_size for b in event.bodies)
        assert sum(4 + len(b) for b in event.bodies) + 4 <= config.max_body_size
    elif isinstance(event, Auth):
        assert 0 < len(event.secret) <= config.max_body_size
    elif isinstance(event, Identify):
        data = event.data
        assert 0 <= data.sample_rate <= 99
        assert data.heartbeat_interval_ms == 0 or data.heartbeat_interval_ms >= 1000
        for text in (data.client_id, data.hostname, data.user_agent):
            text.encode()  # valid UTF-8, no lone surrogates


def run(config: ProtocolConfig, chunks: list[bytes], magic: bool, tls_after_identify: bool) -> None:
    parser = V2Parser(config, expect_magic=magic)
    bound = config.max_line_length + max(config.max_body_size, config.max_msg_size) + 8
    ended = False
    for chunk in chunks:
        batch = parser.receive(chunk)
        while True:
            for i, event in enumerate(batch):
                assert not ended, "an event after the error that ended the stream"
                if isinstance(event, ProtocolError):
                    assert isinstance(event, FatalClientError)
                    assert i == len(batch) - 1, "the error is the last event"
                    assert event.wire.startswith(event.code.encode())
                    assert event.code.startswith("E_")
                    ended = True
                else:
                    assert isinstance(event, COMMANDS), event
                    check_command(event, config)
            if not batch or type(batch[-1]) is not Identify:
                break
            if tls_after_identify:
                parser.tls = True
            batch = parser.receive(b"")  # IDENTIFY pauses the parser
        # Once drained, at most one incomplete command is left.
        assert parser.buffered <= bound, (parser.buffered, bound)
        if ended:
            assert parser.buffered == 0
    assert parser.state in (ClientState.INIT, ClientState.SUBSCRIBED, ClientState.CLOSING)


@FUZZ
@given(
    config=CONFIGS,
    data=st.binary(max_size=400),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
    magic=st.booleans(),
    tls=st.booleans(),
)
def test_random_bytes(
    config: ProtocolConfig, data: bytes, cuts: list[int], magic: bool, tls: bool
) -> None:
    run(config, chunked(data, cuts), magic=magic, tls_after_identify=tls)


@FUZZ
@given(
    config=CONFIGS,
    data=st.binary(max_size=400),
    cuts=st.lists(st.integers(min_value=0, max_value=404), max_size=12),
)
def test_random_bytes_after_magic(config: ProtocolConfig, data: bytes, cuts: list[int]) -> None:
    run(config, chunked(b"  V2" + data, cuts), magic=True, tls_after_identify=True)


# -- structured commands, then mutated ------------------------------------------------------------

SIZE = struct.Struct(">l")


def mostly(
    valid: st.SearchStrategy[Any], invalid: st.SearchStrategy[Any]
) -> st.SearchStrategy[Any]:
    """Three times in four a valid value, so that streams get past their first commands."""
    return st.integers(0, 3).flatmap(lambda k: invalid if k == 0 else valid)


NAMES = mostly(
    st.sampled_from([b"t", b"topic.1", b"c#ephemeral", b"x" * 64]),
    st.sampled_from([b"", b"a b", b"x" * 65, b"\xff", b"$", b"t\r"]),
)
NUMBERS = mostly(
    st.sampled_from([b"0", b"1", b"50", b"1000", b""]),
    st.sampled_from([b"51", b"1001", b"-1", b"+1", b"1.0"])
    | st.integers(min_value=0, max_value=2**70).map(lambda n: str(n).encode()),
)
IDS = mostly(
    st.binary(min_size=16, max_size=16),
    st.binary(min_size=14, max_size=18) | st.just(b"0123456789abcde\r"),
)
BODIES = st.binary(min_size=0, max_size=60)
JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(allow_nan=True),
    st.text(max_size=8),
)
IDENTIFY_KEYS = st.sampled_from(
    [
        "client_id",
        "heartbeat_interval",
        "output_buffer_size",
        "output_buffer_timeout",
        "sample_rate",
        "msg_timeout",
        "feature_negotiation",
        "deflate_level",
        "TLS_V1",
        "unknown",
    ]
)


def size_prefixed(body: bytes, declared: int | None) -> bytes:
    return SIZE.pack(len(body) if declared is None else declared) + body


DECLARED = mostly(st.none(), st.integers(min_value=-(2**31), max_value=2**31 - 1))


@st.composite
def command(draw: st.DrawFn) -> bytes:
    kind = draw(
        st.sampled_from(
            ["IDENTIFY", "AUTH", "SUB", "PUB", "MPUB", "DPUB", "RDY", "FIN", "REQ", "TOUCH", "CLS"]
        )
    )
    eol = draw(st.sampled_from([b"\n", b"\r\n"]))
    if kind == "IDENTIFY":
        doc = draw(st.dictionaries(IDENTIFY_KEYS, JSON_VALUES, max_size=4))
        body = json.dumps(doc).encode()
        return b"IDENTIFY" + eol + size_prefixed(body, draw(DECLARED))
    if kind == "AUTH":
        return b"AUTH" + eol + size_prefixed(draw(BODIES), draw(DECLARED))
    if kind == "SUB":
        return b"SUB " + draw(NAMES) + b" " + draw(NAMES) + eol
    if kind in ("PUB", "DPUB"):
        head = b"PUB " + draw(NAMES) if kind == "PUB" else b"DPUB " + draw(NAMES)
        if kind == "DPUB":
            head += b" " + draw(NUMBERS)
        return head + eol + size_prefixed(draw(BODIES), draw(DECLARED))
    if kind == "MPUB":
        bodies = draw(st.lists(BODIES, max_size=4))
        inner = SIZE.pack(draw(st.integers(-2, 6))) + b"".join(
            size_prefixed(b, draw(st.none() | st.integers(-2, 70))) for b in bodies
        )
        return b"MPUB " + draw(NAMES) + eol + size_prefixed(inner, draw(DECLARED))
    if kind == "RDY":
        return draw(st.sampled_from([b"RDY", b"RDY "])) + draw(NUMBERS) + eol
    if kind in ("FIN", "TOUCH"):
        return kind.encode() + b" " + draw(IDS) + eol
    if kind == "REQ":
        return b"REQ " + draw(IDS) + b" " + draw(NUMBERS) + eol
    if kind == "CLS":
        return b"CLS" + eol
    return draw(st.sampled_from([b"NOP", b"", b"IDENTIFY x"]) | st.binary(max_size=30)) + eol


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    buf = bytearray(data)
    for _ in range(draw(st.integers(0, 3))):
        if not buf:
            break
        op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        at = draw(st.integers(0, len(buf) - 1))
        if op == "flip":
            buf[at] = draw(st.integers(0, 255))
        elif op == "insert":
            buf[at:at] = draw(st.sampled_from([b"\n", b" ", b"\r", b"\x00", b"\xff", b"FIN "]))
        elif op == "delete":
            del buf[at]
        else:
            del buf[at:]
    return bytes(buf)


PREFIXES = st.sampled_from([b"", b"SUB t c\n", b"SUB t c\nCLS\n"])
VALID_STREAMS = st.builds(
    lambda prefix, cmds: prefix + b"".join(cmds),
    PREFIXES,
    st.lists(command(), min_size=1, max_size=8),
)
STREAMS = VALID_STREAMS.flatmap(mutated)


@FUZZ
@given(
    config=CONFIGS,
    stream=STREAMS,
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=10),
    magic=st.booleans(),
    tls=st.booleans(),
)
def test_mutated_commands(
    config: ProtocolConfig, stream: bytes, cuts: list[int], magic: bool, tls: bool
) -> None:
    data = b"  V2" + stream if magic else stream
    run(config, chunked(data, cuts), magic=magic, tls_after_identify=tls)


@settings(FUZZ, max_examples=150)
@given(
    stream=VALID_STREAMS | STREAMS,
    cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=10),
)
def test_chunking_does_not_change_the_result(stream: bytes, cuts: list[int]) -> None:
    def events(chunks: list[bytes]) -> list[tuple[object, ...]]:
        parser = V2Parser(CONFIG, expect_magic=False)
        out: list[tuple[object, ...]] = []
        for chunk in chunks:
            batch = parser.receive(chunk)
            while batch:
                for ev in batch:
                    if isinstance(ev, ProtocolError):
                        out.append(("error", ev.wire))
                    elif type(ev) is Fin:  # how FINs are batched depends on the chunks
                        out.extend(("Fin", i) for i in ev.ids)
                    else:
                        out.append((type(ev).__name__, *ev))
                if type(batch[-1]) is not Identify:
                    break
                batch = parser.receive(b"")
        return out

    whole = events([stream])
    assert events(chunked(stream, cuts)) == whole
    for i in range(1, len(stream)):
        assert events([stream[:i], stream[i:]]) == whole, i
