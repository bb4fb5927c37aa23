"""Reading a retained log (``storage/topiclog.py``): byte ranges of whole records, messages for
channels, offsets by time, and the identities idempotent publishing remembers.

Theory of operation. Reads never write and never move the log: they look at its segments
(``storage/segment.py``: each a file, its offsets and its sparse index) between ``earliest`` and
``latest`` (or ``visible``: a replicated partition's high watermark). A range is whole records
within one segment (``read_range``), found from the index and a walk of the headers, so ``GET
/topic/log`` and a follower's fetch are byte-range copies (``read_ranges``). Messages for
channels are decoded with their checksums checked: a damaged record is logged and skipped,
never delivered (``read_messages``). A gap after damaged records is skipped by every read.

A closed segment opened from its saved index is checked before any of its records is walked
or served, each index block once (``Segment.check``): a bad record found then is reported to
the log (``damaged``: the segment ends before it, the rest is a gap, a replicated
copy fetches it again), so a byte-range copy never serves a record that fails its checksum.
"""

from __future__ import annotations

import bisect
import logging
import zlib
from typing import Protocol

from ..core.dedup import Dedup
from ..core.message import Message
from ..protocol import log_record
from ..protocol.log_record import HEADER_SIZE, HEADERS, IDENTIFIED, Follow, body_start, crc_holds
from .segment import LogRange, Segment

_HEAD, _TAIL = log_record.HEAD, log_record.TAIL


class OffsetOutOfRange(Exception):
    def __init__(self, offset: int, earliest: int, latest: int) -> None:
        super().__init__(f"offset {offset} is outside [{earliest}, {latest}]")
        self.offset = offset
        self.earliest = earliest
        self.latest = latest


class Readable(Protocol):
    """What a read needs of its log (``TopicLog``)."""

    name: str
    log: logging.Logger

    @property
    def segments(self) -> list[Segment]: ...
    @property
    def earliest(self) -> int: ...
    @property
    def latest(self) -> int: ...
    @property
    def visible(self) -> int: ...

    holes: list[tuple[int, int]]


def _whole(tlog: Readable, seg: Segment, start: int, end: int) -> bool:
    """Whether ``seg``'s records in the index blocks overlapping ``[start, end)`` are whole
    (``Segment.check``); if not, the log is told and the segment now ends before the first
    bad one."""
    bad = seg.check(start, end)
    if bad is None:
        return True
    damaged(tlog, seg, bad)
    return False


def damaged(tlog: Readable, seg: Segment, at: log_record.Damaged) -> None:
    """A block of closed segment ``seg`` failed its check when first read
    (``Segment.check``): the segment is scanned again from its first record, trusting
    nothing of its index (a wrong index entry, not the records, may have failed). If the
    scan stops before the segment's end, it ends there now, and the offsets from there to
    the next segment are a gap every read skips (``holes``): never served. They count as
    lost (``lost``): a replicated copy is cut there and fetches them again from a good
    copy (``cluster/follower.py``), and a leader gives way to one first
    (``cluster/plan.py``)."""
    i = tlog.segments.index(seg)
    seg.scan(truncate=False, log=tlog.log, name=tlog.name)
    end = tlog.segments[i + 1].base if i + 1 < len(tlog.segments) else seg.next
    if seg.next < end:
        tlog.holes = sorted({*tlog.holes, (seg.next, end - 1)})
        tlog.log.error(
            "TOPICLOG(%s): segment %d failed its check when read (%s); offsets %d-%d are "
            "lost here and never served (a replicated copy fetches them again)",
            tlog.name,
            seg.base,
            at,
            seg.next,
            end - 1,
        )


def check_offset(tlog: Readable, offset: int) -> None:
    if not tlog.earliest <= offset <= tlog.latest:
        raise OffsetOutOfRange(offset, tlog.earliest, tlog.latest)


