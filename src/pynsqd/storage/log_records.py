"""The records a log appends, made and checked without I/O (``storage/topiclog.py`` writes them).

Theory of operation. An append is decided here and carried out by ``TopicLog``: ``encode`` turns
a batch of messages (one PUB, MPUB, DPUB or HTTP publish) into the bytes of its records, the
index entries they bring (one per ``INDEX_INTERVAL`` bytes of the segment) and where the
segment ends after them; ``check`` walks a replica's bytes as its leader's log holds them
(checksums, dense offsets from the log's end, identified runs for idempotent publishing) and
says the same, or raises ``ValueError`` naming the first bad record. Neither touches a file:
the log writes ``data`` with one ``pwrite`` and takes the rest in only once it is written.
The layout is ``protocol/log_record.py``'s.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any, NamedTuple

from ..core.message import Message
from ..protocol import log_record
from ..protocol.log_record import (
    CRC_OFFSET,
    FLAGS_AT,
    HEADER_SIZE,
    HEADERS,
    IDENTIFIED,
    IDENTIFIED_NEXT,
    body_start,
    crc_holds,
    crc_seed,
)
from .segment import INDEX_INTERVAL

__all__ = ["Checked", "Encoded", "check", "encode"]

_HEAD, _TAIL, _TAIL_FIXED = log_record.HEAD, log_record.TAIL, log_record.TAIL_FIXED
_HEAD_TS = log_record.LENGTH_TIMESTAMP
_IDENTIFIED_ANY = (IDENTIFIED | IDENTIFIED_NEXT) >> 8
_MASK = 0xFFFFFFFF

#: An identified publish's place in the log: (producer, its next sequence, the next offset),
#: the producer's next record if it is IDENTIFIED_NEXT (``storage/producers.py``).
Follow = tuple[bytes, int, int]


class Encoded(NamedTuple):
    """A batch as records: the bytes, its index entries (offset, file position, timestamp),
    the next offset and the segment's size after it, and the newest timestamp."""

    data: bytes
    entries: list[tuple[int, int, int]]
    next: int
    size: int
    last_ts: int


def next_index(idx_pos: Sequence[int]) -> int:
    """The file position from which a record gets the segment's next index entry."""
    return idx_pos[-1] + INDEX_INTERVAL if idx_pos else 0


def encode(
    msgs: list[Message],
    identity: tuple[bytes, int] | None,
    offset: int,
    pos: int,
    index_from: int,
) -> Encoded:
    """``msgs`` as records from ``offset``, written at file position ``pos`` of a segment
    whose next index entry is due at ``index_from``. ``identity``: an idempotent publish's
    producer and the sequence number of its first message (``core/dedup.py``)."""
    parts: list[bytes] = []
    head, tail, crc32 = _HEAD.pack, _TAIL.pack, zlib.crc32
    ts = 0
    entries: list[tuple[int, int, int]] = []
    records = iter(msgs)
    flags = CRC_OFFSET  # every record's checksum covers its offset (``log_record.crc_seed``)
    fold = offset + len(msgs) > _MASK
    if identity is not None:
        # An idempotent publish: its first record carries the identity after its fixed
        # part (``log_record.identified_tail``); the others are IDENTIFIED_NEXT, with none.
        producer, seq = identity
        m = next(records)
        first_flags = IDENTIFIED | CRC_OFFSET
        if m.headers:  # ``log_record.HEADERS``: the block before the body
            body = m.with_block()
            first_flags |= HEADERS
        else:
            body = m.body
        ts = m.timestamp
        defer = (m.defer_until_ns - ts) // 1_000_000 if m.defer_until_ns else 0
        plen = len(producer)
        t = log_record.identified_tail(plen).pack(
            _TAIL_FIXED + 9 + plen + len(body),
            ts,
            m.id,
            first_flags,
            defer,
            plen,
            producer,
            seq,
        )
        if pos >= index_from:
            entries.append((offset, pos, ts))
            index_from = pos + INDEX_INTERVAL
        parts += (head(offset, crc32(body, crc32(t, crc_seed(offset)))), t, body)
        pos += 12 + len(t) + len(body)
        offset += 1
        flags = IDENTIFIED_NEXT | CRC_OFFSET
    for m in records:
        ts = m.timestamp
        defer = (m.defer_until_ns - ts) // 1_000_000 if m.defer_until_ns else 0
        if m.headers:  # ``log_record.HEADERS``: the block before the body
            body = m.with_block()
            t = tail(_TAIL_FIXED + len(body), ts, m.id, flags | HEADERS, defer)
        else:
            body = m.body
            t = tail(_TAIL_FIXED + len(body), ts, m.id, flags, defer)
        if pos >= index_from:
            entries.append((offset, pos, ts))
            index_from = pos + INDEX_INTERVAL
        # ``log_record.crc_seed``: the offset itself below 2**32 (a log's first 4G records)
        parts.append(head(offset, crc32(body, crc32(t, crc_seed(offset) if fold else offset))))
        parts.append(t)
        parts.append(body)
        pos += HEADER_SIZE + len(body)
        offset += 1
    return Encoded(b"".join(parts), entries, offset, pos, ts)


