"""The message as nsqd keeps it: one object per channel copy, sharing the body bytes."""

from __future__ import annotations

import struct
from itertools import repeat
from typing import Any, Protocol, cast

from ..protocol.commands import Strided
from ..protocol.headers import Blocks, WireForm

#: ``[int64 timestamp ns][uint16 attempts][16-byte id]``, then the body: the wire and disk layout.
_ENCODED_HEADER = struct.Struct(">qH")
#: pynsqd: a stored message with headers (``protocol/headers.py``) has the timestamp's sign bit
#: set (a real one never has: nanoseconds since 1970) and its body starts with
#: ``[uint16 block length][block]``. Every other message is nsqd's encoding exactly.
WITH_HEADERS = 1 << 63
_BLOCK_LEN = struct.Struct(">H")
#: ``[timestamp][attempts][id][block length]``: what precedes a block in one pack.
_ENCODED_WITH_BLOCK = struct.Struct(">qH16sH")
ENCODED_OVERHEAD = 26
MAX_ATTEMPTS = 0xFFFF
#: The furthest a deferral may reach (ten years): a due time stored past it is corruption, and
#: now + this still fits the int64 nanoseconds of the deferred side file for centuries.
MAX_DEFER_NS = 10 * 365 * 86400 * 1_000_000_000


class ConsumerCounts:
    """A consumer's counters, moved only by what happened to its messages (nsqd's clientV2
    ``SendingMessage``, ``FinishedMessage``, ``RequeuedMessage``, ``TimedOutMessage``,
    ``Empty``): the channel calls these, the connection's ``send_messages`` counts a send."""

    def __init__(self) -> None:
        self.in_flight_count = 0
        self.message_count = 0
        self.finish_count = 0
        self.requeue_count = 0

    def sending(self, n: int) -> None:
        self.in_flight_count += n
        self.message_count += n

    def finished(self, n: int) -> None:
        self.in_flight_count -= n
        self.finish_count += n

    def requeued(self) -> None:
        self.in_flight_count -= 1
        self.requeue_count += 1

    def released(self, n: int) -> None:
        """``n`` in-flight messages left it without a FIN or REQ: timed out, or taken back
        when it left the channel."""
        self.in_flight_count -= n

    def emptied(self) -> None:
        """The channel was emptied: nothing of it is in flight any more."""
        self.in_flight_count = 0


class ConsumerLike(Protocol):
    """What a channel needs of a subscribed client connection."""

    id: int
    rdy: int
    #: Another worker of this node (``--workers``): lent messages are never lent on to it.
    is_link: bool
    msg_timeout: float
    sample_rate: int
    write_paused: bool

    in_flight_count: int

    def send_messages(self, msgs: list[Message]) -> None:
        """Hand ``msgs`` to the consumer (its ``in_flight_count`` grows by them)."""

    def finished(self, n: int) -> None: ...
    def requeued(self) -> None: ...
    def released(self, n: int) -> None: ...
    def emptied(self) -> None: ...
    def output_room(self) -> int:
        """Body bytes the consumer may still be handed before its connection is back-pressured
        (0 or less: none now; the connection schedules a pump when room frees up)."""

    def close_for_exit(self) -> None: ...


