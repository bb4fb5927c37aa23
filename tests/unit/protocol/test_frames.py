"""Server frames: layout, round trips through FrameReader, byte at a time."""

from __future__ import annotations

import itertools
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynsqd.protocol.frames import (
    CLOSE_WAIT_FRAME,
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    HEARTBEAT_FRAME,
    MAGIC_V2,
    MESSAGE_OVERHEAD,
    OK_FRAME,
    Frame,
    FrameReader,
    Message,
    decode_message,
    encode_error,
    encode_frame,
    encode_message_frame,
    encode_response,
)

ID = b"0123456789abcdef"


def test_constants() -> None:
    assert MAGIC_V2 == b"  V2"
    assert (FRAME_TYPE_RESPONSE, FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE) == (0, 1, 2)
    assert MESSAGE_OVERHEAD == 26
    assert OK_FRAME == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert HEARTBEAT_FRAME == b"\x00\x00\x00\x0f\x00\x00\x00\x00_heartbeat_"
    assert CLOSE_WAIT_FRAME == b"\x00\x00\x00\x0e\x00\x00\x00\x00CLOSE_WAIT"


def test_layout() -> None:
    # [uint32 size = len(data) + 4][uint32 frame type][data], big-endian
    assert encode_frame(7, b"abc") == b"\x00\x00\x00\x07\x00\x00\x00\x07abc"
    assert encode_response(b"") == b"\x00\x00\x00\x04\x00\x00\x00\x00"
    assert encode_error(b"E_INVALID x") == b"\x00\x00\x00\x0f\x00\x00\x00\x01E_INVALID x"
    assert encode_response(b"x") == encode_frame(FRAME_TYPE_RESPONSE, b"x")
    assert encode_error(b"x") == encode_frame(FRAME_TYPE_ERROR, b"x")


def test_message_frame_layout() -> None:
    # [int64 timestamp ns][uint16 attempts][16-byte id][body]
    frame = encode_message_frame(0x0102030405060708, 0x090A, ID, b"body")
    assert frame == (
        struct.pack(">ll", 4 + 26 + 4, FRAME_TYPE_MESSAGE)
        + b"\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a"
        + ID
        + b"body"
    )
    assert encode_message_frame(1, 1, ID, b"x") == encode_frame(
        FRAME_TYPE_MESSAGE, struct.pack(">qH", 1, 1) + ID + b"x"
    )


def test_decode_message() -> None:
    data = encode_message_frame(-5, 65535, ID, b"\x00payload")[8:]
    assert decode_message(data) == Message(-5, 65535, ID, b"\x00payload")
    assert decode_message(data[:26]) == Message(-5, 65535, ID, b"")
    with pytest.raises(ValueError, match="too short"):
        decode_message(data[:25])


def test_frame_reader_byte_at_a_time() -> None:
    stream = (
        OK_FRAME
        + encode_error(b"E_BAD_TOPIC oops")
        + encode_response(b"")
        + encode_message_frame(10, 2, ID, b"m" * 300)
        + HEARTBEAT_FRAME
    )
    reader = FrameReader()
    frames: list[Frame] = []
    for i in range(len(stream)):
        reader.feed(stream[i : i + 1])
        frames += reader.frames()
    assert frames == [
        Frame(FRAME_TYPE_RESPONSE, b"OK"),
        Frame(FRAME_TYPE_ERROR, b"E_BAD_TOPIC oops"),
        Frame(FRAME_TYPE_RESPONSE, b""),
        Frame(FRAME_TYPE_MESSAGE, encode_message_frame(10, 2, ID, b"m" * 300)[8:]),
        Frame(FRAME_TYPE_RESPONSE, b"_heartbeat_"),
    ]
    assert decode_message(frames[3].data) == Message(10, 2, ID, b"m" * 300)
    assert reader.frames() == []


def test_frame_reader_keeps_partial_frames() -> None:
    reader = FrameReader()
    reader.feed(OK_FRAME + OK_FRAME[:5])
    assert reader.frames() == [Frame(0, b"OK")]
    assert reader.frames() == []
    reader.feed(OK_FRAME[5:])
    assert reader.frames() == [Frame(0, b"OK")]


@pytest.mark.parametrize("size", [-1, 0, 3, 101])
def test_frame_reader_rejects_bad_sizes(size: int) -> None:
    reader = FrameReader(max_frame_size=100)
    reader.feed(struct.pack(">ll", size, 0))
    with pytest.raises(ValueError, match="invalid frame size"):
        reader.frames()


def test_frame_reader_max_frame_size_is_inclusive() -> None:
    reader = FrameReader(max_frame_size=100)
    reader.feed(encode_response(b"x" * 96))
    assert reader.frames() == [Frame(0, b"x" * 96)]


FRAMES = st.one_of(
    st.builds(lambda d: (encode_response(d), Frame(0, d)), st.binary(max_size=40)),
    st.builds(lambda d: (encode_error(d), Frame(1, d)), st.binary(max_size=40)),
    st.builds(
        lambda ts, att, mid, body: (
            encode_message_frame(ts, att, mid, body),
            Frame(2, struct.pack(">qH", ts, att) + mid + body),
        ),
        st.integers(-(2**63), 2**63 - 1),
        st.integers(0, 65535),
        st.binary(min_size=16, max_size=16),
        st.binary(max_size=40),
    ),
)


@settings(max_examples=100, deadline=None)
@given(st.lists(FRAMES, max_size=6), st.lists(st.integers(0, 500), max_size=8))
def test_round_trip_any_chunking(frames: list[tuple[bytes, Frame]], cuts: list[int]) -> None:
    stream = b"".join(raw for raw, _ in frames)
    points = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    reader = FrameReader()
    got: list[Frame] = []
    for a, b in itertools.pairwise(points):
        reader.feed(stream[a:b])
        got += reader.frames()
    assert got == [frame for _, frame in frames]
    for frame in got:
        if frame.frame_type == FRAME_TYPE_MESSAGE:
            msg = decode_message(frame.data)
            assert encode_message_frame(msg.timestamp, msg.attempts, msg.id, msg.body)[8:] == (
                frame.data
            )
