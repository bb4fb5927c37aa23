"""A message kept in its publisher's wire form (``core/message.WireMessage``) is, to every
reader, the message its body and block make (``Message(id, body, ts, attempts, block)``):
the disk queue's record, the retained log's record, both kinds of delivery frame, a copy,
what the disk gives back. A publish of such messages counts and bounds body bytes only."""

from __future__ import annotations

import struct

from hypothesis import given
from hypothesis import strategies as st

from pynsqd.core.message import Message, WireMessage, decode_message, disk_frames
from pynsqd.protocol import frames, headers
from pynsqd.protocol.commands import Strided
from pynsqd.protocol.identify import ProtocolConfig
from pynsqd.protocol.parser import parse_mpub_body
from pynsqd.storage import log_records

names = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_.", min_size=1, max_size=12).filter(
    lambda n: n[0] not in "-_."
)
pairs = st.lists(st.tuples(names, st.binary(max_size=40)), min_size=1, max_size=4)


def _frames(msgs: list[Message], negotiated: bool) -> bytes:
    out: list[bytes] = []
    if negotiated:
        size = frames.append_message_frames_with_headers(msgs, out.extend)
    else:
        size = frames.append_message_frames(msgs, out.extend)
    data = b"".join(out)
    assert size == len(data)
    return data


@given(pairs, st.lists(st.binary(max_size=300), min_size=1, max_size=5), st.integers(0, 9))
def test_a_wire_message_is_the_message_its_body_and_block_make(
    p: list[tuple[str, bytes]], bodies: list[bytes], attempts: int
) -> None:
    block = headers.encode(p)
    ids = [b"%016x" % i for i in range(len(bodies))]
    wires = [headers.join_body(block, body) for body in bodies]
    ts = 1_700_000_000_000_000_000
    made = WireMessage.from_wires(ids, wires, ts)
    # Made knowing every block's size (a WireForm's), the same messages.
    for m, known in zip(made, WireMessage.from_wires(ids, wires, ts, len(block)), strict=True):
        assert all(getattr(m, slot) == getattr(known, slot) for slot in Message.__slots__)
        assert m.size == known.size == len(m.body)
    want = [Message(i, b, ts, 0, block) for i, b in zip(ids, bodies, strict=True)]
    for m, w in zip(made, want, strict=True):
        assert type(m) is WireMessage
        for slot in Message.__slots__:  # every slot set, to what __init__ sets
            assert getattr(m, slot) == getattr(w, slot), slot
        m.attempts = w.attempts = attempts
        assert m == w
        assert m.encode() == w.encode()
        assert m.encode_head() + m.body == w.encode()
        assert m.with_block() == w.with_block() == m.wire
        assert decode_message(m.encode()) == w
        c = m.copy()
        assert type(c) is WireMessage and c == w and c.wire is m.wire
        assert m.wire_size == c.wire_size == len(m.wire)
    for negotiated in (False, True):
        assert _frames(made, negotiated) == _frames(want, negotiated)
    # A negotiated client's frames, whatever each message is kept as: nsqd's frame whose body
    # is ``[block length][block][body]`` (an empty block for one without headers).
    plain = [Message(i, b, ts, attempts) for i, b in zip(ids, bodies, strict=True)]
    mixed = [*plain, *made, *want, *plain]
    assert _frames(mixed, True) == b"".join(
        frames.encode_message_frame(ts, attempts, m.id, headers.join_body(m.headers, m.body))
        for m in mixed
    )
    # The disk queue's framed pieces: each record after its size, as ``encode`` makes it, for
    # a wire form, a message with a block and one without (nsqd's record).
    for msgs in (made, want, plain, made + plain):
        pieces, sizes = disk_frames(msgs)
        records = [m.encode() for m in msgs]
        assert sizes == list(map(len, records))
        assert b"".join(pieces) == b"".join(struct.pack(">i", len(r)) + r for r in records)
    for identity in (None, (b"producer-1", 7)):
        got = log_records.encode(made, identity, 5, 0, 0)
        assert got == log_records.encode(want, identity, 5, 0, 0)