class Message:
    """One message in one queue (topic or channel).

    A channel's copy is in exactly one of these places at a time: a memory or backend queue,
    in flight to a client (``client`` set, ``tq_seq`` set), or deferred (``client`` None,
    ``tq_seq`` set). ``tq_seq`` is the token of its live entry in the channel's timed queue;
    0 means no live entry.
    """

    __slots__ = (
        "attempts",
        "body",
        "client",
        "defer_until_ns",
        "delivery_ts",
        "headers",
        "id",
        "size",
        "timestamp",
        "tq_seq",
    )

    def __init__(
        self, msg_id: bytes, body: bytes, timestamp: int, attempts: int = 0, headers: bytes = b""
    ) -> None:
        self.id = msg_id
        self.body = body
        #: The body's length (nsqd's message bytes), kept: a message in its wire form cuts
        #: its body on each read of ``body``.
        self.size = len(body)
        self.timestamp = timestamp
        self.attempts = attempts
        #: Its header block (``protocol/headers.py``); empty: none (nsqd's message).
        self.headers = headers
        self.client: ConsumerLike | None = None
        self.delivery_ts = 0.0
        self.tq_seq = 0
        #: Wall-clock due time (ns) of a deferred message not yet in a channel's timed queue.
        self.defer_until_ns = 0

    @classmethod
    def many(
        cls,
        ids: list[bytes],
        bodies: list[bytes],
        timestamp: int,
        headers: Blocks = None,
    ) -> list[Message]:
        """Fresh messages for one publish, as ``Message(id, body, timestamp)`` makes them
        (``headers``: each one's block; a ``WireForm``: the bodies are as a negotiated client
        sent them, kept so by ``WireMessage``).

        Made by ``object.__new__`` from C and filled here in one loop: a fifth cheaper than
        calling the class per message, whose ``__init__`` is a call from C into Python each
        time. Every slot is set, as in ``__init__`` (a test holds the two equal).
        """
        if isinstance(headers, WireForm):
            return WireMessage.from_wires(ids, bodies, timestamp, headers.size)
        msgs: list[Message] = list(map(_new, repeat(cls, len(ids))))
        for m, msg_id, body in zip(msgs, ids, bodies, strict=True):
            m.id = msg_id
            m.body = body
            m.size = len(body)
            m.timestamp = timestamp
            m.attempts = 0
            m.client = None
            m.delivery_ts = 0.0
            m.tq_seq = 0
            m.defer_until_ns = 0
            m.headers = b""
        if headers is not None:  # a negotiated publisher's blocks (plain publishes pay nothing)
            for m, block in zip(msgs, headers, strict=True):
                m.headers = block
        return msgs

    def copy(self) -> Message:
        """A fresh copy for another channel: same id, body and timestamp; no channel state."""
        m = Message(self.id, self.body, self.timestamp, self.attempts, self.headers)
        m.defer_until_ns = self.defer_until_ns
        return m

    def encode(self) -> bytes:
        """nsqd's encoding (``WriteTo``), as stored in the disk queue (with headers: see
        ``WITH_HEADERS``)."""
        if self.headers:
            return self.encode_head() + self.body
        return _ENCODED_HEADER.pack(self.timestamp, self.attempts) + self.id + self.body

    def encode_head(self) -> bytes:
        """What precedes the body in :meth:`encode` (to write a large body without copying)."""
        block = self.headers
        if block:
            return (
                _ENCODED_WITH_BLOCK.pack(
                    self.timestamp - WITH_HEADERS, self.attempts, self.id, len(block)
                )
                + block
            )
        return _ENCODED_HEADER.pack(self.timestamp, self.attempts) + self.id

    def with_block(self) -> bytes:
        """``[uint16 block length][block][body]``: the body as a negotiated client sends and
        receives it (``protocol/headers.py``), and as the disk queue and the retained log
        store a message with headers after their fixed part."""
        block = self.headers
        return _BLOCK_LEN.pack(len(block)) + block + self.body

    def __repr__(self) -> str:
        return f"Message(id={self.id!r}, attempts={self.attempts}, len={len(self.body)})"

    def __eq__(self, other: Any) -> bool:  # for tests: compare what travels on the wire
        return (
            isinstance(other, Message)
            and self.id == other.id
            and self.body == other.body
            and self.timestamp == other.timestamp
            and self.attempts == other.attempts
            and self.headers == other.headers
        )

    __hash__ = None  # type: ignore[assignment]

    #: ``[uint16 block length][block][body]`` where the message keeps that (``WireMessage``,
    #: whose slot this is); None: kept as ``body`` and ``headers`` (a class attribute: a
    #: plain message pays nothing for it).
    wire: bytes | None = None
    #: ``len(wire)`` (``WireMessage``'s slot); 0 where ``wire`` is None.
    wire_size: int = 0


