"""A replayable topic's retained log: every published message, addressed by offset.

Theory of operation. A topic with retention keeps, beside its normal queues, an append-only log
in ``<data-path>/<topic>.log/``: a series of segment files ``<base offset, 20 digits>.log``, each
a run of records in the layout below, with a sparse index kept in memory (and written to
``<base>.index`` when the segment is closed) mapping offset and timestamp to file position, one
entry per ``INDEX_INTERVAL`` bytes. Offsets are per topic, dense, start at 0 and are never
reused: the next offset survives restarts because it is the end of the last segment (or, once
every segment has been pruned, the base offset of the empty segment retention leaves behind).

Records are ``protocol/log_record.py``'s, on disk and on the wire of ``GET /topic/log`` alike,
so a read is a byte-range copy.

Writes. ``append`` encodes a batch (one PUB, MPUB, DPUB or HTTP publish) and writes it with one
``write`` straight to the kernel, before the messages fan out to channels, so a process crash
loses nothing that was acknowledged. ``fsync`` follows ``--sync-every`` (records since the last
sync) and ``--sync-timeout`` (``sync_if_due``), as the disk queues do: with ``--sync-every=1`` it
runs before the ``OK`` (the record is on disk); otherwise the background fsync engine
(``storage/syncer.py``, shared with the disk queues) runs it on a duplicate descriptor, so the
event loop never waits for the disk; a failed one is logged and reported by
``take_sync_error`` (``/ping`` turns unhealthy). A failed write (a full disk) truncates the
segment back, takes the offsets back, and raises ``OSError``: the publisher gets
``E_PUB_FAILED``. The hand-off position (``handed``, ``storage/position.py``) is synced with
the records, after them.

Opening. Segments (``storage/segment.py``: one file, its index, its scan) are found by name.
The last segment is scanned record by record: a torn tail
(short record, bad length or checksum) is truncated away and logged. A closed segment's index is
read and checked (entries in order, inside the file, the first entry is the first record, the
records after the last entry reach the end of the file cleanly); if the check fails the index is
rebuilt by scanning. A closed segment whose scan stops before its end keeps its readable prefix;
the records after the bad one are lost (logged), and their offsets are a gap that reads skip.

Retention. ``prune`` deletes whole closed segments, oldest first: a segment whose newest record is
older than the time bound, or one whose removal still leaves at least the size bound retained.
The active segment is never deleted, so a record within both bounds is never lost.
"""

from __future__ import annotations

import bisect
import contextlib
import errno
import json
import logging
import os
import time
import zlib
from collections.abc import Callable
from typing import Any, NamedTuple

from ..core.dedup import Dedup
from ..core.message import Message
from ..protocol import log_record
from ..protocol.log_record import (
    FLAGS_AT,
    HEADER_SIZE,
    IDENTIFIED,
    IDENTIFIED_NEXT,
    body_start,
)
from . import durable, log_reader, producers
from .atomic import write_atomic
from .log_reader import OffsetOutOfRange
from .position import PositionFile
from .segment import INDEX_INTERVAL, LogRange, Segment, segment_bases
from .synced_mark import SyncedMark
from .syncer import SYNCER, SyncSlot

__all__ = [
    "INDEX_INTERVAL",
    "LogRange",
    "OffsetOutOfRange",
    "SyncJob",
    "TopicLog",
]

_HEAD, _TAIL, _TAIL_FIXED = log_record.HEAD, log_record.TAIL, log_record.TAIL_FIXED
_HEAD_TS = log_record.LENGTH_TIMESTAMP
_IDENTIFIED_ANY = (IDENTIFIED | IDENTIFIED_NEXT) >> 8
#: The first offset not yet handed to the topic's channels (``storage/position.py``).
HANDED_FILE = "handed"


class SyncJob(NamedTuple):
    """An fsync of a log's active segment to run off the event loop (``TopicLog.fsync_job``):
    a duplicate descriptor, the end offset it covers, and the log's generation when it was
    taken (a truncation or restart since then makes it stale: ``synced_to`` ignores it)."""

    fd: int
    start: int
    end: int
    generation: int