@given(pairs, st.integers(0, 300), st.integers(1, 30))
def test_wire_messages_from_the_parsers_strided_bodies_are_those_from_a_list(
    p: list[tuple[str, bytes]], size: int, count: int
) -> None:
    """An MPUB whose bodies are all one size comes from the parser as a ``Strided`` list, whose
    messages share one size (``from_wires`` reads it once): the same messages as from a list."""
    block = headers.encode(p)
    wires = [headers.join_body(block, bytes([i % 256]) * size) for i in range(count)]
    mpub = struct.pack(">l", count) + b"".join(struct.pack(">l", len(w)) + w for w in wires)
    strided = parse_mpub_body(mpub, ProtocolConfig(), headers=True)
    assert type(strided) is Strided and strided == wires
    ids = [b"%016x" % i for i in range(count)]
    for got, want in zip(
        WireMessage.from_wires(ids, strided, 1, len(block)),
        WireMessage.from_wires(ids, wires, 1),
        strict=True,
    ):
        assert got == want and got.size == want.size == size and got.wire == want.wire
        assert got.wire_size == want.wire_size == len(got.wire)


def test_a_wire_message_given_a_new_body_or_block_is_the_message_they_make() -> None:
    block = headers.encode([("tenant", b"acme")])
    m = WireMessage.from_wires([b"i" * 16], [headers.join_body(block, b"body")], 7)[0]
    m.body = b"a longer body"
    other = headers.encode([("kind", b"order"), ("tenant", b"acme")])
    m.headers = other
    want = Message(b"i" * 16, b"a longer body", 7, 0, other)
    assert m == want and m.size == len(want.body) and m.wire_size == len(m.wire)
    assert _frames([m], True) == _frames([want], True)


def test_a_wire_form_counts_and_splits_the_bodies() -> None:
    block = headers.encode([("traceparent", b"x" * 55), ("tenant", b"acme")])
    bodies = [b"", b"a", b"b" * 300]
    wires = [headers.join_body(block, b) for b in bodies]
    form = headers.WireForm(len(block))
    assert form.split(wires) == headers.cut(wires, form) == (bodies, [block] * 3)
    assert headers.cut(bodies, None) == (bodies, None)
    assert headers.body_bytes(wires, form) == 301
    assert headers.body_bytes(bodies, None) == 301


@given(
    st.lists(
        st.tuples(st.sampled_from(["plain", "block", "wire"]), pairs, st.binary(max_size=50)),
        min_size=1,
        max_size=8,
    ),
    st.lists(st.integers(0, 2), min_size=8, max_size=8),
)
def test_a_negotiated_clients_frames_are_each_message_framed_whole(
    kinds: list[tuple[str, list[tuple[str, bytes]], bytes]], attempts: list[int]
) -> None:
    # From cached parts (a run of one timestamp and attempts shares them), each frame is what
    # framing the message whole gives: [size][type][timestamp][attempts][id][length][block][body].
    msgs: list[Message] = []
    for i, (kind, p, body) in enumerate(kinds):
        block = headers.encode(p) if kind != "plain" else b""
        msg_id, ts = b"%016x" % i, 1_700_000_000_000_000_000 + i // 3
        if kind == "wire" and block:
            m = WireMessage.from_wires([msg_id], [headers.join_body(block, body)], ts)[0]
        else:
            m = Message(msg_id, body, ts, 0, block)
        m.attempts = attempts[i]
        msgs.append(m)
    whole = b"".join(
        frames.encode_frame(
            frames.FRAME_TYPE_MESSAGE,
            struct.pack(">qH", m.timestamp, m.attempts) + m.id + m.with_block(),
        )
        for m in msgs
    )
    assert _frames(msgs, negotiated=True) == whole
