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

Who does what. This class decides what the log holds; three others carry it out:
``storage/log_records.py`` encodes a batch and checks a replica's records (no I/O),
``storage/segment_files.py`` changes the files, ``storage/handed.py`` keeps the hand-off
position.

Opening (``SegmentFiles.open``). Segments (``storage/segment.py``: one file, its index, its
scan) are found by name. The last segment is scanned record by record: a torn tail (short
record, bad length or checksum) is truncated away and logged. A closed segment's index is read
and checked (entries in order, inside the file, the first entry is the first record, the
records after the last entry reach the end of the file cleanly); if the check fails the index is
rebuilt by scanning. A closed segment whose scan stops before its end keeps its readable prefix;
the records after the bad one are lost (logged), and their offsets are a gap that reads skip.

Retention. ``prune`` deletes whole closed segments, oldest first: a segment whose newest record is
older than the time bound, or one whose removal still leaves at least the size bound retained.
The active segment is never deleted, so a record within both bounds is never lost.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from functools import partial

from ..core.dedup import Dedup
from ..core.message import Message
from . import durable, log_reader, log_records, producers
from .atomic import write_atomic
from .group_sync import GroupSync, SyncJob, SyncWaits
from .handed import HandedPosition
from .log_reader import OffsetOutOfRange
from .readers import Readers
from .segment import INDEX_INTERVAL, LogRange, Segment
from .segment_files import SegmentFiles
from .synced_mark import SyncedMark
from .syncer import SYNCER, SyncSlot

