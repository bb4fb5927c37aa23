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
of 23-byte records ``[uint32 generation][kind][int64 file][int64 position][uint16 attempts]``:
``D`` done, ``A`` a delivery past the first, with the attempts it made. Where the reader stood
goes with the floor into the queue's metadata file, as a fourth line that Go's reader ignores.
After a restart the queue reads again from the floor: a record marked done is skipped, and one
read before the crash (before where the reader stood) comes back with its ID and its attempts
counted (its first delivery, and any ``A`` after it; one read and not yet delivered, a rare
case, counts one attempt too many). The side file is written without fsync (the page cache
outlives a killed process); after a power loss a done mark may be missing, which delivers a
finished message again (never loses one), and an attempt may go uncounted. Records are written
in place ahead of zeros, so an append never changes the file's size (see "the side file"
below). It is emptied (a new generation) once nothing read is outstanding and the queue's
metadata is at its reader, and rewritten without what the persisted floor has passed once it
holds more than ``_SLACK`` records. No fsync is added to the delivery path: the floor is
persisted with the queue's own metadata writes.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
from collections import OrderedDict
from collections.abc import Callable
from itertools import repeat
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, cast

from ..core.message import Message, decode_message
from .atomic import write_atomic

if TYPE_CHECKING:
    from .diskqueue import DiskQueue

_REC = struct.Struct(">IcqqH")  # generation, kind, file number, position, attempts
_DONE = b"D"
_TRIED = b"A"
_KINDS = (_DONE, _TRIED)
#: The side file is zero-filled ahead of its records this much at a time.
_CHUNK = 64 * 1024
#: Records in the side file before it is rewritten without the stale ones.
_SLACK = 65536
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

Position = tuple[int, int]
_ID = attrgetter("id")
_POSITION = itemgetter(0)


