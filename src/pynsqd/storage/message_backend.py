"""The disk backend of a topic or channel: messages encoded into a go-diskqueue.

Deferred messages keep their due time (nsqio/nsq#1107) without changing the queue's
format. The message goes into the go-diskqueue like any other; its id and wall-clock due time go to
a side file ``<name>.diskqueue.deferred.dat`` of 24-byte records ``[16-byte id][int64 BE due ns]``,
appended, the last record for an id winning. Go nsqd never opens that file: it reads the queue as
its own and delivers such messages at once, as it would itself. When a read meets a message whose
id has a due time still in the future, the message is not returned but handed, decoded and with
``defer_until_ns`` set, to ``on_deferred`` (the channel's deferred queue, or the topic's fan-out);
a due time already past is simply dropped. This costs nothing while no due time is stored. The side
file is written before the record (a crash leaves at worst an unused due time), fsynced at once
with ``sync_every=1`` and at ``close`` otherwise (an OS crash may then make such a message early,
never lost), removed when no due time is left, and rewritten when mostly stale.
"""

from __future__ import annotations

import contextlib
import os
import struct
import time
from collections.abc import Callable
from typing import TypeVar

from ..core.message import MAX_DEFER_NS, Message, decode_message, disk_frames
from .diskqueue import DiskQueue
from .in_flight_journal import InFlightJournal

_DUE = struct.Struct(">16sq")
_T = TypeVar("_T", bytes, Message)


def _record_id(rec: bytes) -> bytes:
    return rec[10:26]


def _message_id(msg: Message) -> bytes:
    return msg.id


def _same(msg: Message) -> Message:
    return msg


#: bodies from this size are written as they are, beside their header (DiskQueue.put_many)
_SPLIT_BODY = 2048
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
#: Stale side-file records tolerated before a rewrite: records > 2 x live + this.
_DUE_SLACK = 4096