def offset_for_time(tlog: Readable, ts_ns: int) -> int:
    """The first offset published at or after ``ts_ns`` (``latest`` if none)."""
    for seg in tlog.segments:
        if seg.next == seg.base or seg.last_ts < ts_ns:
            continue
        i = max(bisect.bisect_left(seg.idx_ts, ts_ns) - 1, 0)
        if not seg.idx_pos:
            return seg.base
        if seg.unchecked is not None:
            _whole(tlog, seg, seg.idx_pos[i], seg.idx_pos[i] + 1)  # before its headers are read
            if i >= len(seg.idx_pos):
                continue  # cut before it: what follows is a gap
        for rec_offset, rec_ts, _, _ in seg.walk(seg.idx_pos[i], seg.size):
            if rec_ts >= ts_ns:
                return rec_offset
    return tlog.latest


def read_range(tlog: Readable, offset: int, max_messages: int, max_bytes: int) -> LogRange | None:
    """Whole records from ``offset`` (or the first retained after it, past a gap), within
    one segment, at most ``max_messages`` and ``max_bytes`` (at least one record). None at
    ``latest``. Raises ``OffsetOutOfRange``."""
    check_offset(tlog, offset)
    for seg in tlog.segments:
        if offset >= seg.next:
            continue
        if seg.unchecked is not None:
            # Checked before a header is read: the block the walk to ``offset`` starts in.
            block = seg.entry_before(max(offset, seg.base))
            if not _whole(tlog, seg, block, block + 1) and offset >= seg.next:
                continue  # it ends before ``offset`` now: the rest of it is a gap
        start, first = seg.position(max(offset, seg.base))
        if start >= seg.size:
            continue  # a gap after a damaged record: the next segment
        # Then all that the range, and the walk to its end, may cover.
        if (
            seg.unchecked is not None
            and not _whole(tlog, seg, start, start + max_bytes + 1)
            and start >= seg.size
        ):
            continue
        if seg.next - first <= max_messages and seg.size - start <= max_bytes:
            # The rest of the segment fits (a follower or reader near the end): no walk.
            return LogRange(seg.path, start, seg.size, first, seg.next, seg.next - first)
        # The end: from the index entry at or before start + max_bytes, walk forward.
        limit = start + max_bytes
        end, nxt, count = start, first, 0
        j = bisect.bisect_right(seg.idx_pos, limit) - 1
        if j >= 0 and seg.idx_pos[j] > start and seg.idx_off[j] - first <= max_messages:
            end, nxt, count = seg.idx_pos[j], seg.idx_off[j], seg.idx_off[j] - first
        for rec_offset, _, _, rec_end in seg.walk(end, seg.size):
            if count >= max_messages or (count and rec_end - start > max_bytes):
                break
            end, nxt, count = rec_end, rec_offset + 1, count + 1
        if count == 0:
            continue
        return LogRange(seg.path, start, end, first, nxt, count)
    return None


def read_ranges(
    tlog: Readable,
    offset: int,
    limit: int,
    max_messages: int,
    max_bytes: int,
    max_segments: int = 1 << 30,
) -> list[LogRange]:
    """The ranges of whole records from ``offset`` to below ``limit``, at most
    ``max_messages`` records, ``max_bytes`` bytes (at least one record) and ``max_segments``
    ranges (one per segment): the one log-range reader of ``GET /topic/log`` and the
    followers' fetch. Raises ``OffsetOutOfRange``."""
    check_offset(tlog, offset)
    ranges: list[LogRange] = []
    nxt = offset
    while max_messages > 0 and nxt < limit and len(ranges) < max_segments:
        rng = read_range(tlog, nxt, min(max_messages, limit - nxt), max_bytes)
        if rng is None or (ranges and rng.end - rng.start > max_bytes):
            break
        ranges.append(rng)
        nxt = rng.next
        max_messages -= rng.count
        max_bytes -= rng.end - rng.start
        if max_bytes <= 0:
            break
    return ranges


def _read(rng: LogRange) -> bytes:
    with open(rng.path, "rb") as f:
        f.seek(rng.start)
        return f.read(rng.end - rng.start)