class InFlightJournal:
    """``core.backend.InFlightKeeper`` for one channel's ``DiskQueue``."""

    __slots__ = (
        "_cap",
        "_done",
        "_dups",
        "_failing",
        "_fd",
        "_gen",
        "_limit",
        "_map",
        "_marked",
        "_note_due",
        "_out",
        "_records",
        "_seq",
        "_tried",
        "_tries",
        "_was_read",
        "dq",
        "path",
    )

    def __init__(self, dq: DiskQueue, note_due: Callable[[list[tuple[bytes, int]]], None]) -> None:
        self.dq = dq
        #: Stores a wall-clock due time for an id (the backend's due-time file).
        self._note_due = note_due
        self.path = os.path.join(dq.data_path, f"{dq.name}.diskqueue.inflight.dat")
        #: Records read and not done with, in read order: id -> (position, read sequence).
        self._out: OrderedDict[bytes, tuple[Position, int]] = OrderedDict()
        #: A second copy of an id outstanding (a rare case: a crash's or a rewind's copy).
        self._dups: dict[bytes, list[tuple[Position, int]]] = {}
        self._seq = 0  # records read so far, skipped ones included
        #: From the side file at start: records done with, to skip; attempts made.
        self._done: set[Position] = set()
        self._tries: dict[Position, int] = {}
        #: Where the reader stood before the restart (the queue's metadata says).
        self._was_read: Position = dq.was_read or (-1, -1)
        #: What the side file holds now that may still count: the positions marked done, and
        #: the attempts of redeliveries (a rewrite keeps those the stored floor has not passed).
        self._marked: list[Position] = []
        self._tried: dict[bytes, tuple[Position, int]] = {}
        self._failing = False  # the side file's last write failed (logged once)
        self._fd: int | None = None
        self._map: mmap.mmap | None = None  # the side file, written through this mapping
        self._cap = 0  # bytes of the side file, records and zeros ahead of them
        self._gen = 0  # the generation its records carry now
        self._records = 0
        self._limit = _SLACK
        self._load()
        dq.keep_from = self.floor

    # -- the queue's side ---------------------------------------------------------------

    def floor(self) -> tuple[int, int, int] | None:
        """The first record not done with, and how many records were read from it on."""
        if not self._out:
            if not self._dups:
                return None
            pos, seq = min(e for lst in self._dups.values() for e in lst)
        else:
            pos, seq = next(iter(self._out.values()))
            if self._dups:
                pos, seq = min([(pos, seq), *(e for lst in self._dups.values() for e in lst)])
        return pos[0], pos[1], self._seq - seq

    def read(self, records: list[bytes], starts: list[Position]) -> list[Message]:
        """Records just read: those done with before a restart are skipped; the others are
        outstanding until ``settled``, with the attempts a delivery before it made."""
        if not records:
            if not self._out and not self._dups:
                self._emptied()
            return []
        seq = self._seq
        n = len(records)
        if not self._done and starts[0] >= self._was_read:
            # The common case, in C loops: nothing to skip or count, no second copy of an id.
            msgs = list(map(decode_message, records))
            ids = list(map(_ID, msgs))
            track = self._out
            if track.keys().isdisjoint(ids) and len(set(ids)) == n:
                track.update(zip(ids, zip(starts, range(seq, seq + n), strict=True), strict=True))
                self._seq = seq + n
                return msgs
        return self._read_slowly(records, starts)

    def _read_slowly(self, records: list[bytes], starts: list[Position]) -> list[Message]:
        out: list[Message] = []
        done = self._done
        tries = self._tries
        track = self._out
        was_read = self._was_read
        seq = self._seq
        for rec, pos in zip(records, starts, strict=True):
            if done and pos in done:
                done.discard(pos)
                seq += 1
                continue
            msg = decode_message(rec)
            if pos < was_read:  # delivered (or deferred) before the restart
                msg.attempts = max(msg.attempts + 1, tries.pop(pos, 0) if tries else 0)
            if msg.id in track:
                self._dups.setdefault(msg.id, []).append((pos, seq))
            else:
                track[msg.id] = (pos, seq)
            seq += 1
            out.append(msg)
        self._seq = seq
        if not track and not self._dups:
            self._emptied()
        return out

    # -- the channel's side (``core.backend.InFlightKeeper``) ------------------------------

    def delivered(self, msgs: list[Message]) -> None:
        out = self._out
        recs = []
        for m in msgs:
            if m.attempts < 2:
                continue  # a first delivery: where the reader stood covers it
            entry = out.get(m.id)
            if entry is not None:
                pos = entry[0]
                self._tried[m.id] = (pos, m.attempts)
                recs.append(_REC.pack(self._gen, _TRIED, pos[0], pos[1], min(m.attempts, 0xFFFF)))
        if recs:
            self._append(recs)

    def deferred(self, msg_id: bytes, due_ns: int) -> None:
        if msg_id in self._out or msg_id in self._dups:
            self._note_due([(msg_id, due_ns)])

    def settled(self, ids: list[bytes]) -> None:
        popped = list(map(self._out.pop, ids, repeat(None)))  # a C loop
        if None in popped:
            popped = [
                e if e is not None else self._settle_dup(i)
                for i, e in zip(ids, popped, strict=True)
            ]
        entries = cast(
            "list[tuple[Position, int]]",
            [e for e in popped if e is not None] if None in popped else popped,
        )
        if not entries:
            return  # not read from this queue (lent, published deferred, ...)
        positions: list[Position] = list(map(_POSITION, entries))
        self._marked += positions
        nums, poss = zip(*positions, strict=True)
        gen = self._gen
        self._append(list(map(_REC.pack, repeat(gen), repeat(_DONE), nums, poss, repeat(0))))
        if self._tried:
            for i in ids:
                self._tried.pop(i, None)
        if not self._out and not self._dups:
            self._emptied()
        self.dq.unpin()

    def _settle_dup(self, msg_id: bytes) -> tuple[Position, int] | None:
        lst = self._dups.get(msg_id)
        if not lst:
            return None
        entry = lst.pop(0)
        if not lst:
            del self._dups[msg_id]
        return entry

    # -- the side file ----------------------------------------------------------------------
    #
    # Records are written in place, through a shared mapping of a file zero-filled ahead of
    # them (``_cap`` bytes): an append changes neither the file's size nor (but once per page
    # written back) its times, so the fsyncs of the queue's own files (ext4 journals every
    # inode changed meanwhile) carry nothing of this one. A write(2) per FIN batch cost the
    # durable writer+reader about 15% that way. Emptying it is a new generation written from the
    # start: a record of an older generation after the newest ones ends the file.

    def _emptied(self) -> None:
        """Nothing outstanding: no done mark is needed once the metadata is at the reader."""
        if self._records and self.dq.persisted_read == self.dq.read_position():
            self._gen = (self._gen + 1) & 0xFFFFFFFF
            self._records = 0
            self._limit = _SLACK
            self._marked.clear()
            self._tried.clear()

    def _append(self, recs: list[bytes]) -> None:
        if self._records + len(recs) > self._limit:
            self._compact()
        data = b"".join(recs)
        at = self._records * _REC.size
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | _O_CLOEXEC, 0o600)
                self._cap = os.fstat(self._fd).st_size
            if at + len(data) > self._cap or self._map is None:
                self._grow(at + len(data))
            assert self._map is not None
            self._map[at : at + len(data)] = data
            self._records += len(recs)
            if self._failing:
                self._failing = False
                self.dq._log.info("DISKQUEUE(%s): writing %s again", self.dq.name, self.path)
        except OSError as exc:  # a full disk: after a crash these would come back twice
            if not self._failing:  # one line until it works again
                self._failing = True
                self.dq._log.error(
                    "DISKQUEUE(%s) failed to write %s (after a crash, messages finished "
                    "meanwhile may be delivered again) - %s",
                    self.dq.name,
                    self.path,
                    exc,
                )
            self._close_fd()

    def _grow(self, end: int) -> None:
        """Zeros written ahead to at least ``end``, and the file mapped again."""
        assert self._fd is not None
        if self._map is not None:
            self._map.close()
            self._map = None
        if end > self._cap:
            cap = -(-max(end, 2 * self._cap, _CHUNK) // _CHUNK) * _CHUNK
            _write_all(self._fd, bytes(cap - self._cap), self._cap)
            self._cap = cap
        self._map = mmap.mmap(self._fd, self._cap)

    def _compact(self) -> None:
        """Rewrite the side file with only the done marks the stored floor has not passed and
        the attempts of records still outstanding."""
        floor = self.dq.persisted_read
        self._marked = [p for p in self._marked if p >= floor]
        g = self._gen
        keep = [_REC.pack(g, _DONE, n, p, 0) for n, p in self._marked]
        keep += [_REC.pack(g, _TRIED, n, p, min(t, 0xFFFF)) for (n, p), t in self._tried.values()]
        keep += [_REC.pack(g, _TRIED, n, p, t) for (n, p), t in self._tries.items()]
        self._rewrite(keep)
        # Rewritten at most once per _SLACK records appended, however many stay live.
        self._limit = max(_SLACK, 2 * self._records)

    def _rewrite(self, recs: list[bytes]) -> None:
        """The side file replaced by ``recs``, zeros ahead of them (opened again at the next
        append)."""
        self._close_fd()
        data = b"".join(recs)
        cap = -(-max(2 * len(data), _CHUNK) // _CHUNK) * _CHUNK
        try:
            write_atomic(self.path, data + bytes(cap - len(data)))
        except OSError as exc:  # the old file stays: only stale marks are kept longer
            self.dq.file_failed("write", self.path, exc)
            return
        self._records = len(recs)

    def _remove(self) -> None:
        self._close_fd()
        self.dq.remove_file(self.path)
        self._gen = (self._gen + 1) & 0xFFFFFFFF
        self._records = 0
        self._cap = 0
        self._limit = _SLACK

    def _read_file(self) -> bytes:
        try:
            with open(self.path, "rb") as f:
                return f.read()
        except FileNotFoundError:
            return b""
        except OSError as exc:
            self.dq.file_failed("read", self.path, exc)
            return b""

    def _load(self) -> None:
        data = self._read_file()
        floor = self.dq.read_position()
        gen = None
        for off in range(0, len(data) - _REC.size + 1, _REC.size):  # a torn last one is left
            g, kind, num, pos, tries = _REC.unpack_from(data, off)
            if gen is None:
                gen = g
            if g != gen or kind not in _KINDS:
                break  # the zeros ahead, or an older generation: the end
            if (num, pos) < floor:
                continue
            if kind == _DONE:
                self._done.add((num, pos))
            else:
                self._tries[(num, pos)] = max(tries, self._tries.get((num, pos), 0))
        self._gen = 0 if gen is None else (gen + 1) & 0xFFFFFFFF
        if self._done or self._tries:
            self._marked = list(self._done)
            g = self._gen
            self._rewrite(
                [_REC.pack(g, _DONE, n, p, 0) for n, p in self._done]
                + [_REC.pack(g, _TRIED, n, p, t) for (n, p), t in self._tries.items()]
            )
        elif data:
            self._remove()

    def _close_fd(self) -> None:
        if self._map is not None:
            with contextlib.suppress(OSError, ValueError):
                self._map.close()
            self._map = None
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    # -- the backend's life -------------------------------------------------------------------

    def close(self) -> None:
        """A clean stop, after the channel stored again what it held: with nothing
        outstanding, the metadata goes to the reader and the side file away."""
        if not self._out and not self._dups:
            if self.dq.persisted_read != self.dq.read_position():
                with contextlib.suppress(OSError):
                    self.dq.sync()
            if self.dq.persisted_read == self.dq.read_position():
                self._remove()
        elif self._fd is not None:
            with contextlib.suppress(OSError, ValueError):
                if self._map is not None:
                    self._map.flush()
                os.fsync(self._fd)
        self._close_fd()

    def clear(self) -> None:
        """The queue is emptied: nothing read is outstanding any more."""
        self._out.clear()
        self._dups.clear()
        self._marked.clear()
        self._tried.clear()
        self._done.clear()
        self._tries.clear()
        self._remove()


def _write_all(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, at)
        view = view[n:]
        at += n