class Checked(NamedTuple):
    """A replica's records as checked: how many (``records``), their index entries, the
    newest timestamp, the runs of identified records ([producer, first sequence, count, first
    offset, timestamp]) with where the last producer goes on (``follow``), and whether any
    record was identified at all (``identified``: counted when the log keeps no index yet)."""

    records: int
    entries: list[tuple[int, int, int]]
    last_ts: int
    runs: list[list[Any]]
    follow: Follow | None
    identified: bool


def check(
    data: bytes | memoryview,
    expect: int,
    base: int,
    index_from: int,
    indexed: bool,
    follow: Follow | None,
) -> Checked:
    """Walk ``data``, whole records that must start at offset ``expect`` and be dense, to be
    written at file position ``base``; ``indexed``: the log keeps an index of identities
    (then ``runs`` and ``follow`` are found). Raises ``ValueError`` naming the first bad
    record (nothing may then be written)."""
    end = len(data)
    first = expect
    entries: list[tuple[int, int, int]] = []
    unpack_head, unpack_lts, crc32 = _HEAD.unpack_from, _HEAD_TS.unpack_from, zlib.crc32
    view = memoryview(data)
    pos = ts = 0
    identified = False
    runs: list[list[Any]] = []
    while pos < end:
        if end - pos < HEADER_SIZE:
            raise ValueError(str(log_record.Damaged(pos, None, "a short record header")))
        offset, crc = unpack_head(data, pos)
        length, ts = unpack_lts(data, pos + 12)
        stop = pos + 16 + length
        if length < _TAIL_FIXED or stop > end:
            raise ValueError(str(log_record.Damaged(pos, offset, "a bad record length")))
        checked = view[pos + 12 : stop]
        if (offset >> 32 or crc32(checked, offset) != crc) and not crc_holds(
            crc, offset, data[pos + FLAGS_AT], checked
        ):
            raise ValueError(str(log_record.Damaged(pos, offset, "a checksum mismatch")))
        if offset != expect:
            raise ValueError(f"record offset {offset} where {expect} was expected")
        if not indexed:
            if not identified and data[pos + FLAGS_AT] & _IDENTIFIED_ANY:
                identified = True  # a copy of identified publishes: the index is kept
        else:
            flags = data[pos + FLAGS_AT]
            if flags & (IDENTIFIED >> 8):
                start, producer, seq = body_start(data, pos, IDENTIFIED)
                if start > stop:
                    raise ValueError(f"record offset {offset}: a bad record identity")
                runs.append([producer, seq, 1, offset, ts])
                follow = (producer, seq + 1, offset + 1)
            elif flags & (IDENTIFIED_NEXT >> 8) and follow is not None and follow[2] == offset:
                if runs and runs[-1][3] + runs[-1][2] == offset:
                    runs[-1][2] += 1
                    runs[-1][4] = ts
                else:
                    runs.append([follow[0], follow[1], 1, offset, ts])
                follow = (follow[0], follow[1] + 1, offset + 1)
            else:
                follow = None
        if base + pos >= index_from:
            entries.append((offset, base + pos, ts))
            index_from = base + pos + INDEX_INTERVAL
        expect += 1
        pos = stop
    return Checked(expect - first, entries, ts, runs, follow, identified)