def read_messages(
    tlog: Readable,
    offset: int,
    max_count: int,
    upto: int | None = None,
    out: list[int] | None = None,
) -> tuple[list[Message], int]:
    """The topic's backlog, as messages for its channels (checksums checked: a damaged
    record is logged and skipped rather than delivered), and the offset after them.
    ``upto``: read below it, though not yet visible (offsets the caller knows were
    committed: a channel rebuilt after a crash, before the high watermark is known again).
    ``out``: each message's offset is appended to it (a put-back that stops part-way or
    keeps per-offset state; offsets may have gaps)."""
    offset = max(offset, tlog.earliest)
    limit = tlog.visible if upto is None else min(upto, tlog.latest)
    if offset >= limit:
        return [], min(offset, tlog.latest)
    rng = read_range(tlog, offset, min(max_count, limit - offset), 16 << 20)
    if rng is None:
        return [], limit
    data = _read(rng)
    msgs: list[Message] = []
    unpack_head, unpack_tail, crc32 = _HEAD.unpack_from, _TAIL.unpack_from, zlib.crc32
    view = memoryview(data)
    pos, end = 0, len(data)
    while pos + HEADER_SIZE <= end:
        rec_offset, crc = unpack_head(data, pos)
        length, ts, msg_id, flags, defer_ms = unpack_tail(data, pos + 12)
        stop = pos + 16 + length
        checked = view[pos + 12 : stop]
        if stop > end or (
            (rec_offset >> 32 or crc32(checked, rec_offset) != crc)  # ``crc_holds``, inline
            and not crc_holds(crc, rec_offset, flags >> 8, checked)
        ):
            tlog.log.error(
                "TOPICLOG(%s): record at offset %d is damaged; skipped", tlog.name, rec_offset
            )
            if stop > end:
                break  # its length is wrong: where the next record starts is not known
            pos = stop  # a checksum mismatch: this record only
            continue
        start = pos + HEADER_SIZE
        if flags & IDENTIFIED:
            start = body_start(data, pos, flags)[0]
        if flags & HEADERS:
            split = log_record.split_headers(data[start:stop])
            if split is None:
                tlog.log.error(
                    "TOPICLOG(%s): record at offset %d has a bad header block; skipped",
                    tlog.name,
                    rec_offset,
                )
                pos = stop
                continue
            m = Message(msg_id, split[1], ts, 0, split[0])
        else:
            m = Message(msg_id, data[start:stop], ts)
        if defer_ms:
            m.defer_until_ns = ts + defer_ms * 1_000_000
        msgs.append(m)
        if out is not None:
            out.append(rec_offset)
        pos = stop
    return msgs, rng.next


def bodies_at(tlog: Readable, offsets: list[int]) -> list[bytes | None]:
    """The bodies of the records at ``offsets`` (ascending; an idempotent publish's
    duplicates, read back to compare), committed or not; None where one is gone."""
    found: dict[int, bytes] = {}
    offset, end = offsets[0], offsets[-1] + 1
    while offset < end:
        at: list[int] = []
        msgs, nxt = read_messages(tlog, offset, end - offset, upto=end, out=at)
        found.update((o, m.body) for o, m in zip(at, msgs, strict=True))
        if nxt <= offset:
            break
        offset = nxt
    return [found.get(o) for o in offsets]


def read_identities(tlog: Readable, dedup: Dedup, offset: int) -> Follow | None:
    """The identities of the records from ``offset`` on, read back into ``dedup`` (after a
    start, a truncation): what an IDENTIFIED_NEXT record at the log's end continues is
    returned."""
    follow: Follow | None = None
    offset = max(offset, tlog.earliest)
    while offset < tlog.latest:
        rng = read_range(tlog, offset, 10_000, 8 << 20)
        if rng is None:
            break
        records, damaged = log_record.scan_records(_read(rng), follow=follow)
        for r in records:
            if r.sequence >= 0:
                dedup.record(r.producer, r.sequence, 1, r.offset, r.timestamp)
        follow = log_record.follow_after(records[-1]) if records else None
        # Past a damaged record (logged at open) to the next range.
        offset = records[-1].offset + 1 if damaged and records else rng.next
        if damaged:
            follow = None
    return follow
