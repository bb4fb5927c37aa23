"""Server frames: ``[int32 size][int32 frame type][data]``, big-endian.

A message frame's data is ``[int64 timestamp ns][uint16 attempts][16-byte id][body]``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Protocol

FRAME_TYPE_RESPONSE = 0
FRAME_TYPE_ERROR = 1
FRAME_TYPE_MESSAGE = 2

MAGIC_V2 = b"  V2"
HEARTBEAT = b"_heartbeat_"
OK = b"OK"
CLOSE_WAIT = b"CLOSE_WAIT"

#: size, frame type, timestamp, attempts: the fixed part of a message frame before the id.
MESSAGE_HEADER = struct.Struct(">llqH")
#: timestamp + attempts + id: the overhead of a message's encoding, on the wire and on disk.
MESSAGE_OVERHEAD = 8 + 2 + 16
_FRAME_HEADER = struct.Struct(">ll")
#: timestamp, attempts: what follows a message frame's start, before the id.
MESSAGE_FIXED = struct.Struct(">qH")
#: A message frame's ``[size][frame type]`` by body size, filled by ``message_frame_start``.
MESSAGE_FRAME_STARTS: dict[int, bytes] = {}
_STARTS_KEPT = 4096


def encode_frame(frame_type: int, data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, frame_type) + data


def encode_response(data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, FRAME_TYPE_RESPONSE) + data


def encode_error(data: bytes) -> bytes:
    return _FRAME_HEADER.pack(len(data) + 4, FRAME_TYPE_ERROR) + data


def encode_message_frame(timestamp: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    return (
        MESSAGE_HEADER.pack(len(body) + 30, FRAME_TYPE_MESSAGE, timestamp, attempts) + msg_id + body
    )


def message_frame_start(body_size: int) -> bytes:
    """``[size][frame type]`` of a message frame whose body is ``body_size`` bytes, kept in
    ``MESSAGE_FRAME_STARTS`` (at most 4,096 sizes) so that a frame is built from cached parts
    rather than packed whole per message."""
    if len(MESSAGE_FRAME_STARTS) >= _STARTS_KEPT:
        MESSAGE_FRAME_STARTS.clear()
    start = MESSAGE_FRAME_STARTS[body_size] = _FRAME_HEADER.pack(
        body_size + 4 + MESSAGE_OVERHEAD, FRAME_TYPE_MESSAGE
    )
    return start


class Framed(Protocol):
    """What a message frame is made of (``core/message.Message``)."""

    @property
    def id(self) -> bytes: ...
    @property
    def body(self) -> bytes: ...
    @property
    def timestamp(self) -> int: ...
    @property
    def attempts(self) -> int: ...
    @property
    def headers(self) -> bytes: ...
    @property
    def wire(self) -> bytes | None: ...
    @property
    def wire_size(self) -> int:
        """``len(wire)``."""

    @property
    def size(self) -> int:
        """The body's length."""


def append_message_frames(msgs: Sequence[Framed], extend: Callable[[Iterable[bytes]], None]) -> int:
    """Add the message frames of ``msgs`` to an output buffer (its ``extend``), four parts
    each: the start (by body size, cached), timestamp + attempts (packed once per run of
    messages that share them: a publish shares its timestamp), the id and the body (packing
    each frame whole cost a third more; one ``extend`` of the four costs less than four
    ``append``). Returns the bytes added.

    Sizes are the messages' own (``size``): ``len(body)`` would make a new int object per
    message for every body over 256 bytes (Python keeps only small ones). They are summed in
    the loop: ``sum(map(attrgetter("size"), msgs))`` takes a generic attribute lookup per
    message from C, which cost more (about 10 ns a message) than adding the size at hand."""
    starts = MESSAGE_FRAME_STARTS
    fixed = MESSAGE_FIXED.pack
    ts = attempts = -1
    middle = b""
    size = 0
    for m in msgs:
        if m.timestamp != ts or m.attempts != attempts:
            ts = m.timestamp
            attempts = m.attempts
            middle = fixed(ts, attempts)
        n = m.size
        try:  # (free in Python 3.11 while nothing is raised)
            start = starts[n]
        except KeyError:
            start = message_frame_start(n)
        extend((start, middle, m.id, m.body))
        size += n
    return size + (8 + MESSAGE_OVERHEAD) * len(msgs)


_BLOCK_LEN = struct.Struct(">H")
#: The block length of a message without headers, to a client that negotiated them.
_NO_BLOCK = b"\x00\x00"