class DiskBackend:
    """``core.backend.BackendQueue`` over a ``DiskQueue``, in nsqd's message encoding."""

    __slots__ = (
        "_due",
        "_due_dirty",
        "_due_fd",
        "_due_path",
        "_due_records",
        "_failing",
        "dq",
        "journal",
        "on_deferred",
        "on_write",
    )

    def __init__(self, dq: DiskQueue, *, keep_in_flight: bool = False) -> None:
        self.dq = dq
        #: A channel's messages read and not yet done with, kept on disk until they are
        #: (``--mem-queue-size=0``; ``storage/in_flight_journal.py``). None: as go-diskqueue.
        self.journal = InFlightJournal(dq, self._add_due) if keep_in_flight else None
        #: Told of a failed write (the error) and of the first good write after one (None):
        #: nsqd's health follows its backends' writes.
        self.on_write: Callable[[OSError | None], None] | None = None
        self._failing = False
        #: Receives messages read back whose due time is in the future (one batch per read).
        self.on_deferred: Callable[[list[Message]], None] | None = None
        self._due: dict[bytes, int] = {}
        self._due_path = os.path.join(dq.data_path, f"{dq.name}.diskqueue.deferred.dat")
        self._due_fd: int | None = None
        self._due_records = 0  # records in the side file, live or stale
        self._due_dirty = False
        self._load_due()

    # -- BackendQueue -------------------------------------------------------------------------

    def put_many(self, msgs: list[Message]) -> None:
        due = [(m.id, m.defer_until_ns) for m in msgs if m.defer_until_ns]
        if due:
            self._add_due(due)
        if not msgs:
            return
        dq = self.dq
        if msgs[0].size >= _SPLIT_BODY:
            # Large bodies are written from the messages themselves: no record built per message.
            heads, bodies = [m.encode_head() for m in msgs], [m.body for m in msgs]
            self._put(lambda: dq.put_many(heads, bodies))
        else:
            pieces, sizes = disk_frames(msgs)
            self._put(lambda: dq.put_framed(pieces, sizes))

    def _put(self, write: Callable[[], None]) -> None:
        """``write`` to the queue; nsqd's health hears of a failed write and of the first good
        one after it."""
        try:
            write()
        except OSError as err:
            self._failing = True
            if self.on_write is not None:
                self.on_write(err)
            raise
        if self._failing:
            self._failing = False
            if self.on_write is not None:
                self.on_write(None)

    def read_many(self, max_count: int, max_bytes: int = 0) -> list[Message]:
        if self.journal is None:
            return list(map(decode_message, self.read_raw(max_count, max_bytes)))
        out: list[Message] = []
        while len(out) < max_count:
            starts: list[tuple[int, int]] = []
            # Held: the read position is persisted only once the journal has the records
            # (at commit_reads, as their floor), so no crash instant loses one.
            records = self.dq.read_many(max_count - len(out), max_bytes, hold=True, starts=starts)
            msgs = self.journal.read(records, starts)
            self.dq.commit_reads()
            self.dq.unpin()
            if not records:
                break
            if self._due and self.on_deferred is not None:
                msgs = self._keep_deferred_messages(msgs)
            out += msgs
            if max_bytes and out:
                break
        return out

    def put_raw(self, records: list[bytes]) -> None:
        # Records from another backend's read_raw, which kept the deferred ones out.
        self._put(lambda: self.dq.put_many(records))

    def read_raw(self, max_count: int, max_bytes: int = 0, *, hold: bool = False) -> list[bytes]:
        assert self.journal is None, "a channel's kept queue is read by read_many"
        if not self._due or self.on_deferred is None:
            return self.dq.read_many(max_count, max_bytes, hold=hold)
        out: list[bytes] = []
        while len(out) < max_count:
            records = self.dq.read_many(max_count - len(out), max_bytes, hold=hold)
            if not records:
                break
            out += self._keep_deferred(records)
            if max_bytes and out:
                break  # a byte-bounded read stops at its first plain records
            if not self._due:
                out += self.dq.read_many(max_count - len(out), hold=hold)
                break
        return out

    def commit_reads(self) -> None:
        self.dq.commit_reads()

    def peek(self, max_count: int) -> list[Message]:
        return list(map(decode_message, self.dq.peek(max_count)))

    def byte_size(self) -> int:
        return self.dq.byte_size()

    def depth(self) -> int:
        return self.dq.depth()

    def empty(self) -> None:
        self._drop_due()
        if self.journal is not None:
            self.journal.clear()
        self.dq.empty()

    def close(self) -> None:
        try:
            if self._due_fd is not None and self._due_dirty:
                os.fsync(self._due_fd)
        except OSError as exc:
            self.dq.file_failed("sync", self._due_path, exc)
        finally:
            self._close_due_fd()
            if self.journal is not None:
                self.journal.close()
            self.dq.close()

    def delete(self) -> None:
        self._drop_due()
        if self.journal is not None:
            self.journal.clear()
        self.dq.delete()

    # -- for nsqd's sync timer ------------------------------------------------------------------

    def sync_if_due(self, now: float) -> None:
        self.dq.sync_if_due(now)

    def take_sync_error(self) -> OSError | None:
        return self.dq.take_sync_error()

    # -- due times ----------------------------------------------------------------------------

    def _keep_deferred(self, records: list[bytes]) -> list[bytes]:
        """Hand the records with a future due time to ``on_deferred``; return the others."""
        return self._split_due(records, _record_id, decode_message)

    def _keep_deferred_messages(self, msgs: list[Message]) -> list[Message]:
        """``_keep_deferred`` for messages read already decoded (a kept queue). A due time
        still ahead stays in the side file: the record is read again after a crash (the
        journal keeps it until it is done with), and must wait again."""
        return self._split_due(msgs, _message_id, _same, keep_ahead=True)

    def _split_due(
        self,
        items: list[_T],
        id_of: Callable[[_T], bytes],
        as_message: Callable[[_T], Message],
        *,
        keep_ahead: bool = False,
    ) -> list[_T]:
        now = time.time_ns()
        due = self._due
        plain: list[_T] = []
        deferred: list[Message] = []
        for it in items:
            ts = due.pop(id_of(it), 0)
            if ts > now and keep_ahead:
                due[id_of(it)] = ts
            if ts > now:
                msg = as_message(it)
                msg.defer_until_ns = ts
                deferred.append(msg)
            else:
                plain.append(it)
        if not due:
            self._drop_due()
        if deferred:
            assert self.on_deferred is not None
            self.on_deferred(deferred)
        return plain

    def _add_due(self, entries: list[tuple[bytes, int]]) -> None:
        self._due.update(entries)
        data = b"".join([_DUE.pack(i, ts) for i, ts in entries])
        try:
            if self._due_records > 2 * len(self._due) + _DUE_SLACK:
                self._rewrite_due()
            else:
                if self._due_fd is None:
                    self._due_fd = os.open(
                        self._due_path,
                        os.O_WRONLY | os.O_CREAT | os.O_APPEND | _O_CLOEXEC,
                        0o600,
                    )
                view = memoryview(data)
                while view:
                    view = view[os.write(self._due_fd, view) :]
                self._due_records += len(entries)
                self._due_dirty = True
            if self.dq.sync_every == 1 and self._due_fd is not None:
                os.fsync(self._due_fd)
                self._due_dirty = False
        except OSError as exc:
            # The messages themselves can still be stored: they would only come back early.
            self.dq.file_failed("write due times to", self._due_path, exc)
            self._close_due_fd()

    def _rewrite_due(self) -> None:
        """Replace the side file by the live due times (tmp file, fsync, rename)."""
        self._close_due_fd()
        tmp = f"{self._due_path}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _O_CLOEXEC, 0o600)
        try:
            data = b"".join([_DUE.pack(i, ts) for i, ts in self._due.items()])
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
            os.replace(tmp, self._due_path)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.remove(tmp)
            raise
        self._due_fd = fd  # positioned at its end: go on appending to the new file
        self._due_records = len(self._due)
        self._due_dirty = False

    def _load_due(self) -> None:
        try:
            with open(self._due_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return
        except OSError as exc:
            self.dq.file_failed("read due times from", self._due_path, exc)
            return
        now = time.time_ns()
        due: dict[bytes, int] = {}
        bad = 0
        for off in range(0, len(data) - _DUE.size + 1, _DUE.size):
            msg_id, ts = _DUE.unpack_from(data, off)
            if ts > now + MAX_DEFER_NS:  # corruption: deliver it now rather than never
                bad += 1
                due.pop(msg_id, None)
                continue
            due[msg_id] = ts
        if bad:
            self._quarantine_due(data, bad)
        self._due = {i: ts for i, ts in due.items() if ts > now}
        if not self._due or not self.dq.depth():
            self._drop_due()
            return
        try:
            self._rewrite_due()  # compact, and drop a torn last record
        except OSError as exc:
            self.dq.file_failed("rewrite", self._due_path, exc)

    def _quarantine_due(self, data: bytes, bad: int) -> None:
        bad_path = self._due_path + ".bad"
        self.dq._log.error(
            "DISKQUEUE(%s) %d due time(s) in %s are out of range (corrupt): those messages are "
            "delivered now; the file is kept as %s",
            self.dq.name,
            bad,
            self._due_path,
            bad_path,
        )
        try:
            with open(bad_path, "wb") as f:
                f.write(data)
        except OSError as exc:
            self.dq.file_failed("write", bad_path, exc)

    def _drop_due(self) -> None:
        self._due = {}
        self._close_due_fd()
        self._due_records = 0
        self._due_dirty = False
        self.dq.remove_file(self._due_path)

    def _close_due_fd(self) -> None:
        if self._due_fd is not None:
            fd, self._due_fd = self._due_fd, None
            with contextlib.suppress(OSError):
                os.close(fd)