class WireMessage(Message):
    """A message with headers kept as its negotiated publisher sent it (issue 55: what
    headers cost a publish): ``wire`` is ``[uint16 block length][block][body]``, the block not
    empty. That is also how the disk queue stores a message with headers after its fixed
    part, how the retained log stores it after its record's tail and how a negotiated
    consumer receives it, so a publish makes no slice per message and those writes no join;
    ``body`` and ``headers`` are cut from ``wire`` when read (a consumer that did not ask for
    headers, the byte counts, the dedup comparison). Made only by :meth:`from_wires` from
    blocks found valid (``headers.split_bodies``); a copy stays one."""

    __slots__ = ("wire", "wire_size")
    wire: bytes
    #: ``len(wire)``, kept: a negotiated consumer's frame start is looked up by it.
    wire_size: int

    @classmethod
    def from_wires(
        cls, ids: list[bytes], wires: list[bytes], timestamp: int, block_size: int = -1
    ) -> list[Message]:
        """As ``Message.many`` makes messages, each from its wire form (the same one loop
        over every slot: sharing it would cost the plain publish a second pass);
        ``block_size``: every one's block size where known (a ``WireForm``'s)."""
        msgs: list[WireMessage] = list(map(_new, repeat(cls, len(ids))))
        # The parser's bodies (``Strided``) are all one length: one length and one size for
        # all, set in the loop; any others get their own after it.
        strided = type(wires) is Strided and block_size >= 0
        n = len(wires[0]) if strided and wires else 0
        size = n - 2 - block_size
        for m, msg_id, wire in zip(msgs, ids, wires, strict=True):
            m.id = msg_id
            m.wire = wire
            m.wire_size = n
            m.size = size
            m.timestamp = timestamp
            m.attempts = 0
            m.client = None
            m.delivery_ts = 0.0
            m.tq_seq = 0
            m.defer_until_ns = 0
        if not strided:
            for m in msgs:
                w = m.wire
                m.wire_size = len(w)
                m.size = len(w) - 2 - (block_size if block_size >= 0 else w[0] << 8 | w[1])
        return cast(list[Message], msgs)

    @property
    def body(self) -> bytes:
        w = self.wire
        return w[2 + (w[0] << 8 | w[1]) :]

    @body.setter
    def body(self, body: bytes) -> None:
        w = self.wire
        self.wire = w = w[: 2 + (w[0] << 8 | w[1])] + body
        self.wire_size = len(w)
        self.size = len(body)

    @property
    def headers(self) -> bytes:
        w = self.wire
        return w[2 : 2 + (w[0] << 8 | w[1])]

    @headers.setter
    def headers(self, block: bytes) -> None:
        self.wire = w = _BLOCK_LEN.pack(len(block)) + block + self.body
        self.wire_size = len(w)

    def copy(self) -> Message:
        m = WireMessage.from_wires([self.id], [self.wire], self.timestamp)[0]
        m.attempts = self.attempts
        m.defer_until_ns = self.defer_until_ns
        return m

    def encode(self) -> bytes:
        return (
            _ENCODED_HEADER.pack(self.timestamp - WITH_HEADERS, self.attempts) + self.id + self.wire
        )

    def encode_head(self) -> bytes:
        w = self.wire
        return (
            _ENCODED_HEADER.pack(self.timestamp - WITH_HEADERS, self.attempts)
            + self.id
            + w[: 2 + (w[0] << 8 | w[1])]
        )

    def with_block(self) -> bytes:
        return self.wire


#: ``[int32 record size]`` and a record's fixed part: how go-diskqueue frames each record.
_FRAMED_HEAD = struct.Struct(">iqH16s")


def disk_frames(msgs: list[Message]) -> tuple[list[bytes], list[int]]:
    """``msgs`` as the disk queue stores them, two pieces each: the record's size and fixed
    part (``[int32 size][timestamp][attempts][id]``), then its body (with its header block
    where it has one: ``with_block``); and each record's size. Joined, the pieces are the
    records ``encode`` gives, each after its size: one copy of each body (the join), where
    building each record first and then the batch is two."""
    pack = _FRAMED_HEAD.pack
    pieces: list[bytes] = []
    sizes: list[int] = []
    add = pieces.append
    add_size = sizes.append
    for m in msgs:
        tail = m.wire
        if tail is not None:
            stamp = m.timestamp - WITH_HEADERS
        elif m.headers:
            tail = m.with_block()
            stamp = m.timestamp - WITH_HEADERS
        else:
            tail = m.body
            stamp = m.timestamp
        size = 26 + len(tail)
        add(pack(size, stamp, m.attempts, m.id))
        add(tail)
        add_size(size)
    return pieces, sizes


def decode_message(data: bytes) -> Message:
    """The inverse of ``Message.encode``; raises ValueError on a record too short to hold one."""
    if len(data) < ENCODED_OVERHEAD:
        raise ValueError(f"invalid message buffer size ({len(data)})")
    ts, attempts = _unpack_header(data)
    if ts >= 0:
        return Message(data[10:26], data[26:], ts, attempts)
    if len(data) < ENCODED_OVERHEAD + 2:
        raise ValueError(f"invalid message buffer size ({len(data)}) for its headers")
    (size,) = _BLOCK_LEN.unpack_from(data, 26)
    if 28 + size > len(data):
        raise ValueError(f"a header block of {size} bytes in a record of {len(data)}")
    block = data[28 : 28 + size]
    return Message(data[10:26], data[28 + size :], ts + WITH_HEADERS, attempts, block)


_unpack_header = _ENCODED_HEADER.unpack_from
_new = object.__new__
