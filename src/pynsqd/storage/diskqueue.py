"""A FIFO queue on disk in go-diskqueue v1.1.0's exact on-disk format.

Theory of operation. A queue is a numbered series of data files ``<name>.diskqueue.%06d.dat``, each
a run of records ``[int32 big-endian length][payload]``, plus a text metadata file
``<name>.diskqueue.meta.dat`` holding ``"%d\\n%d,%d\\n%d,%d\\n"``: depth, readFileNum,readPos and
writeFileNum,writePos. The writer appends to file ``writeFileNum`` at ``writePos``; the reader
consumes from ``readFileNum`` at ``readPos``. Before a write that would take ``writePos + 4 + len``
past ``max_bytes_per_file`` (and ``writePos > 0``), the writer rolls to the next file number. The
reader reads a completed file up to its real size, the current write file up to ``writePos``, and
deletes each completed file once it has consumed its last record. Go nsqd and pynsqd can therefore
read each other's data directories.

Unlike go-diskqueue there is no goroutine: the class is synchronous and is driven by its caller (the
asyncio server calls it from its loop). Every ``put``/``put_many`` is one ``pwrite`` of the
encoded records straight to the kernel, so a crash of the process loses nothing that was put; only
an OS crash or power loss can lose writes that were not yet fsynced. ``read_many`` reads the file
in 1 MiB chunks and slices records out of the buffer.

Sync (fsync of the write file, then the metadata written to ``<meta>.<rand>.tmp``, fsynced and
renamed over the metadata file) happens when ``sync_every`` reads + writes have accumulated (checked
at the end of each call, so a batch is synced once: group commit), on every roll, when the reader
starts a new file, after corruption handling, on ``close`` and on ``sync_if_due`` when there was any
operation since the last sync. The loss window on an OS crash with the defaults is therefore up to
``sync_every`` operations or ``sync_timeout`` seconds; with ``sync_every=1`` every ``put`` returns
only after its data and the metadata are on disk.

Background sync. An fsync costs milliseconds, and the caller is an event loop serving every client.
With ``background_sync=True`` and ``sync_every > 1``, the syncs asked for by the operation count and
by ``sync_if_due`` go to the background fsync engine (``storage/syncer.py``, shared with the
retained logs): the job holds a duplicate of the write file's descriptor (so the queue may close
or roll its own) and, to write once it is synced, a snapshot of the metadata taken when the sync
was asked for; a newer request supersedes a waiting snapshot. Every synchronous sync (``sync``,
``close``, rolls, corruption handling) and ``empty``/``delete`` first cancel the waiting job and
wait for a running one. A failed background sync is logged and kept for the owner to report
(``take_sync_error``). With ``sync_every=1`` every sync stays synchronous: the caller's
acknowledgement must follow durability.

Delivery semantics: records are consumed when ``read_many`` returns them (go-diskqueue's
``moveForward``). A crash after ``read_many`` returns loses them unless the caller keeps them
somewhere; a crash before the next sync makes them come back on restart (at-least-once).

Corruption, as go-diskqueue: a record length outside ``[min_msg_size, max_msg_size]``, a truncated
record or a read error makes the reader rename the file to ``.bad``, log it and go on with the next
file; if it was the current write file, writes move to a new file too. When the reader reaches the
end of the data with a nonzero depth, the depth is reset to 0 ("negative depth ... metadata
corruption" / "positive depth ... data loss"). At startup, a write file longer than the metadata's
``writePos`` (unclean shutdown, go-diskqueue #31) makes writes move to a new file so nothing is
overwritten.

Where we do better than go-diskqueue v1.1.0 (same format, so the files stay compatible):

- The records found past ``writePos`` at startup are counted into the depth, so the depth stays
  right instead of going negative while the reader salvages them.
- A write file shorter than ``writePos`` (or missing) at startup also moves writes to a new file,
  instead of writing past a hole that the reader would then take for corruption.
- A missing or unreadable metadata file next to existing data files does not restart at file 0 and
  overwrite them: the reader starts at the oldest data file, writes at a new one, and the depth is
  the count of the intact records found. With no data files it is a new empty queue, as in Go.
- A failed write truncates the file back to ``writePos``, so no partial record is left behind.
- ``close`` fsyncs the write file before closing it (Go closes it first and only writes metadata).
- Repairs made at startup are persisted at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import struct
from collections.abc import Callable

from .atomic import write_atomic
from .syncer import SYNCER, SyncSlot

__all__ = ["DiskQueue"]

_LEN = struct.Struct(">i")
#: pwritev takes at most this many buffers (Linux's IOV_MAX): 341 records of 3 pieces
_IOV_MAX = 1023
_READ_CHUNK = 1 << 20
_META_RE = re.compile(rb"\s*(-?\d+)\s*\n\s*(-?\d+),(-?\d+)\s*\n\s*(-?\d+),(-?\d+)")
#: pynsqd's optional fourth line: where the reader stood past a kept floor (``keep_from``).
_READER_RE = re.compile(rb"\s*(\d+),(\d+)\s*\n")
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


class DiskQueue:
    """One go-diskqueue compatible FIFO queue of opaque byte records.

    ``name`` is ``topic`` or ``topic:channel``. All methods do plain blocking file I/O and must be
    called from one thread. ``put``/``put_many`` raise ``OSError`` when the data cannot be written
    (or when the sync that ``sync_every`` asks for fails) and ``ValueError`` for a record whose
    size is outside ``[min_msg_size, max_msg_size]``. ``read_many`` never raises for I/O errors:
    it handles them as corruption (see the module docstring) and logs sync failures. Records are
    consumed when ``read_many`` returns them: a crash after that loses them, like go-diskqueue's
    ``moveForward``.
    """

    def __init__(
        self,
        name: str,
        data_path: str,
        *,
        max_bytes_per_file: int,
        min_msg_size: int,
        max_msg_size: int,
        sync_every: int,
        sync_timeout: float,
        logger: logging.Logger | None = None,
        background_sync: bool = False,
    ) -> None:
        if max_bytes_per_file <= 0:
            raise ValueError("max_bytes_per_file must be positive")
        if min_msg_size < 0 or max_msg_size < min_msg_size or max_msg_size > 0x7FFFFFFF:
            raise ValueError("invalid min_msg_size/max_msg_size")
        self.name = name
        self.data_path = data_path
        self.max_bytes_per_file = max_bytes_per_file
        self.min_msg_size = min_msg_size
        self.max_msg_size = max_msg_size
        self.sync_every = max(1, sync_every)
        self.sync_timeout = sync_timeout
        self._log = logger if logger is not None else logging.getLogger(__name__)

        # run-time state, also persisted in the metadata file
        self._depth = 0
        self._read_file_num = 0
        self._read_pos = 0
        self._write_file_num = 0
        self._write_pos = 0

        self._count = 0  # reads + writes since the last sync
        self._need_sync = False
        self._closed = False
        self._background = background_sync and self.sync_every > 1
        #: Its place in the background sync engine (``storage/syncer.py``).
        self._slot = SyncSlot(f"DISKQUEUE({name})")

        self._holding = False  # reads not to be persisted before commit_reads
        self._held_removals: list[str] = []  # consumed files to delete at commit_reads
        #: Where the persisted read position stays while records read are not yet done with
        #: (``storage/in_flight_journal.py``): the first such record's (file, position) and
        #: how many records lie between it and the reader; None: at the reader. Files from
        #: that one on are kept (``_pinned``) until the floor passes them.
        self.keep_from: Callable[[], tuple[int, int, int] | None] | None = None
        self._pinned: list[tuple[int, str]] = []
        #: The read position the metadata file last stored (file, position).
        self.persisted_read: tuple[int, int] = (0, 0)
        #: Where the reader stood past the floor when the metadata was last written before
        #: this start (its fourth line), if it did.
        self.was_read: tuple[int, int] | None = None
        self._wfd: int | None = None
        self._rfd: int | None = None
        self._rbuf = b""  # bytes of the read file starting at file offset _rbuf_pos
        self._rbuf_pos = 0
        self._read_end: int | None = None  # size of the read file once it is a completed file

        self._file_re = re.compile(re.escape(name) + r"\.diskqueue\.(\d{6,})\.dat")
        self._load()
        self.persisted_read = (self._read_file_num, self._read_pos)

    # -- public API ---------------------------------------------------------------------------

    def read_position(self) -> tuple[int, int]:
        """The reader's (file number, position)."""
        return self._read_file_num, self._read_pos

    def depth(self) -> int:
        """Number of records in the queue (never negative, even with inconsistent metadata)."""
        return self._depth if self._depth > 0 else 0

    def byte_size(self) -> int:
        """Bytes between the reader and the writer (records with their headers), counting
        each file in between as full: about, and never less than what is stored."""
        if not self.depth():
            return 0
        files = self._write_file_num - self._read_file_num
        if files <= 0:
            return max(0, self._write_pos - self._read_pos)
        return files * self.max_bytes_per_file - self._read_pos + self._write_pos

    def put(self, data: bytes) -> None:
        """Append one record; raise ``OSError`` if it cannot be written."""
        size = len(data)
        if size < self.min_msg_size or size > self.max_msg_size:
            raise ValueError(f"invalid message write size ({size}) maxMsgSize={self.max_msg_size}")
        if self._closed:
            self._check_open()
        pos = self._write_pos
        if pos > 0 and pos + 4 + size > self.max_bytes_per_file:
            self._roll()
        self._write(_LEN.pack(size) + data, 1)
        if self._count >= self.sync_every or self._need_sync:
            self._request_sync()

    def put_many(self, records: list[bytes], bodies: list[bytes] | None = None) -> None:
        """Append records in order with one write per data file they land in.

        With ``bodies``, record ``i`` is ``records[i] + bodies[i]``: the two go to the kernel as
        they are (``pwritev``), which spares large messages two copies (building the record and
        joining the batch); small ones are cheaper joined.

        Either every record is validated or none is written. If a write fails after a roll in the
        middle of the batch, the records before the roll stay in the queue and ``OSError`` is
        raised.
        """
        if not records:
            return
        if bodies is not None:
            self._put_pieces(records, bodies)
            return
        lo, hi = self.min_msg_size, self.max_msg_size
        for rec in records:
            if not lo <= len(rec) <= hi:
                raise ValueError(f"invalid message write size ({len(rec)}) maxMsgSize={hi}")
        self._check_open()
        limit = self.max_bytes_per_file
        pack = _LEN.pack
        parts: list[bytes] = []
        n = 0
        pos = self._write_pos
        for rec in records:
            total = 4 + len(rec)
            if pos > 0 and pos + total > limit:
                if parts:
                    self._write(b"".join(parts), n)
                    parts = []
                    n = 0
                self._roll()
                pos = 0
            parts.append(pack(len(rec)))
            parts.append(rec)
            pos += total
            n += 1
        if parts:
            self._write(b"".join(parts), n)
        if self._count >= self.sync_every or self._need_sync:
            self._request_sync()

    def put_framed(self, pieces: list[bytes], sizes: list[int]) -> None:
        """Append records given framed, as ``put_many`` does: record ``i`` is ``sizes[i]``
        bytes, and ``pieces[2 * i] + pieces[2 * i + 1]`` is it after its 4-byte size
        (``core/message.disk_frames``). Joined, one write per data file they land in."""
        if not sizes:
            return
        lo, hi = self.min_msg_size, self.max_msg_size
        if min(sizes) < lo or max(sizes) > hi:
            bad = next(size for size in sizes if not lo <= size <= hi)
            raise ValueError(f"invalid message write size ({bad}) maxMsgSize={hi}")
        self._check_open()
        limit = self.max_bytes_per_file
        pos = self._write_pos
        count = len(sizes)
        if pos + sum(sizes) + 4 * count > limit:  # a roll inside the batch
            start = 0
            for i, size in enumerate(sizes):
                if pos > 0 and pos + 4 + size > limit:
                    if i > start:
                        self._write(b"".join(pieces[2 * start : 2 * i]), i - start)
                        start = i
                    self._roll()
                    pos = 0
                pos += 4 + size
            if start:
                pieces = pieces[2 * start :]
                count -= start
        self._write(b"".join(pieces), count)
        if self._count >= self.sync_every or self._need_sync:
            self._request_sync()

    def _put_pieces(self, heads: list[bytes], bodies: list[bytes]) -> None:
        sizes = [len(h) + len(b) for h, b in zip(heads, bodies, strict=True)]
        lo, hi = self.min_msg_size, self.max_msg_size
        for size in sizes:
            if not lo <= size <= hi:
                raise ValueError(f"invalid message write size ({size}) maxMsgSize={hi}")
        self._check_open()
        # Records [start, i) go into the current file; a roll writes them first.
        start = 0
        pos = self._write_pos
        for i, size in enumerate(sizes):
            if pos > 0 and pos + 4 + size > self.max_bytes_per_file:
                if i > start:
                    self._write(_framed(heads, bodies, sizes, start, i), i - start)
                    start = i
                self._roll()
                pos = 0
            pos += 4 + size
        self._write(_framed(heads, bodies, sizes, start, len(sizes)), len(sizes) - start)
        if self._count >= self.sync_every or self._need_sync:
            self._request_sync()

    def read_many(
        self,
        max_count: int,
        max_bytes: int = 0,
        *,
        hold: bool = False,
        starts: list[tuple[int, int]] | None = None,
    ) -> list[bytes]:
        """Return up to ``max_count`` next records in FIFO order; they are consumed.

        Fewer records are returned when the queue runs dry, or once ``max_bytes`` (if nonzero) of
        records have been returned (always at least one). A crash after this returns loses the
        returned records (the depth and read position already moved past them), unless
        ``hold`` is given: then the new read position is not persisted and no consumed file is
        deleted until ``commit_reads``, so a crash before that makes the records come back. The
        caller moving records to another queue stores them there first, then commits.
        ``starts`` gets each record's (file number, position).
        """
        out: list[bytes] = []
        if self._closed or max_count <= 0:
            return out
        self._holding = hold
        nbytes = 0
        while len(out) < max_count and self._has_data():
            try:
                if self._rfd is None:
                    self._open_read_file()
                limit = self._read_limit()
            except OSError as exc:
                self._handle_read_error(str(exc))
                continue
            if self._read_pos >= limit:
                if self._read_file_num < self._write_file_num and self._read_pos == limit:
                    self._next_read_file()
                else:
                    self._handle_read_error(f"read position beyond end of data ({limit})")
                continue

            buf = self._rbuf
            base = self._rbuf_pos
            off = self._read_pos - base
            end = min(len(buf), limit - base)
            want = max_count - len(out)
            lo, hi = self.min_msg_size, self.max_msg_size
            unpack = _LEN.unpack_from
            append = out.append
            got = 0
            bad_size: int | None = None
            while got < want and off + 4 <= end:
                (size,) = unpack(buf, off)
                if size < lo or size > hi:
                    bad_size = size
                    break
                nxt = off + 4 + size
                if nxt > end:
                    break
                append(buf[off + 4 : nxt])
                if starts is not None:
                    starts.append((self._read_file_num, base + off))
                off = nxt
                got += 1
                if max_bytes:
                    nbytes += size
                    if nbytes >= max_bytes:  # the caller's byte budget is spent
                        want = got
                        max_count = len(out)
            if got:
                self._read_pos = base + off
                self._depth -= got
                self._count += got
                if off == len(buf):  # all consumed: don't keep up to 1 MiB per idle queue
                    self._rbuf = b""
                    self._rbuf_pos = self._read_pos
            if bad_size is not None:
                # the file is corrupt and nothing says where the next record begins
                self._handle_read_error(f"invalid message read size ({bad_size})")
                continue
            if got == want or self._read_pos >= limit:
                continue
            try:
                more = self._fill(limit)
            except OSError as exc:
                self._handle_read_error(str(exc))
                continue
            if not more:
                self._handle_read_error("unexpected EOF (truncated record)")
        self._after_read()
        return out

    def peek(self, max_count: int) -> list[bytes]:
        """Up to ``max_count`` of the next records, oldest first, left where they are: nothing
        moves, nothing is persisted (``GET /channel/peek``). Stops at a damaged record."""
        out: list[bytes] = []
        num, pos = self._read_file_num, self._read_pos
        while not self._closed and len(out) < max_count:
            if (num, pos) >= (self._write_file_num, self._write_pos):
                break
            try:
                fd = os.open(self._file_name(num), os.O_RDONLY | _O_CLOEXEC)
            except OSError:
                break
            try:
                limit = self._write_pos if num == self._write_file_num else os.fstat(fd).st_size
                while len(out) < max_count and pos + 4 <= limit:
                    (size,) = _LEN.unpack(os.pread(fd, 4, pos).rjust(4, b"\0"))
                    if not self.min_msg_size <= size <= self.max_msg_size or pos + 4 + size > limit:
                        return out
                    out.append(os.pread(fd, size, pos + 4))
                    pos += 4 + size
            except OSError:
                return out
            finally:
                os.close(fd)
            num, pos = num + 1, 0
        return out

    def commit_reads(self) -> None:
        """Make the reads done with ``hold=True`` final: delete the files they consumed and
        persist the read position (now with ``sync_every=1``, else as the op count says)."""
        self._holding = False
        removals, self._held_removals = self._held_removals, []
        for old in removals:
            try:
                os.remove(old)
            except OSError as exc:
                self._log.error("DISKQUEUE(%s) failed to Remove(%s) - %s", self.name, old, exc)
        if not self._closed and (self._need_sync or self._count >= self.sync_every):
            try:
                self._request_sync()
            except OSError as exc:
                self._log.error("DISKQUEUE(%s) failed to sync - %s", self.name, exc)

    def empty(self) -> None:
        """Delete all data files and the metadata file; go on with a new file number."""
        self._check_open()
        SYNCER.cancel(self._slot)
        self._log.info("DISKQUEUE(%s): emptying", self.name)
        first_err = self._skip_to_next_rw_file()
        try:
            os.remove(self._meta_file_name())
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._log.error("DISKQUEUE(%s) failed to remove metadata file - %s", self.name, exc)
            first_err = first_err or exc
        self._count = 0
        self._need_sync = False
        if first_err is not None:
            raise first_err

    def sync(self) -> None:
        """fsync the write file and write the metadata (tmp file, fsync, rename).

        A no-op once the queue is closed or deleted.
        """
        if self._closed:
            return
        SYNCER.cancel(self._slot)  # a waiting snapshot is older than this one
        if self._wfd is not None:
            try:
                os.fsync(self._wfd)
            except OSError:
                self._close_write_file()
                raise
        self._persist_metadata()
        self._need_sync = False
        self._slot.failed = False
        self._count = 0
        self.unpin()

    def sync_if_due(self, now: float) -> None:
        """The ``sync_timeout`` tick: sync if there was any operation since the last sync.

        ``now`` is the caller's clock reading, accepted so one timer can drive every queue; as in
        go-diskqueue's ticker the decision is only "was there activity". Raises ``OSError`` if
        the sync fails.
        """
        del now
        if not self._closed and (self._count > 0 or self._need_sync):
            self._request_sync()

    def take_sync_error(self) -> OSError | None:
        """Return and forget the error of the last failed background sync, if any."""
        return self._slot.take_error()

    def wait_background_sync(self) -> None:
        """Wait until the background sync asked for so far (if any) is done."""
        SYNCER.wait(self._slot)

    def _request_sync(self) -> None:
        """An op-count or timer sync: in the background when allowed, else now."""
        if not self._background or self._need_sync:
            self.sync()
            return
        fds: list[int] = []
        if self._wfd is not None:
            try:
                fds.append(os.dup(self._wfd))
            except OSError:  # out of descriptors: do it the slow way
                self.sync()
                return
        meta = self._meta()
        SYNCER.submit(self._slot, fds, lambda: self._write_metadata(*meta))
        self._count = 0

    def close(self) -> None:
        """Sync and close the files. Raises ``OSError`` if the final sync fails (files closed)."""
        if self._closed:
            return
        self._log.info("DISKQUEUE(%s): closing", self.name)
        try:
            if self._held_removals:
                self.commit_reads()
            if self._count == 0 and not self._need_sync:
                # Nothing since the last sync: once a background one asked for is done, the
                # files are as they should be (a thousand idle queues close without fsyncs).
                SYNCER.wait(self._slot)
                if not self._slot.failed:
                    return
            self.sync()
        finally:
            self._close_read_file()
            self._close_write_file()
            self._closed = True

    def delete(self) -> None:
        """Close without syncing and remove every data, metadata and tmp file of this queue.

        ``.bad`` files are left for the operator to inspect, as go-diskqueue does.
        """
        self._log.info("DISKQUEUE(%s): deleting", self.name)
        SYNCER.cancel(self._slot)
        self._close_read_file()
        self._close_write_file()
        self._closed = True
        meta = self._meta_file_name()
        meta_base = os.path.basename(meta)
        names = [meta]
        try:
            entries = os.listdir(self.data_path)
        except OSError:
            entries = []
        for entry in entries:
            if self._file_re.fullmatch(entry) or (
                entry.startswith(meta_base + ".") and entry.endswith(".tmp")
            ):
                names.append(os.path.join(self.data_path, entry))
        first_err: OSError | None = None
        for fn in names:
            err = self.remove_file(fn)
            first_err = first_err or err
        self._depth = 0
        if first_err is not None:
            raise first_err

    def remove_file(self, path: str) -> OSError | None:
        """Remove one of this queue's files (gone already: fine); a failure is logged and
        returned."""
        try:
            os.remove(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.file_failed("remove", path, exc)
            return exc
        return None

    def file_failed(self, what: str, path: str, err: OSError) -> None:
        """One of this queue's files could not be ``what`` (written, read, ...): one line."""
        self._log.error("DISKQUEUE(%s) failed to %s %s - %s", self.name, what, path, err)

    # -- file names -----------------------------------------------------------------------

    def _file_name(self, num: int) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.{num:06d}.dat")

    def _meta_file_name(self) -> str:
        return os.path.join(self.data_path, f"{self.name}.diskqueue.meta.dat")

    # -- startup ------------------------------------------------------------------------------

    def _load(self) -> None:
        meta = self._meta_file_name()
        try:
            with open(meta, "rb") as f:
                text = f.read()
        except FileNotFoundError:
            self._recover_from_data_files()
        except OSError as exc:
            self._log.error("DISKQUEUE(%s) failed to retrieveMetaData - %s", self.name, exc)
            self._recover_from_data_files()
        else:
            m = _META_RE.match(text)
            values = [int(g) for g in m.groups()] if m else []
            if not values or min(values[1:]) < 0:
                self._log.error(
                    "DISKQUEUE(%s) failed to retrieveMetaData - cannot parse %s: %r",
                    self.name,
                    meta,
                    text[:100],
                )
                self._recover_from_data_files()
                self._need_sync = True
            else:
                (
                    self._depth,
                    self._read_file_num,
                    self._read_pos,
                    self._write_file_num,
                    self._write_pos,
                ) = values
                reader = _READER_RE.match(text, m.end()) if m else None
                if reader is not None:
                    self.was_read = (int(reader.group(1)), int(reader.group(2)))
                self._check_write_file()
        self._check_tail_corruption()
        if self._need_sync:
            try:
                self.sync()
            except OSError as exc:
                self._log.error("DISKQUEUE(%s) failed to sync - %s", self.name, exc)

    def _existing_file_nums(self) -> list[int]:
        try:
            entries = os.listdir(self.data_path)
        except OSError:
            return []
        nums = []
        for entry in entries:
            m = self._file_re.fullmatch(entry)
            if m:
                nums.append(int(m.group(1)))
        return sorted(nums)

    def _recover_from_data_files(self) -> None:
        """No usable metadata: start fresh, unless data files exist, then serve them."""
        nums = self._existing_file_nums()
        if not nums:
            return
        depth = sum(self._count_records(self._file_name(n), 0) for n in nums)
        self._read_file_num = nums[0]
        self._read_pos = 0
        self._write_file_num = nums[-1] + 1
        self._write_pos = 0
        self._depth = depth
        self._need_sync = True
        self._log.warning(
            "DISKQUEUE(%s) no usable metadata but data files %06d..%06d exist, "
            "reading them (%d messages), writing to new file %06d",
            self.name,
            nums[0],
            nums[-1],
            depth,
            self._write_file_num,
        )

    def _check_write_file(self) -> None:
        """go-diskqueue #31: never write over data that the metadata does not know about."""
        fn = self._file_name(self._write_file_num)
        try:
            size = os.stat(fn).st_size
        except FileNotFoundError:
            if self._write_pos > 0:
                self._log.warning(
                    "DISKQUEUE(%s) %s missing but metadata writePos is %d, skipping to new file",
                    self.name,
                    fn,
                    self._write_pos,
                )
                self._skip_write_file()
            return
        except OSError as exc:
            self._log.error("DISKQUEUE(%s) failed to stat %s - %s", self.name, fn, exc)
            return
        if self._write_pos < size:
            extra = self._count_records(fn, self._write_pos)
            self._log.warning(
                "DISKQUEUE(%s) %s metadata writePos %d < file size of %d, skipping to new file "
                "(%d unsynced messages kept)",
                self.name,
                fn,
                self._write_pos,
                size,
                extra,
            )
            self._depth += extra
            self._skip_write_file()
        elif self._write_pos > size:
            self._log.warning(
                "DISKQUEUE(%s) %s metadata writePos %d > file size of %d, skipping to new file",
                self.name,
                fn,
                self._write_pos,
                size,
            )
            self._skip_write_file()

    def _skip_write_file(self) -> None:
        self._close_write_file()
        self._write_file_num += 1
        self._write_pos = 0
        self._need_sync = True

    def _count_records(self, path: str, start: int) -> int:
        """Count the intact records of a file from ``start`` up to the first bad one."""
        count = 0
        lo, hi = self.min_msg_size, self.max_msg_size
        try:
            with open(path, "rb", buffering=0) as f:
                f.seek(start)
                buf = b""
                off = 0
                while True:
                    chunk = f.read(_READ_CHUNK)
                    if not chunk:
                        break
                    buf = buf[off:] + chunk
                    off = 0
                    n = len(buf)
                    while off + 4 <= n:
                        (size,) = _LEN.unpack_from(buf, off)
                        if size < lo or size > hi:
                            return count
                        if off + 4 + size > n:
                            break
                        off += 4 + size
                        count += 1
        except OSError as exc:
            self._log.error("DISKQUEUE(%s) failed to scan %s - %s", self.name, path, exc)
        return count

    # -- writing ------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise OSError(f"DISKQUEUE({self.name}) is closed")

    def _roll(self) -> None:
        # as go-diskqueue: sync (the old file, and metadata naming the new one), then close
        self._write_file_num += 1
        self._write_pos = 0
        try:
            self.sync()
        except OSError as exc:
            self._log.error("DISKQUEUE(%s) failed to sync - %s", self.name, exc)
        self._close_write_file()

    def _write(self, data: bytes | list[bytes], n: int) -> None:
        """Write ``n`` whole records (in one buffer, or their pieces in order) at the write
        position."""
        if self._wfd is None:
            fn = self._file_name(self._write_file_num)
            try:
                self._wfd = os.open(fn, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o600)
            except OSError as exc:
                self._log.error("DISKQUEUE(%s) failed to open %s - %s", self.name, fn, exc)
                raise
            self._log.info("DISKQUEUE(%s): writeOne() opened %s", self.name, fn)
        fd = self._wfd
        pos = self._write_pos
        try:
            if isinstance(data, list):
                total = self._write_pieces(fd, data, pos)
            else:
                self._pwrite_all(fd, data, pos)
                total = len(data)
        except OSError as exc:
            self._log.error(
                "DISKQUEUE(%s) failed to write to %s - %s",
                self.name,
                self._file_name(self._write_file_num),
                exc,
            )
            with contextlib.suppress(OSError):
                os.ftruncate(fd, pos)  # leave no partial record behind
            self._close_write_file()
            raise
        self._write_pos = pos + total
        self._depth += n
        self._count += n

    def _write_pieces(self, fd: int, parts: list[bytes], pos: int) -> int:
        """Large messages go to the kernel from where they are, ``pwritev`` by ``pwritev``.
        Returns the bytes written."""
        written = 0
        for start in range(0, len(parts), _IOV_MAX):
            chunk = parts[start : start + _IOV_MAX]
            want = sum(map(len, chunk))
            done = os.pwritev(fd, chunk, pos + written)
            if done < want:  # short (the disk filling up, say): the rest byte by byte
                self._pwrite_all(fd, b"".join(chunk)[done:], pos + written + done)
            written += want
        return written

    def _pwrite_all(self, fd: int, data: bytes, pos: int) -> None:
        total = len(data)
        done = os.pwrite(fd, data, pos)
        if done < total:  # rare: a regular file short write (e.g. the disk just filled up)
            view = memoryview(data)
            while done < total:
                written = os.pwrite(fd, view[done:], pos + done)
                if written <= 0:
                    raise OSError(f"short write to {self._file_name(self._write_file_num)}")
                done += written

    def _close_write_file(self) -> None:
        if self._wfd is not None:
            fd, self._wfd = self._wfd, None
            with contextlib.suppress(OSError):
                os.close(fd)

    def _read_floor(self) -> tuple[int, int, int]:
        """The read position to persist, and the depth there."""
        floor = self.keep_from() if self.keep_from is not None else None
        if floor is None:
            return self._read_file_num, self._read_pos, self._depth
        return floor[0], floor[1], self._depth + floor[2]

    def _meta(self) -> tuple[bytes, tuple[int, int]]:
        """The metadata file's text, and the read position it stores."""
        num, pos, depth = self._read_floor()
        text = f"{depth}\n{num},{pos}\n{self._write_file_num},{self._write_pos}\n"
        if (num, pos) != (self._read_file_num, self._read_pos):
            # Where the reader stands, past the floor (Go's reader stops at the third line).
            text += f"{self._read_file_num},{self._read_pos}\n"
        return text.encode(), (num, pos)

    def _persist_metadata(self) -> None:
        self._write_metadata(*self._meta())

    def _write_metadata(self, text: bytes, read: tuple[int, int]) -> None:
        write_atomic(self._meta_file_name(), text)
        self.persisted_read = read

    def unpin(self) -> None:
        """Delete the consumed files the floor (``keep_from``) has passed, both as it is and
        as the metadata file last stored it (a restart reads from there)."""
        if not self._pinned:
            return
        floor = min(self._read_floor()[0], self.persisted_read[0])
        keep = []
        for num, fn in self._pinned:
            if num >= floor:
                keep.append((num, fn))
                continue
            try:
                os.remove(fn)
            except OSError as exc:
                self._log.error("DISKQUEUE(%s) failed to Remove(%s) - %s", self.name, fn, exc)
        self._pinned = keep

    # -- reading ------------------------------------------------------------------------------

    def _has_data(self) -> bool:
        return self._read_file_num < self._write_file_num or (
            self._read_file_num == self._write_file_num and self._read_pos < self._write_pos
        )

    def _open_read_file(self) -> None:
        fn = self._file_name(self._read_file_num)
        self._rfd = os.open(fn, os.O_RDONLY | _O_CLOEXEC)
        self._log.info("DISKQUEUE(%s): readOne() opened %s", self.name, fn)
        self._rbuf = b""
        self._rbuf_pos = self._read_pos
        self._read_end = None

    def _read_limit(self) -> int:
        """Where the data of the read file ends: writePos, or the real size of a completed file."""
        if self._read_file_num == self._write_file_num:
            return self._write_pos
        if self._read_end is None:
            assert self._rfd is not None
            self._read_end = os.fstat(self._rfd).st_size
        return self._read_end

    def _fill(self, limit: int) -> bool:
        """Read more of the read file into the buffer; False if there is nothing more."""
        assert self._rfd is not None
        rest = self._rbuf[self._read_pos - self._rbuf_pos :]
        need = 4 - len(rest)
        if need <= 0:
            need = 4 + _LEN.unpack_from(rest, 0)[0] - len(rest)
        file_off = self._read_pos + len(rest)
        size = min(max(_READ_CHUNK, need), limit - file_off)
        if size <= 0:
            return False
        data = os.pread(self._rfd, size, file_off)
        if not data:
            return False
        self._rbuf = rest + data
        self._rbuf_pos = self._read_pos
        return True

    def _close_read_file(self) -> None:
        self._rbuf = b""
        self._rbuf_pos = 0
        self._read_end = None
        if self._rfd is not None:
            fd, self._rfd = self._rfd, None
            with contextlib.suppress(OSError):
                os.close(fd)

    def _next_read_file(self) -> None:
        """The reader has consumed a completed file: delete it and go on with the next one."""
        old = self._file_name(self._read_file_num)
        self._close_read_file()
        self._read_file_num += 1
        self._read_pos = 0
        # sync every time we start reading from a new file
        self._need_sync = True
        if self.keep_from is not None:  # records read from it may not be done with yet
            self._pinned.append((self._read_file_num - 1, old))  # unpin() deletes it
            return
        if self._holding:  # the records read from it are not stored elsewhere yet
            self._held_removals.append(old)
            return
        try:
            os.remove(old)
        except OSError as exc:
            self._log.error("DISKQUEUE(%s) failed to Remove(%s) - %s", self.name, old, exc)

    def _after_read(self) -> None:
        # like moveForward: leave (and delete) a completed file as soon as its last record is read
        if self._rfd is not None and self._read_file_num < self._write_file_num:
            try:
                at_end = self._read_pos == self._read_limit()
            except OSError:
                at_end = False  # the next read_many handles it
            if at_end:
                self._next_read_file()
        self._check_tail_corruption()
        if self._holding:
            return  # commit_reads persists the read position
        if self._need_sync or self._count >= self.sync_every:
            try:
                self._request_sync()
            except OSError as exc:
                self._log.error("DISKQUEUE(%s) failed to sync - %s", self.name, exc)

    def _handle_read_error(self, reason: str) -> None:
        """Rename the read file to .bad and jump to the next file (go-diskqueue handleReadError)."""
        bad_fn = self._file_name(self._read_file_num)
        self._log.error(
            "DISKQUEUE(%s) reading at %d of %s - %s", self.name, self._read_pos, bad_fn, reason
        )
        self._close_read_file()
        if self._read_file_num == self._write_file_num:
            # the current write file cannot be trusted either: write to a new one
            self._close_write_file()
            self._write_file_num += 1
            self._write_pos = 0
        bad_rename_fn = bad_fn + ".bad"
        self._log.warning(
            "DISKQUEUE(%s) jump to next file and saving bad file as %s", self.name, bad_rename_fn
        )
        try:
            os.replace(bad_fn, bad_rename_fn)
        except OSError as exc:
            self._log.error(
                "DISKQUEUE(%s) failed to rename bad diskqueue file %s to %s - %s",
                self.name,
                bad_fn,
                bad_rename_fn,
                exc,
            )
        self._read_file_num += 1
        self._read_pos = 0
        self._need_sync = True
        self._check_tail_corruption()

    def _check_tail_corruption(self) -> None:
        if self._has_data():
            return
        # we've reached the end of the queue: if depth isn't 0 something went wrong
        if self._depth < 0:
            self._log.error(
                "DISKQUEUE(%s) negative depth at tail (%d), metadata corruption, resetting 0...",
                self.name,
                self._depth,
            )
        elif self._depth > 0:
            self._log.error(
                "DISKQUEUE(%s) positive depth at tail (%d), data loss, resetting 0...",
                self.name,
                self._depth,
            )
        if self._depth != 0:
            self._depth = 0
            self._need_sync = True
        if self._read_file_num != self._write_file_num or self._read_pos != self._write_pos:
            if self._read_file_num > self._write_file_num:
                self._log.error(
                    "DISKQUEUE(%s) readFileNum > writeFileNum (%d > %d), corruption, "
                    "skipping to next writeFileNum and resetting 0...",
                    self.name,
                    self._read_file_num,
                    self._write_file_num,
                )
            if self._read_pos > self._write_pos:
                self._log.error(
                    "DISKQUEUE(%s) readPos > writePos (%d > %d), corruption, "
                    "skipping to next writeFileNum and resetting 0...",
                    self.name,
                    self._read_pos,
                    self._write_pos,
                )
            self._skip_to_next_rw_file()
            self._need_sync = True

    def _skip_to_next_rw_file(self) -> OSError | None:
        self._close_read_file()
        self._close_write_file()
        first_err: OSError | None = None
        pinned, self._pinned = self._pinned, []
        for _num, fn in pinned:
            with contextlib.suppress(OSError):
                os.remove(fn)
        for num in range(self._read_file_num, self._write_file_num + 1):
            fn = self._file_name(num)
            try:
                os.remove(fn)
            except FileNotFoundError:
                pass
            except OSError as exc:
                self._log.error("DISKQUEUE(%s) failed to remove data file - %s", self.name, exc)
                first_err = first_err or exc
        self._write_file_num = max(self._read_file_num, self._write_file_num) + 1
        self._write_pos = 0
        self._read_file_num = self._write_file_num
        self._read_pos = 0
        self._depth = 0
        return first_err


def _framed(
    heads: list[bytes], bodies: list[bytes], sizes: list[int], start: int, end: int
) -> list[bytes]:
    """Records ``start..end`` as the pieces of their frames: length, head, body."""
    pack = _LEN.pack
    out: list[bytes] = []
    for i in range(start, end):
        out += (pack(sizes[i]), heads[i], bodies[i])
    return out
