"""One segment of a retained log: a file of records, its offsets and its sparse index.

Theory of operation (``storage/topiclog.py`` has the log as a whole). A segment file
``<base offset, 20 digits>.log`` holds a run of ``protocol/log_record.py`` records with dense
offsets ``[base, next)``. Its index, in memory, maps offset and timestamp to file position, one
entry per ``INDEX_INTERVAL`` bytes; a closed segment's index is also written to
``<base>.index``. This file knows one segment: finding a record's position (``position``),
walking headers from a position (``walk``), loading and checking a saved index
(``load_index``), and rebuilding one by reading every record (``scan``: a torn tail is cut or
reported, zeros after the records are where a power loss ended the file). The log decides
which segment to write, roll, read, truncate and prune.

Checked before served. A segment scanned at open, or written by this process, has had every
record checked. One opened from its saved index has had only the records after the last entry
checked: the rest are checked once, an index block (entry to entry) at a time, before any
of them is walked or served (``check``: checksums, dense offsets from each entry to the next);
``storage/log_reader.py`` asks before each read. A block that fails (a bad record, or an index
entry that does not point at one) has the log scan the whole segment again, trusting nothing
of its index (``TopicLog.damaged``).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import re
import struct
from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from ..protocol import log_record
from ..protocol.log_record import FLAGS_AT, HEADER_SIZE, crc_holds, decode_records
from . import durable

__all__ = ["INDEX_INTERVAL", "LogRange", "Segment", "segment_bases", "zeros_from"]

_HEAD, _TAIL_FIXED = log_record.HEAD, log_record.TAIL_FIXED
_HEAD_TS = log_record.LENGTH_TIMESTAMP
_INDEX = struct.Struct(">qqq")  # offset, position, timestamp
INDEX_INTERVAL = 4096
_SEGMENT = re.compile(r"^(\d{20})\.log$")
_READ_CHUNK = 1 << 20


def segment_bases(directory: str) -> list[int]:
    """The base offsets of the segment files in ``directory``, in order."""
    return sorted(
        int(m.group(1)) for m in map(_SEGMENT.match, os.listdir(directory)) if m is not None
    )


@dataclass(frozen=True)
class LogRange:
    """Bytes ``[start, end)`` of ``path``: whole records, offsets ``first`` .. ``next - 1``."""

    path: str
    start: int
    end: int
    first: int
    next: int
    count: int


class Segment:
    """One segment file: its offsets ``[base, next)``, size, and sparse index."""

    __slots__ = (
        "base",
        "idx_off",
        "idx_pos",
        "idx_ts",
        "last_ts",
        "next",
        "path",
        "size",
        "unchecked",
    )

    def __init__(self, directory: str, base: int) -> None:
        self.base = base
        self.next = base
        self.size = 0
        self.last_ts = 0
        self.path = os.path.join(directory, f"{base:020d}.log")
        self.idx_off = array("q")
        self.idx_pos = array("q")
        self.idx_ts = array("q")  # the highest timestamp up to each entry (clocks step back)
        #: Per index entry, 1 while the records from it to the next entry have not been
        #: checked since the segment opened (``check``); None: every record has been.
        self.unchecked: bytearray | None = None

    @property
    def index_path(self) -> str:
        return self.path[:-4] + ".index"

    def add_index(self, offset: int, position: int, ts: int) -> None:
        if self.unchecked is not None:
            self.unchecked.append(0)  # written here, or checked before the entry is added
        if self.idx_ts and ts < self.idx_ts[-1]:
            ts = self.idx_ts[-1]
        self.idx_off.append(offset)
        self.idx_pos.append(position)
        self.idx_ts.append(ts)

    def encode_index(self) -> bytes:
        return b"".join(
            _INDEX.pack(o, p, t)
            for o, p, t in zip(self.idx_off, self.idx_pos, self.idx_ts, strict=True)
        )

    def entry_before(self, offset: int) -> int:
        """The file position of the index entry at or before ``offset`` (where a walk to it
        starts)."""
        i = bisect.bisect_right(self.idx_off, offset) - 1
        return self.idx_pos[i] if i >= 0 else 0

    def position(self, offset: int) -> tuple[int, int]:
        """File position and offset of the first record at or after ``offset``."""
        for rec_offset, _, rec_pos, _ in self.walk(self.entry_before(offset), self.size):
            if rec_offset >= offset:
                return rec_pos, rec_offset
        return self.size, self.next

    def walk(self, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
        """(offset, timestamp, position, end position) of each record from ``pos``; the file
        is read in chunks, headers only are decoded."""
        with open(self.path, "rb", buffering=0) as f:
            buf = b""
            base = pos
            while pos < end:
                rel = pos - base
                if len(buf) - rel < HEADER_SIZE:
                    f.seek(pos)
                    buf = f.read(min(_READ_CHUNK, end - pos))
                    base, rel = pos, 0
                    if len(buf) < HEADER_SIZE:
                        return
                offset = _HEAD.unpack_from(buf, rel)[0]
                length, ts = _HEAD_TS.unpack_from(buf, rel + 12)
                stop = pos + 16 + length
                yield offset, ts, pos, stop
                pos = stop

    def load_index(self) -> bool:
        """A closed segment's saved index, if it checks out (then its tail is scanned)."""
        try:
            with open(self.index_path, "rb") as f:
                data = f.read()
            self.size = os.path.getsize(self.path)
        except OSError:
            return False
        if not data or len(data) % _INDEX.size:
            return False
        prev_off = prev_pos = -1
        for o, p, t in _INDEX.iter_unpack(data):
            if o <= prev_off or p <= prev_pos or p >= self.size:
                return False
            self.add_index(o, p, t)
            prev_off, prev_pos = o, p
        if self.idx_off[0] != self.base or self.idx_pos[0] != 0:
            return False
        # The records after the last entry must reach the end of the file cleanly.
        pos, offset, last_ts = self.idx_pos[-1], self.idx_off[-1], self.idx_ts[-1]
        with open(self.path, "rb") as f:
            f.seek(pos)
            data = f.read()
        try:
            for rec in decode_records(data):
                if rec.offset != offset:
                    return False
                offset += 1
                last_ts = max(last_ts, rec.timestamp)
        except ValueError:
            return False
        self.next = offset
        self.last_ts = last_ts
        # Only the records after the last entry were read: the rest, when first served.
        self.unchecked = bytearray(b"\x01") * (len(self.idx_off) - 1) + b"\x00"
        return True

    def check(self, start: int, end: int) -> log_record.Damaged | None:
        """Check the records of the index blocks overlapping bytes ``[start, end)`` not yet
        checked since the segment opened: each record's checksum, and offsets dense from the
        block's entry to the next one's. None when they are whole (never read again); else
        the first bad record: its position and the offset it should have had."""
        unchecked = self.unchecked
        if unchecked is None or start >= self.size:
            return None
        first = max(bisect.bisect_right(self.idx_pos, start) - 1, 0)
        stop = bisect.bisect_left(self.idx_pos, max(min(end, self.size), start + 1))
        b = first
        while b < stop:
            if not unchecked[b]:
                b += 1
                continue
            e = b + 1
            while e < stop and unchecked[e]:
                e += 1
            lo = self.idx_pos[b]
            if e < len(self.idx_pos):
                hi, upto = self.idx_pos[e], self.idx_off[e]
            else:
                hi, upto = self.size, self.next
            damaged = self._check_records(lo, hi, self.idx_off[b], upto)
            if damaged is not None:
                return damaged
            unchecked[b:e] = bytes(e - b)
            b = e
        if not unchecked.count(1):
            self.unchecked = None
        return None

    def _check_records(self, lo: int, hi: int, offset: int, upto: int) -> log_record.Damaged | None:
        """Bytes ``[lo, hi)`` must be whole records at offsets ``offset`` .. ``upto - 1``."""
        with open(self.path, "rb", buffering=0) as f:
            f.seek(lo)
            data = f.read(hi - lo)
        pos, end = 0, len(data)
        check = log_record.check_record
        while pos < end:
            checked = check(data, pos)
            if isinstance(checked, log_record.Damaged):
                return log_record.Damaged(lo + pos, offset, checked.reason)
            if checked[0] != offset:
                return log_record.Damaged(lo + pos, offset, f"offset {checked[0]} out of order")
            offset += 1
            pos = checked[1]
        if offset != upto or end != hi - lo:
            return log_record.Damaged(lo + pos, offset, "records missing before the next entry")
        return None

    def scan(self, *, truncate: bool, log: logging.Logger, name: str) -> None:
        """Rebuild a segment's index by reading every record; cut a torn tail."""
        self.idx_off, self.idx_pos, self.idx_ts = array("q"), array("q"), array("q")
        self.unchecked = None
        self.next, self.size, self.last_ts = self.base, 0, 0
        size = os.path.getsize(self.path)
        pos = 0
        next_index = 0
        problem = ""
        with open(self.path, "rb") as f:
            while pos < size:
                head = f.read(HEADER_SIZE)
                if len(head) < HEADER_SIZE:
                    problem = "a short record header"
                    break
                offset, crc = _HEAD.unpack_from(head)
                length, ts = _HEAD_TS.unpack_from(head, 12)
                if offset != self.next or length < _TAIL_FIXED or pos + 16 + length > size:
                    problem = "a bad record header"
                    break
                body = f.read(length - _TAIL_FIXED)
                if not crc_holds(crc, offset, head[FLAGS_AT], head[12:] + body):
                    problem = "a checksum mismatch"
                    break
                if pos >= next_index:
                    self.add_index(offset, pos, ts)
                    next_index = pos + INDEX_INTERVAL
                pos += 16 + length
                self.next = offset + 1
                self.last_ts = max(self.last_ts, ts)
        self.size = pos
        if problem and zeros_from(self.path, pos):
            # Zeros after the records (what a power loss leaves where unsynced bytes were, on
            # XFS and others): where they end, not damage.
            with open(self.path, "r+b") as f:
                f.truncate(pos)
                durable.fsync(f.fileno())
            problem = ""
        if not problem:
            if not truncate:
                log.info("TOPICLOG(%s): rebuilt the index of segment %d", name, self.base)
            return
        lost = size - pos
        if truncate:
            log.warning(
                "TOPICLOG(%s): segment %d: %s at byte %d; dropped the torn tail (%d bytes) "
                "after offset %d",
                name,
                self.base,
                problem,
                pos,
                lost,
                self.next - 1,
            )
            with open(self.path, "r+b") as f:
                f.truncate(pos)
                durable.fsync(f.fileno())
        else:
            log.error(
                "TOPICLOG(%s): segment %d: %s at byte %d; serving the %d records before it, "
                "%d bytes after it are unreadable",
                name,
                self.base,
                problem,
                pos,
                self.next - self.base,
                lost,
            )
        with contextlib.suppress(OSError):
            os.unlink(self.index_path)


def zeros_from(path: str, pos: int) -> bool:
    """Whether every byte of the file from ``pos`` on is zero."""
    with open(path, "rb") as f:
        f.seek(pos)
        while chunk := f.read(_READ_CHUNK):
            if chunk.count(0) != len(chunk):
                return False
    return True