class TopicLog:
    """The retained log of one topic. All calls are made from the event loop thread."""

    def __init__(
        self,
        directory: str,
        *,
        segment_bytes: int,
        sync_every: int,
        logger: logging.Logger,
        name: str = "",
    ) -> None:
        self.directory = directory
        self.name = name or os.path.basename(directory)
        self.segment_bytes = segment_bytes
        self.sync_every = sync_every
        self.log = logger
        self.retention_time = 0.0  # seconds; 0: no time bound
        self.retention_bytes = 0  # 0: no size bound
        self.segments: list[Segment] = []
        self._fd = -1
        self._unsynced = 0
        #: Its place in the background fsync engine.
        self._slot = SyncSlot(f"TOPICLOG({self.name})")
        self._closed = False
        #: Called after each append with None or the error (nsqd's /ping health).
        self.on_write: Callable[[OSError | None], None] | None = None
        #: Called after each successful append of a replicated partition's origin (its
        #: followers' long-polls wake, its group fsync starts).
        self.on_append: Callable[[], None] | None = None
        self.handed = 0
        #: The hand-off position as saved: retention never removes a segment at or after it.
        self.saved_handed = -1
        #: A replicated partition's high watermark: readers and channels see offsets below it
        #: only. None: not replicated, all is visible. Only ``cluster/partition.py`` moves it
        #: (``commit_to``; a test holds it to that).
        self._committed: int | None = None
        #: The end of what the last fsync covered (``fsync_end``).
        self.synced = 0
        #: Bumped when records are taken back (``truncate``, ``restart_at``): an fsync job
        #: from before then covers records that are no longer these.
        self._generation = 0
        #: Where a failed fsync (``sync_failed``) left durability unknown: after a failed
        #: fsync the kernel may have dropped the dirty pages and calls the next fsync clean,
        #: so nothing at or after it counts as synced again until it is cut (``truncate``).
        self.unsafe_from: int | None = None
        os.makedirs(directory, exist_ok=True)
        #: Idempotent publishing's index (``core/dedup.py``), built from the records on first
        #: use and kept up to date by every append after that (``storage/producers.py``).
        self.ids = producers.ProducerIndex(self)
        #: Gaps of damaged records between closed segments, found at open (``lost``).
        self.holes: list[tuple[int, int]] = []
        self._open()
        durable.fsync(self._fd)  # what a restart finds is what the log stands on
        self.synced = self.latest
        #: Where the last completed fsync ended: a log that opens shorter lost data (``lost``).
        self.mark = SyncedMark(directory, self.name, logger)
        self.mark.opened(self.latest)
        self._handed_file: PositionFile | None = None
        self._load_handed()

    # -- state ----------------------------------------------------------------------------

    @property
    def earliest(self) -> int:
        return self.segments[0].base

    def lost(self) -> tuple[int, int] | None:
        """The first offsets (first, last) this log lost: a gap of damaged records in a closed
        segment (``holes``), or a tail an fsync had covered (a file cut short); None when it
        lost nothing it still retains."""
        for first, last in self.holes:
            if last >= self.earliest:
                return first, last
        return self.mark.lost(self.latest)

    @property
    def latest(self) -> int:
        """The next offset to be written."""
        return self.segments[-1].next

    @property
    def committed(self) -> int | None:
        return self._committed

    def commit_to(self, offset: int | None) -> None:
        """The commit point (``cluster/partition.py``'s, the one writer): readers and channels
        see offsets below ``offset``; None: everything."""
        self._committed = offset

    @property
    def visible(self) -> int:
        """The end of what readers and channels may see: ``latest``, or the high watermark of
        a replicated partition."""
        committed = self._committed
        return self.latest if committed is None else min(committed, self.latest)

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def segment_count(self) -> int:
        return len(self.segments)

    # -- writing --------------------------------------------------------------------------

    def append(self, msgs: list[Message], identity: tuple[bytes, int] | None = None) -> int:
        """Log ``msgs`` in order; return the offset of the first. Raises ``OSError`` (nothing
        of the batch is then logged). ``identity``: an idempotent publish's producer and the
        sequence number of the first message (``core/dedup.py``)."""
        if self._closed:
            raise OSError("the topic log is closed")
        seg = self.segments[-1]
        if seg.size >= self.segment_bytes and seg.next > seg.base:
            seg = self._roll()
        first = offset = seg.next
        pos = seg.size
        next_index = seg.idx_pos[-1] + INDEX_INTERVAL if seg.idx_pos else 0
        parts: list[bytes] = []
        head, tail, crc32 = _HEAD.pack, _TAIL.pack, zlib.crc32
        ts = 0
        entries: list[tuple[int, int, int]] = []
        records = iter(msgs)
        flags = 0
        if identity is not None:
            # An idempotent publish: its first record carries the identity after its fixed
            # part (``log_record.identified_tail``); the others are IDENTIFIED_NEXT, with none.
            producer, seq = identity
            m = next(records)
            body = m.body
            ts = m.timestamp
            defer = (m.defer_until_ns - ts) // 1_000_000 if m.defer_until_ns else 0
            plen = len(producer)
            t = log_record.identified_tail(plen).pack(
                _TAIL_FIXED + 9 + plen + len(body), ts, m.id, IDENTIFIED, defer, plen, producer, seq
            )
            if pos >= next_index:
                entries.append((offset, pos, ts))
                next_index = pos + INDEX_INTERVAL
            parts += (head(offset, crc32(body, crc32(t))), t, body)
            pos += 12 + len(t) + len(body)
            offset += 1
            flags = IDENTIFIED_NEXT
        for m in records:
            body = m.body
            ts = m.timestamp
            defer = (m.defer_until_ns - ts) // 1_000_000 if m.defer_until_ns else 0
            t = tail(_TAIL_FIXED + len(body), ts, m.id, flags, defer)
            if pos >= next_index:
                entries.append((offset, pos, ts))
                next_index = pos + INDEX_INTERVAL
            parts.append(head(offset, crc32(body, crc32(t))))
            parts.append(t)
            parts.append(body)
            pos += HEADER_SIZE + len(body)
            offset += 1
        data = b"".join(parts)
        try:
            self._write(seg, data)
        except OSError as err:
            if self.on_write is not None:
                self.on_write(err)
            raise
        for e in entries:
            seg.add_index(*e)
        seg.size = pos
        seg.next = offset
        if ts > seg.last_ts:
            seg.last_ts = ts
        ids = self.ids
        if ids.dedup is not None:
            if identity is not None:
                ids.dedup.record(identity[0], identity[1], len(msgs), first, ts)
                ids.follow = (identity[0], identity[1] + len(msgs), offset)
            else:
                ids.follow = None
        elif identity is not None:
            self.identities()  # read back once (with this append); kept from here on
        self._unsynced += len(msgs)
        if self._unsynced >= self.sync_every:
            try:
                self._request_sync()
            except OSError as err:
                if self.on_write is not None:
                    self.on_write(err)
                raise
        if self.on_write is not None:
            self.on_write(None)
        if self.on_append is not None:
            self.on_append()
        return first

    def append_raw(self, data: bytes | memoryview) -> int:
        """A replica's append: whole records as the leader's log holds them (``GET /topic/log``
        bytes), written verbatim so offsets, IDs and timestamps are the leader's. The first
        must be ``latest`` and the offsets dense; every checksum is checked first. Returns the
        number of records. Raises ``ValueError`` (nothing written) or ``OSError``."""
        if self._closed:
            raise OSError("the topic log is closed")
        # One pass over the headers: checksums, dense offsets from ``latest``, and the index
        # entries (no record objects: this runs for every fetch a follower makes).
        end = len(data)
        expect = self.latest
        seg = self.segments[-1]
        if end and seg.size >= self.segment_bytes and seg.next > seg.base:
            seg = self._roll()
        base = seg.size
        next_index = seg.idx_pos[-1] + INDEX_INTERVAL if seg.idx_pos else 0
        entries: list[tuple[int, int, int]] = []
        unpack_head, unpack_lts, crc32 = _HEAD.unpack_from, _HEAD_TS.unpack_from, zlib.crc32
        view = memoryview(data)
        pos = ts = 0
        dedup = self.ids.dedup
        follow = self.ids.follow
        identified = False
        # Runs of identified records: [producer, first sequence, count, first offset, ts].
        runs: list[list[Any]] = []
        while pos < end:
            if end - pos < HEADER_SIZE:
                raise ValueError(str(log_record.Damaged(pos, None, "a short record header")))
            offset, crc = unpack_head(data, pos)
            length, ts = unpack_lts(data, pos + 12)
            stop = pos + 16 + length
            if length < _TAIL_FIXED or stop > end:
                raise ValueError(str(log_record.Damaged(pos, offset, "a bad record length")))
            if crc32(view[pos + 12 : stop]) != crc:
                raise ValueError(str(log_record.Damaged(pos, offset, "a checksum mismatch")))
            if offset != expect:
                raise ValueError(f"record offset {offset} where {expect} was expected")
            if dedup is None:
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
            if base + pos >= next_index:
                entries.append((offset, base + pos, ts))
                next_index = base + pos + INDEX_INTERVAL
            expect += 1
            pos = stop
        if not end:
            return 0
        pos = base + end
        count = expect - self.latest
        self._write(seg, bytes(data))
        for e in entries:
            seg.add_index(*e)
        seg.size = pos
        seg.next = expect
        seg.last_ts = max(seg.last_ts, ts)
        self._unsynced += count
        if dedup is not None:
            for producer, seq, n, first, rec_ts in runs:
                dedup.record(producer, seq, n, first, rec_ts)
            self.ids.follow = follow
        elif identified:
            self.identities()  # read back once; kept by every append from here on
        return count

    def _write(self, seg: Segment, data: bytes) -> None:
        """Write ``data`` at the end of ``seg``'s records; a failed or short write is cut
        back off. Raises OSError."""
        try:
            written = os.pwrite(self._fd, data, seg.size)
            if written != len(data):
                raise OSError(
                    errno.ENOSPC,
                    f"{os.strerror(errno.ENOSPC)} (short write: {written} of {len(data)} bytes)",
                )
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, seg.size)
            raise

    def truncate(self, offset: int, *, damaged: bool = False) -> int:
        """Drop every record at ``offset`` and after (a replica's uncommitted tail), crash-safe:
        newest segments first, each step leaving a log that opens as a prefix of the old one;
        fsync'd before it returns. Returns how many records went. Raises OSError.
        ``damaged``: a copy cut at its first damaged record to fetch the rest again: the synced
        mark stays, so the copy counts as having lost those offsets until it holds them."""
        self._generation += 1  # an fsync job from before says nothing of what follows
        self.holes = [(a, min(b, offset - 1)) for a, b in self.holes if a < offset]
        if offset < self.latest:
            self.ids.forget()  # rebuilt from what is left, when next asked
        if offset >= self.latest:
            if self.unsafe_from is not None and offset <= self.unsafe_from and self._fd >= 0:
                durable.fsync(self._fd)  # a cut whose own fsync failed: done now
                self.unsafe_from = None
            return 0
        dropped = self.latest - max(offset, self.earliest)
        if damaged:
            self.mark.hold(self.latest)  # what it held is owed back, whatever was synced
        else:
            self.mark.lower(offset)  # on disk before the records go
        producers.remove_after(self.directory, offset)
        SYNCER.cancel(self._slot)
        while len(self.segments) > 1 and self.segments[-1].base >= offset:
            seg = self.segments.pop()
            os.close(self._fd)
            self._fd = -1
            os.unlink(seg.path)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(seg.index_path)
            last = self.segments[-1]
            self._fd = os.open(last.path, os.O_WRONLY | os.O_CLOEXEC)
        seg = self.segments[-1]
        with contextlib.suppress(FileNotFoundError):
            os.unlink(seg.index_path)  # rebuilt from the records at the next close or open
        if offset <= seg.base:
            pos, keep = 0, seg.base
        else:
            pos, keep = seg.position(offset)
        os.ftruncate(self._fd, pos)
        seg.size = pos
        seg.next = keep if offset > seg.base else seg.base
        i = bisect.bisect_left(seg.idx_pos, pos)
        del seg.idx_off[i:], seg.idx_pos[i:], seg.idx_ts[i:]
        seg.last_ts = seg.idx_ts[-1] if seg.idx_ts else 0
        if pos:
            for _, ts, _, _ in seg.walk(seg.idx_pos[-1] if seg.idx_pos else 0, pos):
                seg.last_ts = max(seg.last_ts, ts)
        self.handed = min(self.handed, self.latest)
        if self._committed is not None:
            self._committed = min(self._committed, self.latest)
        self.synced = min(self.synced, self.latest)
        self._unsynced = 0
        durable.fsync(self._fd)  # the state above is the file's, whether or not this fails
        if self.unsafe_from is not None and offset <= self.unsafe_from:
            self.unsafe_from = None
        self.log.warning(
            "TOPICLOG(%s): truncated to offset %d (%d records dropped)", self.name, offset, dropped
        )
        return dropped

    def restart_at(self, offset: int) -> None:
        """A replica too far behind its leader (retention there removed what it needs next):
        drop every record and begin again, empty, at ``offset``. A crash mid-way leaves an
        empty log (the replica is told again). Raises OSError."""
        self.ids.forget()
        self.holes = []
        SYNCER.cancel(self._slot)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        for seg in reversed(self.segments):
            for path in (seg.path, seg.index_path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        producers.remove_after(self.directory, -1)  # of records this log no longer holds
        seg = Segment(self.directory, offset)
        self.segments = [seg]
        self._fd = os.open(seg.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        durable.fsync(self._fd)
        self.handed = self.synced = offset
        self.mark.advance(offset)
        self._generation += 1
        self.unsafe_from = None
        if self._committed is not None:
            self._committed = offset
        self._unsynced = 0
        self.log.warning("TOPICLOG(%s): emptied, starting again at offset %d", self.name, offset)

    # -- idempotent publishing (core/dedup.py) ----------------------------------------------

    def identities(self, now_ns: int | None = None) -> Dedup:
        """The identities of the records in the window (``storage/producers.py``)."""
        return self.ids.get(now_ns)

    def set_dedup(self, records: int, window_ns: int) -> None:
        """The idempotent publishing window (``POST /topic/config``)."""
        self.ids.set_window(records, window_ns)

    def fsync_job(self) -> SyncJob | None:
        """For an fsync off the event loop: a duplicate descriptor of the active segment and
        the end offset it covers, or None when everything is synced. Segments before it were
        synced when they closed. The caller fsyncs and closes the descriptor, then calls
        ``synced_to`` with the job (only if the fsync succeeded)."""
        if self._fd < 0 or self.synced >= self.latest:
            return None
        self._unsynced = 0
        return SyncJob(os.dup(self._fd), self.synced, self.latest, self._generation)

    def synced_to(self, job: SyncJob) -> None:
        """``job``'s fsync succeeded: what it covers is durable, unless records were taken
        back since it was taken (a leader's group fsync still running when it stepped down
        and truncated): then it says nothing of the records now at those offsets. Never past
        ``unsafe_from``."""
        if job.generation != self._generation:
            return
        end = job.end if self.unsafe_from is None else min(job.end, self.unsafe_from)
        if end > self.synced:
            self.synced = end
            self.mark.advance(end)

    def _request_sync(self) -> None:
        """With ``--sync-every=1`` the OK must follow the fsync: now. Otherwise an fsync costs
        milliseconds the loop owes every client, so the background engine runs it on
        duplicates of the descriptors (``storage/syncer.py``; its failure is reported by
        ``take_sync_error``): the records first, then the hand-off position, so the position
        never runs ahead of them."""
        if self.sync_every <= 1:
            self.sync()
            return
        fds = [os.dup(self._fd)] if self._unsynced and self._fd >= 0 else []
        self._unsynced = 0
        handed = self._handed_file.dup_unsynced() if self._handed_file is not None else None
        if handed is not None:
            fds.append(handed)
        if fds:
            SYNCER.submit(self._slot, fds)

    def sync_failed(self, err: OSError, job: SyncJob) -> None:
        """``job``'s fsync failed (already logged): reported as the background engine's
        failures are (``take_sync_error``: ``/ping``), and what it covered is unsafe until it
        is cut (``unsafe_from``)."""
        SYNCER.report(self._slot, err)
        if job.generation == self._generation:
            start = max(job.start, self.earliest)
            self.unsafe_from = start if self.unsafe_from is None else min(self.unsafe_from, start)

    def take_sync_error(self) -> OSError | None:
        """The error of the last failed background sync, if any (reported once)."""
        return self._slot.take_error()

    def sync(self) -> None:
        """fsync now (a waiting background sync is dropped, a running one waited for).
        Raises OSError."""
        SYNCER.cancel(self._slot)
        if self._fd >= 0 and (self._unsynced or self.synced < self.latest):
            # (An fsync off the loop may still be running: ``synced`` says it is not done.)
            durable.fsync(self._fd)
            self._unsynced = 0
        self.synced = self.latest
        self.mark.advance(self.latest)
        if self._handed_file is not None:
            self._handed_file.sync()
        self._slot.failed = False

    def sync_if_due(self) -> None:
        """``--sync-timeout``: the records and the hand-off position saved since the last
        sync go to disk (in the background unless ``--sync-every=1``)."""
        if self._unsynced or (self._handed_file is not None and self._handed_file.unsynced):
            self._request_sync()

    def _roll(self) -> Segment:
        old = self.segments[-1]
        self.sync()
        os.close(self._fd)
        self._fd = -1
        try:
            write_atomic(old.index_path, old.encode_index())
        except OSError as err:  # the index is rebuilt by a scan at the next start
            self.log.warning(
                "TOPICLOG(%s): failed to write %s - %s", self.name, old.index_path, err
            )
        seg = Segment(self.directory, old.next)
        self.segments.append(seg)
        self._fd = os.open(seg.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        self.log.info("TOPICLOG(%s): new segment %d", self.name, seg.base)
        self.ids.at_roll(seg.base)
        self.prune()
        return seg

    # -- retention ------------------------------------------------------------------------

    def prune(self, now_ns: int | None = None) -> int:
        """Delete the closed segments outside retention; return how many."""
        now_ns = time.time_ns() if now_ns is None else now_ns
        horizon = now_ns - int(self.retention_time * 1e9) if self.retention_time else None
        removed = 0
        total = self.size
        while len(self.segments) > 1:
            seg = self.segments[0]
            if seg.next > min(self.handed, self.saved_handed):  # channels have not had them all
                break
            too_old = horizon is not None and seg.last_ts < horizon
            too_big = bool(self.retention_bytes) and total - seg.size >= self.retention_bytes
            if not (too_old or too_big):
                break
            self.segments.pop(0)
            total -= seg.size
            for path in (seg.path, seg.index_path):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
            removed += 1
            self.log.info(
                "TOPICLOG(%s): retention removed segment %d (offsets %d-%d)",
                self.name,
                seg.base,
                seg.base,
                seg.next - 1,
            )
        return removed

    # -- reading --------------------------------------------------------------------------

    # (``storage/log_reader.py``: the reads, each over this log)

    def check_offset(self, offset: int) -> None:
        log_reader.check_offset(self, offset)

    def offset_for_time(self, ts_ns: int) -> int:
        return log_reader.offset_for_time(self, ts_ns)

    def read_range(self, offset: int, max_messages: int, max_bytes: int) -> LogRange | None:
        return log_reader.read_range(self, offset, max_messages, max_bytes)

    def read_ranges(
        self,
        offset: int,
        limit: int,
        max_messages: int,
        max_bytes: int,
        max_segments: int = 1 << 30,
    ) -> list[LogRange]:
        return log_reader.read_ranges(self, offset, limit, max_messages, max_bytes, max_segments)

    def read_messages(
        self, offset: int, max_count: int, upto: int | None = None, out: list[int] | None = None
    ) -> tuple[list[Message], int]:
        return log_reader.read_messages(self, offset, max_count, upto, out)

    def bodies_at(self, offsets: list[int]) -> list[bytes | None]:
        return log_reader.bodies_at(self, offsets)

    def hand_to(self, offset: int) -> None:
        """The channels have been handed ``[.., offset)`` (or a replica's channels need none
        of it): the one way ``handed`` moves from outside this file (a test holds it to that);
        saved by ``save_handed``. On the publish path: an assignment, nothing more."""
        self.handed = offset

    def save_handed(self, position: int | None = None) -> None:
        """Persist the hand-off position (``handed``, or an earlier ``position`` that every
        channel has stored) if it moved: in place, fdatasync'd at once with ``--sync-every=1``,
        else with the next sync. Raises OSError."""
        position = self.handed if position is None else position
        if position != self.saved_handed:
            if self._handed_file is None:
                self._handed_file = PositionFile(os.path.join(self.directory, HANDED_FILE))
            self._handed_file.save(position, sync=self.sync_every <= 1)
            self.saved_handed = position

    def _load_handed(self) -> None:
        path = os.path.join(self.directory, HANDED_FILE)
        try:
            self._handed_file = PositionFile(path)
            saved = self._handed_file.load()
            # None: a new log, nothing is waiting.
            self.handed = self.latest if saved is None else saved
        except (OSError, ValueError) as err:
            # Unknown: hand over everything still retained again (at least once).
            self.log.error(
                "TOPICLOG(%s): unreadable %s (%s); replaying the log", self.name, path, err
            )
            self.handed = self.earliest
        self.handed = min(max(self.handed, self.earliest), self.latest)
        self.saved_handed = -1
        self.save_handed()
        if self.handed < self.latest:
            self.log.info(
                "TOPICLOG(%s): %d messages waiting for channels (offsets %d-%d)",
                self.name,
                self.latest - self.handed,
                self.handed,
                self.latest - 1,
            )

    # -- opening --------------------------------------------------------------------------

    def _open(self) -> None:
        bases = segment_bases(self.directory)
        for n, base in enumerate(bases):
            seg = Segment(self.directory, base)
            last = n == len(bases) - 1
            if last or not seg.load_index():
                seg.scan(truncate=last, log=self.log, name=self.name)
            if not last and seg.next > bases[n + 1]:
                self.log.error(
                    "TOPICLOG(%s): segment %d overlaps segment %d; kept as .bad",
                    self.name,
                    base,
                    bases[n + 1],
                )
                os.replace(seg.path, seg.path + ".bad")
                continue
            self.segments.append(seg)
        if not self.segments:
            self.segments.append(Segment(self.directory, 0))
        seg = self.segments[-1]
        self._fd = os.open(seg.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        for i, s in enumerate(self.segments[:-1]):
            if s.next < self.segments[i + 1].base:
                self.holes.append((s.next, self.segments[i + 1].base - 1))
                self.log.warning(
                    "TOPICLOG(%s): offsets %d-%d are lost (damaged records); reads skip them",
                    self.name,
                    s.next,
                    self.segments[i + 1].base - 1,
                )

    # -- closing --------------------------------------------------------------------------

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self.save_handed()
        except OSError as err:  # the backlog is handed over again after the restart
            self.log.error("TOPICLOG(%s): failed to save its position - %s", self.name, err)
        try:
            if self._fd >= 0:
                self.sync()
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            if self._handed_file is not None:
                self._handed_file.close()
            self.mark.close()

    def delete(self, keep: tuple[str, ...] = ()) -> None:
        """Close and remove the log's files (its topic is deleted or stops retaining), but
        those named in ``keep``; the directory goes once it is empty."""
        self.close()
        for entry in os.listdir(self.directory):
            if entry in keep:
                continue
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.directory, entry))
        with contextlib.suppress(OSError):
            os.rmdir(self.directory)


# -- a topic's own retention (POST /topic/retention) ------------------------------------------

RETENTION_FILE = "retention.json"


def read_retention(directory: str) -> tuple[float, int] | None:
    """A topic's own retention (seconds, bytes), or None when it follows the flags. An
    unreadable file is logged by the caller's ``ValueError``."""
    path = os.path.join(directory, RETENTION_FILE)
    try:
        with open(path, "rb") as f:
            doc = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise ValueError(f"failed to read {path} - {err}") from err
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("time_ns"), int)
        or not isinstance(doc.get("bytes"), int)
        or doc["time_ns"] < 0
        or doc["bytes"] < 0
    ):
        raise ValueError(f"failed to read {path} - not a retention setting")
    return doc["time_ns"] / 1e9, doc["bytes"]


def write_retention(directory: str, seconds: float, size: int) -> None:
    os.makedirs(directory, exist_ok=True)
    doc = {"time_ns": round(seconds * 1e9), "bytes": size}
    write_atomic(os.path.join(directory, RETENTION_FILE), json.dumps(doc).encode())
