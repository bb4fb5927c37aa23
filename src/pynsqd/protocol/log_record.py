"""A replayable topic's log record: one layout on disk and on the wire of ``GET /topic/log``.

This is the one place the layout is declared; the log (``storage/topiclog.py``), the HTTP
endpoint (a byte-range copy of the files), the client (``client/cluster.py: read_log``) and
the Spark connector all go through it. Sans-IO: bytes in, records or errors (as values) out.

Layout (big-endian)::

    int64  offset
    uint32 crc32 of every byte after this field (length .. body), started from the offset
           (``crc_seed``) when the record has CRC_OFFSET: a flipped offset fails it too
    uint32 length: bytes after this field (30 + body size)
    int64  timestamp (publish time, ns since the epoch)
    16     message ID (nsqd's hex ID)
    uint16 flags: IDENTIFIED (0x8000): an idempotent publish's identity follows;
           IDENTIFIED_NEXT (0x4000): the next message of the same publish (below);
           CRC_OFFSET (0x2000): the checksum covers the offset (every record written
           since 2026-11; a log written before has records without it, checked as written);
           HEADERS (0x1000): the body starts with the message's header block
           (``[uint16 length][block]``, ``protocol/headers.py``)
    uint32 deferral in ms (DPUB), else 0
    -- only with IDENTIFIED (``core/dedup.py``):
    uint8  producer id length (1..128)
    ...    producer id (ASCII)
    int64  sequence number
    ...    body

An idempotent MPUB's first record carries the identity (IDENTIFIED); each of its other
records is IDENTIFIED_NEXT and carries none: its producer is the previous record's and its
sequence number one more (they are written together, at consecutive offsets). Reading from
the middle of such a run, its first records' identity is not known (``producer`` b"",
``sequence`` -1) unless the caller passes ``follow`` (``follow_after`` of the record before).
(The identity in every record cost each one its bytes, their CRC and their packing: about 15%
of a 200-byte message's publish; ``docs/exactly-once.md``.)
"""

from __future__ import annotations

import functools
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "CRC_OFFSET",
    "CRC_START",
    "FLAG_BITS",
    "HEAD",
    "HEADERS",
    "HEADER_SIZE",
    "IDENTIFIED",
    "IDENTIFIED_NEXT",
    "LENGTH_TIMESTAMP",
    "SEQUENCE",
    "TAIL",
    "TAIL_FIXED",
    "Damaged",
    "LogRecord",
    "body_start",
    "check_record",
    "crc_holds",
    "crc_seed",
    "decode_records",
    "encode_record",
    "follow_after",
    "identified_tail",
    "identity_ext",
    "record_crc",
    "scan_records",
]

HEAD = struct.Struct(">qI")  # offset, crc
TAIL = struct.Struct(">Iq16sHI")  # length, timestamp, id, attempts, defer_ms
#: The fixed part of a record: 46 bytes before the body.
HEADER_SIZE = HEAD.size + TAIL.size
#: Bytes after the length field, before the body: 34 (a record's length is this + body).
TAIL_FIXED = TAIL.size - 4
#: Where the checksummed part starts (the length field).
CRC_START = HEAD.size
_LENGTH = struct.Struct(">I")
#: A record's length and timestamp, read at ``CRC_START`` (walking headers without bodies).
LENGTH_TIMESTAMP = struct.Struct(">Iq")
#: The flags bit of a record that carries its publisher's identity (producer, sequence).
IDENTIFIED = 0x8000
#: The flags bit of the next record of the same identified publish (no identity bytes).
IDENTIFIED_NEXT = 0x4000
#: The flags bit of a record whose checksum covers its offset too (``crc_seed``).
CRC_OFFSET = 0x2000
#: The flags bit of a record whose message has headers: its body starts with their block.
HEADERS = 0x1000
#: Every flags bit of the record layout (the rest of the field is the message's attempts: 0).
FLAG_BITS = IDENTIFIED | IDENTIFIED_NEXT | CRC_OFFSET | HEADERS
_BLOCK_LEN = struct.Struct(">H")
#: (producer, sequence, offset) the next record continues, when it is IDENTIFIED_NEXT.
Follow = tuple[bytes, int, int]
#: Where the flags field is, from a record's start.
FLAGS_AT = HEAD.size + 4 + 8 + 16
SEQUENCE = struct.Struct(">q")


