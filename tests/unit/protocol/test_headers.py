"""The header block (``protocol/headers.py``) and the stored encodings that carry it
(``core/message.py``'s disk encoding, ``protocol/log_record.py``'s HEADERS records): no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pynsqd.core.message import Message, decode_message
from pynsqd.protocol import encode, headers, log_record
from pynsqd.protocol.commands import Mpub, Pub, Strided
from pynsqd.protocol.headers import HeaderError, HeaderLimits
from pynsqd.protocol.identify import ProtocolConfig
from pynsqd.protocol.parser import V2Parser

pytestmark = pytest.mark.unit

names = st.from_regex(r"[a-z0-9][a-z0-9_.\-]{0,20}", fullmatch=True)
pairs = st.lists(st.tuples(names, st.binary(max_size=40)), max_size=8)


@given(pairs, st.binary(max_size=100))
def test_a_block_and_a_body_come_back_as_they_went(p: list[tuple[str, bytes]], body: bytes) -> None:
    block = headers.encode(p)
    assert headers.decode(block) == p
    assert headers.split_body(headers.join_body(block, body), HeaderLimits()) == (block, body)


@given(pairs, st.binary(max_size=100), st.integers(0, 0xFFFF))
def test_a_stored_message_keeps_its_headers_and_one_without_is_nsqds_encoding(
    p: list[tuple[str, bytes]], body: bytes, attempts: int
) -> None:
    block = headers.encode(p)
    m = Message(b"0123456789abcdef", body, 1_700_000_000_000_000_000, attempts, block)
    assert decode_message(m.encode()) == m
    assert m.encode_head() + m.body == m.encode()
    plain = Message(b"0123456789abcdef", body, 1_700_000_000_000_000_000, attempts)
    # nsqd's own layout, byte for byte: [ts][attempts][id][body]
    assert plain.encode()[:8] == (1_700_000_000_000_000_000).to_bytes(8, "big")
    assert decode_message(plain.encode()) == plain and plain.headers == b""


@given(pairs, st.binary(max_size=100))
def test_a_log_record_keeps_its_headers(p: list[tuple[str, bytes]], body: bytes) -> None:
    block = headers.encode(p)
    head, stored = log_record.encode_record(
        7, 1_700_000_000_000_000_000, b"0" * 16, 0, 0, body, None, block
    )
    (record,), damaged = log_record.scan_records(head + stored)
    assert damaged is None
    assert (record.headers, record.body, record.attempts) == (block, body, 0)


def test_names_are_folded_and_checked_and_limits_are_named() -> None:
    assert headers.decode(headers.encode([("TraceParent", b"x")])) == [("traceparent", b"x")]
    for bad in ("", "a b", "é", "-x", "x" * 256):
        with pytest.raises(HeaderError, match="header name"):
            headers.encode([(bad, b"")])
    block = headers.encode([("a", b"1"), ("b", b"2"), ("c", b"3")])
    with pytest.raises(HeaderError, match="--max-headers=2"):
        headers.check(block, HeaderLimits(max_count=2))
    with pytest.raises(HeaderError, match="--max-header-bytes=5"):
        headers.check(block, HeaderLimits(max_bytes=5))


@pytest.mark.parametrize(
    "block",
    [b"\x00", b"\x01a", b"\x01a\x00", b"\x01a\x00\x05abc", b"\x02Ab\x00\x00", b"\x05abc"],
)
def test_a_broken_block_is_refused_never_misread(block: bytes) -> None:
    with pytest.raises(HeaderError):
        headers.decode(block)
    m = Message(b"0123456789abcdef", b"body", 1, 0, block)
    enc = bytearray(m.encode())
    enc[26:28] = (len(block) + 10).to_bytes(2, "big")  # a length past the record
    with pytest.raises(ValueError):
        decode_message(bytes(enc))


def _one_by_one(datas: list[bytes], limits: HeaderLimits) -> tuple[list[bytes], list[bytes]]:
    """The reference: each body split and checked on its own."""
    split = [headers.split_body(d, limits) for d in datas]
    return [body for _, body in split], [block for block, _ in split]


@given(
    pairs,
    st.integers(1, 30),
    st.binary(min_size=0, max_size=30),
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=3),
    st.sampled_from([0, 1, 7]),
    st.none() | st.integers(0, 10_000),
)
def test_a_publishs_bodies_split_at_once_as_each_would_be_alone(
    p: list[tuple[str, bytes]],
    count: int,
    body: bytes,
    flips: list[tuple[int, int]],
    vary: int,
    cut: int | None,
) -> None:
    """Bodies with one skeleton are compared with it at once (``_shared_block_size``: a
    strided slice per skeleton byte when all are one size as the parser cut them, a set per
    run otherwise); a byte changed anywhere (a name, a length, a value, a body), bodies of
    differing lengths (``vary``) and one cut short must give what checking each body alone
    gives: the same split, or a HeaderError."""
    limits = HeaderLimits(max_count=6, max_bytes=300)
    datas = []
    for i in range(count):  # each message its own values, of the first one's lengths
        own = [(n, bytes((v + i) % 256 for v in value)) for n, value in p]
        datas.append(headers.join_body(headers.encode(own), body[: len(body) - i % (vary + 1)]))
    for where, value in flips:
        k = where % count
        pos = where // count % len(datas[k])
        d = bytearray(datas[k])
        d[pos] = value
        datas[k] = bytes(d)
    if cut is not None:  # one body cut short (inside its block, maybe)
        k = cut % count
        datas[k] = datas[k][: cut // count % (len(datas[k]) + 1)]
    try:
        expected: tuple[list[bytes], list[bytes]] | None = _one_by_one(datas, limits)
    except HeaderError:
        expected = None
    # Both ways the strided path meets bodies: a list of them (``/mpub``, a link), and
    # the parser's ``Strided`` cut from the MPUB as read, with another command after it.
    # (MPUB refuses an empty body; a parser told of no headers cuts nothing)
    parsed = _as_parsed(datas, negotiated=True) if all(datas) else datas
    assert type(parsed) is Strided or len(set(map(len, datas))) > 1 or not all(datas)
    assert not all(datas) or _as_parsed(datas, negotiated=False) == datas
    if expected is None:
        with pytest.raises(HeaderError):
            headers.split_bodies(datas, limits)
        with pytest.raises(HeaderError):
            headers.split_bodies(parsed, limits)
        return
    assert headers.split_bodies(parsed, limits) == headers.split_bodies(datas, limits)
    if type(parsed) is Strided and parsed.unblocked:  # cut past empty blocks at once
        assert expected[1] == [b""] * count and parsed == expected[0]
    bodies, blocks = headers.split_bodies(datas, limits)
    if isinstance(blocks, headers.WireForm):  # kept as sent: what a WireMessage cuts on read
        assert bodies == datas
        bodies, blocks = blocks.split(bodies)
        assert headers.body_bytes(datas, headers.WireForm(len(blocks[0]))) == sum(map(len, bodies))
    assert bodies == expected[0]
    assert (blocks or [b""] * count) == expected[1]
    assert blocks is None or any(blocks)  # None exactly when no message has headers


def _as_parsed(datas: list[bytes], *, negotiated: bool) -> list[bytes]:
    """``datas`` as the TCP parser of a connection that negotiated headers (or not) hands
    them on: cut from one read holding their MPUB and the command after it (so a stride
    must stop at the MPUB's end)."""
    parser = V2Parser(ProtocolConfig(), expect_magic=False)
    parser.headers = negotiated
    events = parser.receive(encode.mpub("t", datas) + encode.pub("t", bytes(range(256)) * 2))
    assert len(events) == 2 and type(events[1]) is Pub
    mpub = events[0]
    assert type(mpub) is Mpub
    assert mpub.bodies == datas or (negotiated and mpub.bodies == [d[2:] for d in datas])
    return mpub.bodies


@pytest.mark.parametrize("which", ["first", "middle", "last"])
@pytest.mark.parametrize(
    ("where", "value"),
    [
        (1, 83),  # the block length
        (2, 4),  # the first name's length
        (3, ord("x")),  # a name byte, still a valid name
        (3, ord("X")),  # a name byte, no longer valid
        (15, 9),  # the first value's length
        (71, 5),  # the second name's length
        (72, ord("z")),  # the second name, still valid
        (79, 3),  # the second value's length
    ],
)
def test_one_body_whose_skeleton_differs_is_found_wherever_it_is(
    which: str, where: int, value: int
) -> None:
    # Every skeleton byte is compared across every body, the last one included (where the
    # input ends), whichever of the two fast paths the bodies take. The block: [0:2] its
    # length, [2] 11, [3:14] traceparent, [14:16] 55, the value, [71] 6, [72:78] tenant,
    # [78:80] 4, acme.
    trace = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    block = headers.encode([("traceparent", trace), ("tenant", b"acme")])
    datas = [headers.join_body(block, b"x" * 20) for _ in range(7)]
    k = {"first": 0, "middle": 3, "last": 6}[which]
    d = bytearray(datas[k])
    assert d[where] != value
    d[where] = value
    datas[k] = bytes(d)
    limits = HeaderLimits(max_count=6, max_bytes=300)
    parsed = _as_parsed(datas, negotiated=True)
    assert type(parsed) is Strided
    try:
        expected: tuple[list[bytes], list[bytes]] | None = _one_by_one(datas, limits)
    except HeaderError:
        expected = None
    for given_as in (parsed, datas):
        if expected is None:
            with pytest.raises(HeaderError):
                headers.split_bodies(given_as, limits)
            continue
        bodies, blocks = headers.split_bodies(given_as, limits)
        assert not isinstance(blocks, headers.WireForm)
        assert (bodies, blocks) == expected


def test_the_skeleton_checks_kept_answers_are_bounded() -> None:
    """What the skeleton check keeps between publishes (each skeleton byte repeated once per
    body) is bounded: a client's huge batches or many skeletons do not make the server hold
    more than 64 answers of 64 KiB; the check is the same whether its answer was kept."""
    headers._REPEATED.clear()
    limits = HeaderLimits(max_count=16, max_bytes=4096)
    for names in range(100):  # many skeletons: the kept answers stay few
        block = headers.encode([(f"n{names}", b"v")])
        parsed = _as_parsed([headers.join_body(block, b"body")] * 3, negotiated=True)
        assert headers.split_bodies(parsed, limits)[1] == headers.WireForm(len(block))
        assert len(headers._REPEATED) <= headers._REPEATED_KEPT
    # One huge batch: its answer (25 skeleton bytes x 5,000 bodies) is used, not kept.
    block = headers.encode([("traceparent", b"x" * 55), ("tenant", b"acme")])
    wires = [headers.join_body(block, b"") for _ in range(5000)]
    parsed = _as_parsed(wires, negotiated=True)
    assert headers.split_bodies(parsed, limits)[1] == headers.WireForm(len(block))
    assert all(len(want) <= headers._REPEATED_MAX_BYTES for want in headers._REPEATED.values())
    bad = list(wires)
    bad[-1] = bad[-1][:3] + b"y" + bad[-1][4:]  # the last body's first name byte: another name
    assert headers.split_bodies(_as_parsed(bad, negotiated=True), limits)[1] != headers.WireForm(
        len(block)
    )