def append_message_frames_with_headers(
    msgs: Sequence[Framed], extend: Callable[[Iterable[bytes]], None]
) -> int:
    """``append_message_frames`` for a client that negotiated headers
    (``protocol/headers.py``): each frame's body is ``[uint16 block length][block][body]``,
    from the same cached parts (a message kept in its publisher's wire form, ``WireMessage``,
    adds that as it is; one without headers its empty block's length, ``_NO_BLOCK``, before
    its body, the frame's start looked up by its body's size as a plain frame's is). Its loop
    repeats ``append_message_frames``'s on purpose: one loop with a branch per message for
    both cost a plain consumer 25-40 ns a message (of ~110).

    The bytes added are summed in the loop, as the plain loop sums them."""
    starts = MESSAGE_FRAME_STARTS
    bare = _BARE_FRAME_STARTS
    fixed = MESSAGE_FIXED.pack
    ts = attempts = -1
    middle = b""
    size = 0
    for m in msgs:
        if m.timestamp != ts or m.attempts != attempts:
            ts = m.timestamp
            attempts = m.attempts
            middle = fixed(ts, attempts)
        wire = m.wire
        if wire is not None:
            n = m.wire_size
        elif not m.headers:
            n = m.size
            try:
                start = bare[n]
            except KeyError:
                start = _bare_frame_start(n)
            extend((start, middle, m.id, _NO_BLOCK, m.body))
            size += n + 2
            continue
        else:
            block = m.headers
            wire = _BLOCK_LEN.pack(len(block)) + block + m.body
            n = len(wire)
        try:
            start = starts[n]
        except KeyError:
            start = message_frame_start(n)
        extend((start, middle, m.id, wire))
        size += n
    return size + (8 + MESSAGE_OVERHEAD) * len(msgs)


#: A negotiated client's frame start for a message without headers, by its body's size.
_BARE_FRAME_STARTS: dict[int, bytes] = {}


def _bare_frame_start(body_size: int) -> bytes:
    """``message_frame_start`` of a body of ``body_size`` after an empty block's length,
    kept in ``_BARE_FRAME_STARTS`` (as many sizes as that)."""
    if len(_BARE_FRAME_STARTS) >= _STARTS_KEPT:
        _BARE_FRAME_STARTS.clear()
    start = _BARE_FRAME_STARTS[body_size] = message_frame_start(body_size + 2)
    return start


OK_FRAME = encode_response(OK)
#: pynsqd: the answer to an identified publish (``PUB <topic> <producer> <sequence>``) some of
#: whose records the log already held: acknowledged, not written again. Only a client that
#: sends identities (which nsqd has not) gets it; every other answer is nsqd's ``OK``.
OK_DUPLICATES = b"OK DUPLICATES "


def ok_answer(duplicates: int) -> bytes:
    """A publish's OK: ``OK``, or ``OK DUPLICATES <n>`` when ``n`` of its records were there."""
    return OK if duplicates <= 0 else OK_DUPLICATES + b"%d" % duplicates


def duplicates_in(answer: bytes) -> int | None:
    """How many records an OK says were already there (0 for ``OK``); None: not an OK."""
    if answer == OK:
        return 0
    if answer.startswith(OK_DUPLICATES) and answer[len(OK_DUPLICATES) :].isdigit():
        return int(answer[len(OK_DUPLICATES) :])
    return None


HEARTBEAT_FRAME = encode_response(HEARTBEAT)
CLOSE_WAIT_FRAME = encode_response(CLOSE_WAIT)


class Frame(NamedTuple):
    frame_type: int
    data: bytes


class Message(NamedTuple):
    """A decoded message frame, as a client sees it."""

    timestamp: int
    attempts: int
    id: bytes
    body: bytes


def decode_message(data: bytes) -> Message:
    if len(data) < MESSAGE_OVERHEAD:
        raise ValueError(f"message frame too short ({len(data)} bytes)")
    ts, attempts = MESSAGE_FIXED.unpack_from(data, 0)
    return Message(ts, attempts, data[10:26], data[26:])


class FrameReader:
    """Splits a byte stream from nsqd into frames (the client side of the protocol)."""

    __slots__ = ("_buf", "max_frame_size")

    def __init__(self, max_frame_size: int = 64 * 1024 * 1024) -> None:
        self._buf = bytearray()
        self.max_frame_size = max_frame_size

    def feed(self, data: bytes) -> None:
        self._buf += data

    def frames(self) -> list[Frame]:
        """Every complete frame buffered so far, in order."""
        buf = self._buf
        out: list[Frame] = []
        pos = 0
        end = len(buf)
        unpack = _FRAME_HEADER.unpack_from
        while end - pos >= 8:
            size, ftype = unpack(buf, pos)
            if size < 4 or size > self.max_frame_size:
                raise ValueError(f"invalid frame size {size}")
            if end - pos - 4 < size:
                break
            out.append(Frame(ftype, bytes(buf[pos + 8 : pos + 4 + size])))
            pos += 4 + size
        if pos:
            del buf[:pos]
        return out