def crc_seed(offset: int) -> int:
    """The value a record's crc32 starts from: its offset folded to 32 bits. A crc32 started
    from two different values differs for any bytes, so a record whose offset was changed
    fails its check (one flipped bit of the offset flips one bit of the fold); it costs one
    integer operation per record, where checksumming the 8 bytes of the offset costs a call."""
    return (offset ^ (offset >> 32)) & 0xFFFFFFFF


def record_crc(offset: int, flags_byte: int, checked: bytes | memoryview) -> int:
    """The checksum of a record at ``offset`` whose flags field starts with ``flags_byte``
    and whose checksummed bytes (``CRC_START`` to its end) are ``checked``."""
    seed = crc_seed(offset) if flags_byte & (CRC_OFFSET >> 8) else 0
    return zlib.crc32(checked, seed)


def crc_holds(crc: int, offset: int, flags_byte: int, checked: bytes | memoryview) -> bool:
    """Whether ``crc`` is the checksum of the record (``record_crc``). The common case is
    tried first, without looking at the flags: a record with CRC_OFFSET below offset 2**32,
    whose seed is its offset (``offset >> 32`` is 0 only there: crc32 takes a seed's low 32
    bits). The loops of ``storage/`` write the same test inline."""
    if not offset >> 32 and zlib.crc32(checked, offset) == crc:
        return True
    return record_crc(offset, flags_byte, checked) == crc


@functools.lru_cache(maxsize=64)
def identified_tail(producer_length: int) -> struct.Struct:
    """An IDENTIFIED record's TAIL and identity packed in one call (the log's append): length,
    timestamp, id, flags, deferral, producer length, producer, sequence."""
    return struct.Struct(f"{TAIL.format}B{producer_length}s{SEQUENCE.format.lstrip('>')}")


def identity_ext(producer: bytes, sequence: int) -> bytes:
    """The bytes between an IDENTIFIED record's fixed part and its body."""
    return bytes((len(producer),)) + producer + SEQUENCE.pack(sequence)


def body_start(data: bytes | memoryview, pos: int, flags: int) -> tuple[int, bytes, int]:
    """Where the body of the record at ``pos`` starts, and its (producer, sequence): (b"", -1)
    for a record without an identity."""
    start = pos + HEADER_SIZE
    if not flags & IDENTIFIED:
        return start, b"", -1
    if start >= len(data) or start + 9 + data[start] > len(data):
        return len(data) + 1, b"", -1  # past the data: the caller calls the record damaged
    n = data[start]
    producer = bytes(data[start + 1 : start + 1 + n])
    (seq,) = SEQUENCE.unpack_from(data, start + 1 + n)
    return start + 9 + n, producer, seq


@dataclass(frozen=True, slots=True)
class LogRecord:
    offset: int
    timestamp: int
    id: bytes
    attempts: int
    defer_ms: int
    body: bytes
    #: An idempotent publish's identity (``core/dedup.py``); b"" and -1 without one.
    producer: bytes = b""
    sequence: int = -1
    #: The message's header block (``protocol/headers.py``); b"": none.
    headers: bytes = b""


def split_headers(body: bytes) -> tuple[bytes, bytes] | None:
    """A HEADERS record's body as (block, body); None when its block does not fit in it."""
    if len(body) < 2:
        return None
    (size,) = _BLOCK_LEN.unpack_from(body)
    if 2 + size > len(body):
        return None
    return body[2 : 2 + size], body[2 + size :]


@dataclass(frozen=True, slots=True)
class Damaged:
    """Where whole records stop: at byte ``position`` (of the record at ``offset``, when its
    header could be read), for ``reason``."""

    position: int
    offset: int | None
    reason: str

    def __str__(self) -> str:
        where = f"the record at offset {self.offset}" if self.offset is not None else "a record"
        return f"{self.reason} in {where} (byte {self.position})"