__all__ = [
    "INDEX_INTERVAL",
    "LogRange",
    "OffsetOutOfRange",
    "TopicLog",
]


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
        #: The segment files (``storage/segment_files.py``): this class decides, they do.
        self.files = SegmentFiles(directory, self.name, logger)
        self._unsynced = 0
        #: Its place in the background fsync engine.
        self._slot = SyncSlot(f"TOPICLOG({self.name})")
        self._closed = False
        #: Called after each append with None or the error (nsqd's /ping health).
        self.on_write: Callable[[OSError | None], None] | None = None
        #: Called after each successful append of a replicated partition's origin (its
        #: followers' long-polls wake, its group fsync starts).
        self.on_append: Callable[[], None] | None = None
        #: How far the channels have been handed the records (``storage/handed.py``).
        self.hand_off = HandedPosition(directory, self.name, logger, sync_every <= 1)
        #: Readers that keep their own offsets, as they report them (``storage/readers.py``).
        self.readers = Readers()
        #: A replicated partition's high watermark: readers and channels see offsets below it
        #: only. None: not replicated, all is visible. Only ``cluster/partition.py`` moves it
        #: (``commit_to``; a test holds it to that).
        self._committed: int | None = None
        #: The end of what the last fsync covered (``fsync_end``).
        self.synced = 0
        #: ``--sync-every=1`` as a group commit (``storage/group_sync.py``): appends ask this
        #: engine for an fsync off the loop, and publishes wait for it (``wait_synced``).
        #: None: the fsync runs in ``append``, before the OK (a replica's copy, a test's log).
        self.group: GroupSync | None = None
        self.sync_waits = SyncWaits()
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
        #: Gaps of damaged records in closed segments, found at open or when first read
        #: (``log_reader.damaged``): (first, last) offsets, ``lost``.
        self.holes: list[tuple[int, int]] = self.files.open()
        durable.fsync(self.files.fd)  # what a restart finds is what the log stands on
        self.synced = self.latest
        #: Where the last completed fsync ended: a log that opens shorter lost data (``lost``).
        self.mark = SyncedMark(directory, self.name, logger)
        self.mark.opened(self.latest)
        self.hand_off.load(self.earliest, self.latest)

    # -- state ----------------------------------------------------------------------------

    @property
    def segments(self) -> list[Segment]:
        return self.files.segments

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
        first = seg.next
        enc = log_records.encode(
            msgs, identity, first, seg.size, log_records.next_index(seg.idx_pos)
        )
        try:
            self.files.write(seg, enc.data)
        except OSError as err:
            if self.on_write is not None:
                self.on_write(err)
            raise
        self.files.extend(seg, enc.entries, enc.size, enc.next, enc.last_ts)
        ids = self.ids
        if ids.dedup is not None:
            if identity is not None:
                ids.dedup.record(identity[0], identity[1], len(msgs), first, enc.last_ts)
                ids.follow = (identity[0], identity[1] + len(msgs), enc.next)
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
        must be ``latest`` and the offsets dense; every checksum is checked first
        (``log_records.check``). Returns the number of records. Raises ``ValueError``
        (nothing written) or ``OSError``."""
        if self._closed:
            raise OSError("the topic log is closed")
        if not len(data):
            return 0
        seg = self.segments[-1]
        if seg.size >= self.segment_bytes and seg.next > seg.base:
            seg = self._roll()
        dedup = self.ids.dedup
        got = log_records.check(
            data,
            self.latest,
            seg.size,
            log_records.next_index(seg.idx_pos),
            dedup is not None,
            self.ids.follow,
        )
        self.files.write(seg, bytes(data))
        self.files.extend(
            seg, got.entries, seg.size + len(data), self.latest + got.records, got.last_ts
        )
        self._unsynced += got.records
        if dedup is not None:
            for producer, seq, n, first, rec_ts in got.runs:
                dedup.record(producer, seq, n, first, rec_ts)
            self.ids.follow = got.follow
        elif got.identified:
            self.identities()  # read back once; kept by every append from here on
        return got.records

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
            if self.unsafe_from is not None and offset <= self.unsafe_from and self.files.fd >= 0:
                durable.fsync(self.files.fd)  # a cut whose own fsync failed: done now
                self.unsafe_from = None
            return 0
        dropped = self.latest - max(offset, self.earliest)
        if damaged:
            self.mark.hold(self.latest)  # what it held is owed back, whatever was synced
        else:
            self.mark.lower(offset)  # on disk before the records go
        producers.remove_after(self.directory, offset)
        SYNCER.cancel(self._slot)
        self.files.cut(offset)
        self.hand_off.handed = min(self.handed, self.latest)
        if self._committed is not None:
            self._committed = min(self._committed, self.latest)
        self.synced = min(self.synced, self.latest)
        self._unsynced = 0
        self.sync_waits.fail(f"its records were taken back (the log was truncated to {offset})")
        durable.fsync(self.files.fd)  # the state above is the file's, whether or not this fails
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
        producers.remove_after(self.directory, -1)  # of records this log will no longer hold
        self.files.empty_at(offset)
        self.hand_off.handed = self.synced = offset
        self.sync_waits.fail(f"its records were taken back (the log starts again at {offset})")
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
        if self.files.fd < 0 or self.synced >= self.latest:
            return None
        self._unsynced = 0
        return SyncJob(os.dup(self.files.fd), self.synced, self.latest, self._generation)

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
            self.sync_waits.reached(end)

    def sync_wait(self, end: int) -> Callable[[Callable[[str | None], None]], None] | None:
        """What the OK of records below ``end`` waits for: an fsync of the group commit that
        covers them; None without one (synced, or synced in ``append``)."""
        if self.group is None or self.synced >= end:
            return None
        return partial(self.wait_synced, end)

    def wait_synced(self, end: int, done: Callable[[str | None], None]) -> None:
        """``done(None)`` once an fsync covers every record below ``end`` (at once if one has),
        or ``done(reason)`` if the one that would have failed (the records are written; their
        durability is not known) or the log closed first."""
        if self.synced >= end:
            done(None)
        elif self.unsafe_from is not None and end > self.unsafe_from:
            # After a failed fsync the kernel may call the next one clean having dropped the
            # pages (``unsafe_from``): nothing past it is known durable until a restart
            # scans the log again, so nothing past it is answered OK.
            done(
                f"written, but an earlier fsync of this log failed: nothing from offset "
                f"{self.unsafe_from} on is known to be on disk until nsqd restarts"
            )
        else:
            self.sync_waits.add(end, done)

    def _request_sync(self) -> None:
        """With ``--sync-every=1`` the OK must follow the fsync: now, or, with a group commit
        engine (``group``), off the loop with the OK waiting for it. Otherwise an fsync costs
        milliseconds the loop owes every client, so the background engine runs it on
        duplicates of the descriptors (``storage/syncer.py``; its failure is reported by
        ``take_sync_error``): the records first, then the hand-off position, so the position
        never runs ahead of them."""
        if self.sync_every <= 1:
            if self.group is None:
                self.sync()
            else:
                self.group.request(self)
            return
        fds = [os.dup(self.files.fd)] if self._unsynced and self.files.fd >= 0 else []
        self._unsynced = 0
        handed = self.hand_off.dup_unsynced()
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
        self.sync_waits.fail(
            f"written, but the fsync that would cover it failed ({err}): it may not survive a "
            "power loss"
        )

    def take_sync_error(self) -> OSError | None:
        """The error of the last failed background sync, if any (reported once)."""
        return self._slot.take_error()

    def sync(self) -> None:
        """fsync now (a waiting background sync is dropped, a running one waited for).
        Raises OSError."""
        SYNCER.cancel(self._slot)
        if self.files.fd >= 0 and (self._unsynced or self.synced < self.latest):
            # (An fsync off the loop may still be running: ``synced`` says it is not done.)
            durable.fsync(self.files.fd)
            self._unsynced = 0
        self.synced = self.latest
        self.mark.advance(self.latest)
        self.hand_off.sync()
        self._slot.failed = False
        self.sync_waits.reached(self.synced)

    def sync_if_due(self) -> None:
        """``--sync-timeout``: the records and the hand-off position saved since the last
        sync go to disk (in the background unless ``--sync-every=1``)."""
        if self._unsynced or self.hand_off.unsynced:
            self._request_sync()

    def _roll(self) -> Segment:
        self.sync()
        seg = self.files.roll()
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
            total -= self.files.remove_oldest().size
            removed += 1
        return removed

    # -- reading --------------------------------------------------------------------------

    # The readers (``storage/log_reader.py``), as methods.
    check_offset = log_reader.check_offset
    offset_for_time = log_reader.offset_for_time
    read_range = log_reader.read_range
    read_ranges = log_reader.read_ranges
    read_messages = log_reader.read_messages
    bodies_at = log_reader.bodies_at

    @property
    def handed(self) -> int:
        """The first offset not yet handed to the channels (``storage/handed.py``)."""
        return self.hand_off.handed

    @property
    def saved_handed(self) -> int:
        return self.hand_off.saved

    def hand_to(self, offset: int) -> None:
        """The channels have been handed ``[.., offset)`` (or a replica's channels need none
        of it): the one way ``handed`` moves from outside this file (a test holds it to that);
        saved by ``save_handed``. On the publish path: an assignment, nothing more."""
        self.hand_off.handed = offset

    def save_handed(self, position: int | None = None) -> None:
        """``HandedPosition.save``. Raises OSError."""
        self.hand_off.save(position)

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
            if self.files.fd >= 0:
                self.sync()
        finally:
            self.sync_waits.fail("the topic's log closed before an fsync covered it")
            self.files.close()
            self.hand_off.close()
            self.mark.close()

    def delete(self, keep: tuple[str, ...] = ()) -> None:
        """Close and remove the log's files (its topic is deleted or stops retaining), but
        those named in ``keep``; the directory goes once it is empty."""
        self.close()
        self.files.remove(keep)


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
