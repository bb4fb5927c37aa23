"""A channel's messages read from its disk queue and not yet done with (``--mem-queue-size=0``):
kept on disk until they are, so that a kill -9 loses none in flight, deferred or timed out.

Theory of operation. With ``--mem-queue-size=0`` every message of a channel passes through its
disk queue (``storage/diskqueue.py``). go-diskqueue moves its read position past a record as
soon as the record is read: a message delivered and not finished then lives only in memory,
and a crash loses it (Go nsqd too: nsqio/nsq#1142, #1386). Here the read position the queue
persists is the **floor**: the first record read that is not yet done with, and the queue keeps
its files from there (``DiskQueue.keep_from``). A record is done with when its message is
finished, or stored again (a requeue, a timeout, a consumer leaving, a clean exit), or dropped
by the channel (expired, dead-lettered, unsampled).

Records done with beyond the floor are named in a side file, ``<name>.diskqueue.inflight.dat``,
of 19-byte records ``[kind][int64 file][int64 position][uint16 attempts]``: ``D`` done, ``R``
where the reader stood after a read (one per read, not per message), ``A`` a delivery past the
first, with the attempts it made. After a restart the queue reads again from the floor: a
record marked done is skipped, and one read before the crash (before the last ``R``) comes back
with its ID and its attempts counted (its first delivery, and any ``A`` after it; one read and
not yet delivered, a rare case, counts one attempt too many). The side file is appended without
fsync (the page cache outlives a killed process); after a power loss a done mark may be
missing, which delivers a finished message again (never loses one), and an attempt may go
uncounted. It is emptied once nothing read is outstanding and the queue's metadata is at its
reader, and rewritten without what the persisted floor has passed once it holds more than
``_SLACK`` records. No fsync is added to the delivery path: the floor is persisted with the
queue's own metadata writes.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections import OrderedDict
from collections.abc import Container, Iterable
from typing import TYPE_CHECKING

from ..core.message import Message, decode_message

if TYPE_CHECKING:
    from .diskqueue import DiskQueue

_REC = struct.Struct(">cqqH")
_DONE = b"D"
_TRIED = b"A"
_READ = b"R"
#: Records in the side file before it is rewritten without the stale ones.
_SLACK = 65536
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

Position = tuple[int, int]


class InFlightJournal:
    """``core.backend.InFlightKeeper`` for one channel's ``DiskQueue``."""

    __slots__ = (
        "_at",
        "_done",
        "_fd",
        "_limit",
        "_out",
        "_records",
        "_seq",
        "_tries",
        "_was_read",
        "dq",
        "path",
    )

    def __init__(self, dq: DiskQueue) -> None:
        self.dq = dq
        self.path = os.path.join(dq.data_path, f"{dq.name}.diskqueue.inflight.dat")
        #: Records read and not done with, in read order: position -> (id, read sequence).
        self._out: OrderedDict[Position, tuple[bytes, int]] = OrderedDict()
        #: id -> its positions outstanding (two only for a second copy of an id).
        self._at: dict[bytes, list[Position]] = {}
        self._seq = 0  # records read so far, skipped ones included
        #: From the side file at start: records done with, to skip; attempts made.
        self._done: set[Position] = set()
        self._tries: dict[Position, int] = {}
        self._was_read: Position = (-1, -1)  # where the reader stood before the restart
        self._fd: int | None = None
        self._records = 0
        self._limit = _SLACK
        self._load()
        dq.keep_from = self.floor

    # -- the queue's side ---------------------------------------------------------------

    def floor(self) -> tuple[int, int, int] | None:
        """The first record not done with, and how many records were read from it on."""
        if not self._out:
            return None
        (num, pos), (_id, seq) = next(iter(self._out.items()))
        return num, pos, self._seq - seq

    def read(self, records: list[bytes], starts: list[Position]) -> list[Message]:
        """Records just read: those done with before a restart are skipped; the others are
        outstanding until ``settled``, with the attempts a delivery before it made."""
        out: list[Message] = []
        done = self._done
        tries = self._tries
        track = self._out
        at = self._at
        for rec, pos in zip(records, starts, strict=True):
            seq = self._seq
            self._seq = seq + 1
            if done and pos in done:
                done.discard(pos)
                continue
            msg = decode_message(rec)
            if pos < self._was_read:  # delivered (or deferred) before the restart
                msg.attempts = max(msg.attempts + 1, tries.pop(pos, 0) if tries else 0)
            track[pos] = (msg.id, seq)
            got = at.get(msg.id)
            if got is None:
                at[msg.id] = [pos]
            else:
                got.append(pos)
            out.append(msg)
        if out:
            self._append([_REC.pack(_READ, *self.dq.read_position(), 0)])
        elif not track:
            self._emptied()
        return out

    # -- the channel's side (``core.backend.InFlightKeeper``) ------------------------------

    def delivered(self, msgs: list[Message]) -> None:
        at = self._at
        pack = _REC.pack
        recs = []
        for m in msgs:
            if m.attempts < 2:
                continue  # a first delivery: the R record covers it
            where = at.get(m.id)
            if where is not None:
                recs.append(pack(_TRIED, where[0][0], where[0][1], min(m.attempts, 0xFFFF)))
        if recs:
            self._append(recs)

    def settled(self, ids: Iterable[bytes]) -> None:
        at = self._at
        out = self._out
        pack = _REC.pack
        recs = []
        for i in ids:
            where = at.get(i)
            if where is None:
                continue  # not read from this queue (lent, published deferred, ...)
            pos = where.pop(0)
            if not where:
                del at[i]
            del out[pos]
            recs.append(pack(_DONE, pos[0], pos[1], 0))
        if not recs:
            return
        self._append(recs)
        if not out:
            self._emptied()
        self.dq.unpin()

    # -- the side file ----------------------------------------------------------------------

    def _emptied(self) -> None:
        """Nothing outstanding: no done mark is needed once the metadata is at the reader."""
        if self._records and self.dq.persisted_read == self.dq.read_position():
            self._truncate()

    def _append(self, recs: list[bytes]) -> None:
        if self._records + len(recs) > self._limit:
            self._compact()
        data = b"".join(recs)
        try:
            if self._fd is None:
                self._fd = os.open(
                    self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | _O_CLOEXEC, 0o600
                )
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            self._records += len(recs)
        except OSError as exc:  # a full disk: after a crash these would come back twice
            self.dq._log.error(
                "DISKQUEUE(%s) failed to write %s - %s", self.dq.name, self.path, exc
            )
            self._close_fd()

    def _compact(self) -> None:
        """Rewrite the side file without the marks the persisted floor has passed and the
        attempts of records no longer outstanding."""
        floor = self.dq.persisted_read
        out = self._out
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError:
            data = b""
        keep = [
            data[off : off + _REC.size]
            for off in range(0, len(data) - _REC.size + 1, _REC.size)
            if _keep(_REC.unpack_from(data, off), floor, out)
        ]
        keep.append(_REC.pack(_READ, *self.dq.read_position(), 0))
        self._rewrite(keep)
        # Rewritten at most once per _SLACK records appended, however many stay live.
        self._limit = max(_SLACK, 2 * self._records)

    def _rewrite(self, recs: list[bytes]) -> None:
        self._close_fd()
        tmp = f"{self.path}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o600)
            try:
                view = memoryview(b"".join(recs))
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            self._records = len(recs)
        except OSError as exc:  # the old file stays: only stale marks are kept longer
            self.dq._log.error(
                "DISKQUEUE(%s) failed to write %s - %s", self.dq.name, self.path, exc
            )
            with contextlib.suppress(OSError):
                os.remove(tmp)

    def _truncate(self) -> None:
        self._close_fd()
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self.dq._log.error(
                "DISKQUEUE(%s) failed to remove %s - %s", self.dq.name, self.path, exc
            )
            return
        self._records = 0
        self._limit = _SLACK

    def _load(self) -> None:
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            self.dq._log.error("DISKQUEUE(%s) failed to read %s - %s", self.dq.name, self.path, exc)
            return
        floor = self.dq.read_position()
        for off in range(0, len(data) - _REC.size + 1, _REC.size):  # a torn last one is left
            kind, num, pos, tries = _REC.unpack_from(data, off)
            if (num, pos) < floor:
                continue
            if kind == _READ:
                self._was_read = max(self._was_read, (num, pos))
            elif kind == _DONE:
                self._done.add((num, pos))
            elif kind == _TRIED:
                self._tries[(num, pos)] = max(tries, self._tries.get((num, pos), 0))
        if self._done or self._tries or self._was_read > floor:
            self._rewrite(
                [_REC.pack(_DONE, n, p, 0) for n, p in self._done]
                + [_REC.pack(_TRIED, n, p, t) for (n, p), t in self._tries.items()]
                + [_REC.pack(_READ, *self._was_read, 0)]
            )
        else:
            self._truncate()

    def _close_fd(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    # -- the backend's life -------------------------------------------------------------------

    def close(self) -> None:
        """A clean stop, after the channel stored again what it held: with nothing
        outstanding, the metadata goes to the reader and the side file away."""
        if not self._out:
            if self.dq.persisted_read != self.dq.read_position():
                with contextlib.suppress(OSError):
                    self.dq.sync()
            self._emptied()
        elif self._fd is not None:
            with contextlib.suppress(OSError):
                os.fsync(self._fd)
        self._close_fd()

    def clear(self) -> None:
        """The queue is emptied: nothing read is outstanding any more."""
        self._out.clear()
        self._at.clear()
        self._done.clear()
        self._tries.clear()
        self._truncate()

    def delete(self) -> None:
        self.clear()


def _keep(rec: tuple[bytes, int, int, int], floor: Position, out: Container[Position]) -> bool:
    kind, num, pos, _tries = rec
    if kind == _DONE:
        return (num, pos) >= floor
    return kind == _TRIED and (num, pos) in out  # the newest R is written anew