def encode_record(
    offset: int,
    timestamp: int,
    msg_id: bytes,
    attempts: int,
    defer_ms: int,
    body: bytes,
    identity: tuple[bytes, int] | None = None,
    headers: bytes = b"",
) -> tuple[bytes, bytes]:
    """The record as (header, body): written together, the body is not copied here (it is
    with ``headers``: the block goes before it)."""
    ext = b"" if identity is None else identity_ext(*identity)
    attempts |= CRC_OFFSET
    if headers:
        attempts |= HEADERS
        body = _BLOCK_LEN.pack(len(headers)) + headers + body
    if ext:
        attempts |= IDENTIFIED
    tail = TAIL.pack(TAIL_FIXED + len(ext) + len(body), timestamp, msg_id, attempts, defer_ms)
    tail += ext
    return HEAD.pack(offset, zlib.crc32(body, zlib.crc32(tail, crc_seed(offset)))) + tail, body


def check_record(data: bytes | memoryview, pos: int) -> tuple[int, int] | Damaged:
    """The record at ``pos`` of ``data``: (its offset, the position after it), checksum
    checked; or what is wrong with it."""
    end = len(data)
    if end - pos < HEADER_SIZE:
        return Damaged(pos, None, "a short record header")
    offset, crc = HEAD.unpack_from(data, pos)
    (length,) = _LENGTH.unpack_from(data, pos + CRC_START)
    stop = pos + CRC_START + 4 + length
    if length < TAIL_FIXED or stop > end:
        return Damaged(pos, offset, "a bad record length")
    if not crc_holds(crc, offset, data[pos + FLAGS_AT], data[pos + CRC_START : stop]):
        return Damaged(pos, offset, "a checksum mismatch")
    return offset, stop


def follow_after(record: LogRecord) -> Follow | None:
    """What an IDENTIFIED_NEXT record right after ``record`` continues (None: nothing)."""
    if record.sequence < 0:
        return None
    return record.producer, record.sequence + 1, record.offset + 1


def scan_records(
    data: bytes | memoryview, *, verify: bool = True, follow: Follow | None = None
) -> tuple[list[LogRecord], Damaged | None]:
    """Every whole record from the start of ``data``, up to the first damaged one (returned
    beside them, None if there was none). ``follow``: the identity the first record may
    continue (``follow_after`` of the record before ``data``)."""
    out: list[LogRecord] = []
    pos, end = 0, len(data)
    while pos < end:
        if verify:
            checked = check_record(data, pos)
            if isinstance(checked, Damaged):
                return out, checked
        elif end - pos < HEADER_SIZE:
            return out, Damaged(pos, None, "a short record header")
        offset = HEAD.unpack_from(data, pos)[0]
        length, ts, msg_id, attempts, defer_ms = TAIL.unpack_from(data, pos + CRC_START)
        stop = pos + CRC_START + 4 + length
        if not verify and (length < TAIL_FIXED or stop > end):
            return out, Damaged(pos, offset, "a bad record length")
        start, producer, seq = body_start(data, pos, attempts)
        if start > stop:
            return out, Damaged(pos, offset, "a bad record identity")
        if attempts & IDENTIFIED_NEXT and follow is not None and follow[2] == offset:
            producer, seq = follow[0], follow[1]
        follow = (producer, seq + 1, offset + 1) if seq >= 0 else None
        body = bytes(data[start:stop])
        block = b""
        if attempts & HEADERS:
            split = split_headers(body)
            if split is None:
                return out, Damaged(pos, offset, "a bad header block")
            block, body = split
        flags_off = attempts & ~FLAG_BITS
        out.append(
            LogRecord(offset, ts, bytes(msg_id), flags_off, defer_ms, body, producer, seq, block)
        )
        pos = stop
    return out, None


def decode_records(
    data: bytes | memoryview, *, verify: bool = True, follow: Follow | None = None
) -> Iterator[LogRecord]:
    """The records in ``data`` (whole records, as ``/topic/log`` sends them). Raises
    ``ValueError`` naming the first short or corrupt one."""
    records, damaged = scan_records(data, verify=verify, follow=follow)
    yield from records
    if damaged is not None:
        raise ValueError(str(damaged))
