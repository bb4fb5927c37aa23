"""A replayable topic's log record: one layout on disk and on the wire of ``GET /topic/log``.

This is the one place the layout is declared; the log (``storage/topiclog.py``), the HTTP
endpoint (a byte-range copy of the files), the client (``client/cluster.py: read_log``) and
the Spark connector all go through it. Sans-IO: bytes in, records or errors (as values) out.

Layout (big-endian)::

    int64  offset
    uint32 crc32 of every byte after this field (length .. body)
    uint32 length: bytes after this field (30 + body size)
    int64  timestamp (publish time, ns since the epoch)
    16     message ID (nsqd's hex ID)
    uint16 attempts (0: as published)
    uint32 deferral in ms (DPUB), else 0
    ...    body
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = [
    "CRC_START",
    "HEAD",
    "HEADER_SIZE",
    "LENGTH_TIMESTAMP",
    "TAIL",
    "TAIL_FIXED",
    "Damaged",
    "LogRecord",
    "check_record",
    "decode_records",
    "encode_record",
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


@dataclass(frozen=True, slots=True)
class LogRecord:
    offset: int
    timestamp: int
    id: bytes
    attempts: int
    defer_ms: int
    body: bytes


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
    offset: int, timestamp: int, msg_id: bytes, attempts: int, defer_ms: int, body: bytes
) -> tuple[bytes, bytes]:
    """The record as (header, body): written together, the body is not copied here."""
    tail = TAIL.pack(TAIL_FIXED + len(body), timestamp, msg_id, attempts, defer_ms)
    return HEAD.pack(offset, zlib.crc32(body, zlib.crc32(tail))) + tail, body


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
    if zlib.crc32(data[pos + CRC_START : stop]) != crc:
        return Damaged(pos, offset, "a checksum mismatch")
    return offset, stop


def scan_records(
    data: bytes | memoryview, *, verify: bool = True
) -> tuple[list[LogRecord], Damaged | None]:
    """Every whole record from the start of ``data``, up to the first damaged one (returned
    beside them, None if there was none)."""
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
        body = bytes(data[pos + HEADER_SIZE : stop])
        out.append(LogRecord(offset, ts, bytes(msg_id), attempts, defer_ms, body))
        pos = stop
    return out, None


def decode_records(data: bytes | memoryview, *, verify: bool = True) -> Iterator[LogRecord]:
    """The records in ``data`` (whole records, as ``/topic/log`` sends them). Raises
    ``ValueError`` naming the first short or corrupt one."""
    records, damaged = scan_records(data, verify=verify)
    yield from records
    if damaged is not None:
        raise ValueError(str(damaged))
