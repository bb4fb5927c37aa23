"""A topic's or channel's queue: up to ``--mem-queue-size`` messages in memory, then a backend.

As in nsqd, a message goes to memory whenever there is room and to the backend otherwise, so a
consumer that keeps up never costs a disk write. nsqd reads memory and disk in random order,
which can starve the disk under steady load; ``take`` instead reads the two in alternating
halves, so the oldest (spilled) messages keep moving. There is no global order, as in nsqd.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from itertools import islice, repeat, starmap

from .backend import BackendQueue, InFlightKeeper
from .message import Message, decode_message

#: The most queued messages in memory a newest-first peek looks at.
PEEK_SCAN = 10_000


def _timestamp(m: Message) -> int:
    return m.timestamp


class MessageQueue:
    __slots__ = (
        "_flip",
        "_mem",
        "backend",
        "keeper",
        "mem_bytes",
        "mem_size",
        "overflow_count",
        "track_bytes",
        "write_error",
    )

    def __init__(
        self, mem_size: int, backend: BackendQueue, keeper: InFlightKeeper | None = None
    ) -> None:
        self.mem_size = mem_size
        self.backend = backend
        #: Told of messages read from the backend and dropped here (``drop_oldest``).
        self.keeper = keeper
        self._mem: deque[Message] = deque()
        self._flip = False
        #: Messages kept in memory past ``mem_size`` because the backend failed to store them.
        self.overflow_count = 0
        #: The backend's last write error while it lasts (cleared by the next good write).
        self.write_error: OSError | None = None
        #: Body bytes in memory, counted only while ``track_bytes`` (a bound in bytes applies):
        #: otherwise the queue pays nothing for it.
        self.track_bytes = False
        self.mem_bytes = 0

    def count_bytes(self, on: bool) -> None:
        self.track_bytes = on
        self.mem_bytes = sum(m.size for m in self._mem) if on else 0

    def byte_size(self) -> int:
        """Body bytes in memory plus what the backend holds (about); needs ``track_bytes``."""
        return self.mem_bytes + self.backend.byte_size()

    def _added(self, msgs: list[Message] | tuple[Message, ...]) -> None:
        self.mem_bytes += sum(m.size for m in msgs)

    def _removed(self, msgs: list[Message]) -> None:
        self.mem_bytes -= sum(m.size for m in msgs)

    def __len__(self) -> int:
        """nsqd's ``depth``: memory plus backend (not in-flight or deferred)."""
        return len(self._mem) + self.backend.depth()

    @property
    def mem_depth(self) -> int:
        return len(self._mem)

    def _fill(self, msgs: list[Message]) -> list[Message]:
        """Put what fits into memory; returns the messages that did not fit."""
        mem = self._mem
        room = self.mem_size - len(mem)
        if room >= len(msgs):
            mem.extend(msgs)
            if self.track_bytes:
                self._added(msgs)
            return []
        if room > 0:
            mem.extend(msgs[:room])
            if self.track_bytes:
                self._added(msgs[:room])
            return msgs[room:]
        return msgs

    def put_many(self, msgs: list[Message]) -> None:
        """Publish: memory while there is room, then the backend; raises its OSError, and then
        the messages that did not fit are not stored (the publisher is told it failed)."""
        rest = self._fill(msgs)
        if rest:
            self.backend.put_many(rest)

    def keep_many(self, msgs: list[Message]) -> OSError | None:
        """Messages this queue must not lose (already acknowledged to their publisher): like
        ``put_many``, but if the backend fails they stay in memory past ``mem_size`` and the
        error is returned."""
        rest = self._fill(msgs)
        return self._store(rest) if rest else None

    def keep_raw(self, records: list[bytes]) -> OSError | None:
        """Encoded messages from another backend: stored as they are when memory is full; kept
        in memory (decoded) if the backend fails, as ``keep_many``."""
        room = self.mem_size - len(self._mem)
        if room > 0:
            decoded = list(map(decode_message, records[:room]))
            self._mem.extend(decoded)
            if self.track_bytes:
                self._added(decoded)
            records = records[room:]
        if not records:
            return None
        try:
            self.backend.put_raw(records)
        except OSError as err:
            return self._kept(list(map(decode_message, records)), err)
        self.write_error = None
        return None

    def _kept(self, msgs: list[Message], err: OSError) -> OSError:
        self._mem.extend(msgs)
        if self.track_bytes:
            self._added(msgs)
        self.overflow_count += len(msgs)
        self.write_error = err
        return err

    def put_front(self, msgs: list[Message]) -> OSError | None:
        """Return messages taken earlier: to the head of memory while there is room (they are
        the oldest), the rest to the backend, so that ``mem_size`` holds (as ``keep_many``)."""
        room = self.mem_size - len(self._mem)
        if room >= len(msgs):
            self._mem.extendleft(reversed(msgs))
            if self.track_bytes:
                self._added(msgs)
            return None
        if room > 0:
            self._mem.extendleft(reversed(msgs[:room]))
            if self.track_bytes:
                self._added(msgs[:room])
            msgs = msgs[room:]
        return self._store(msgs)

    def _store(self, msgs: list[Message]) -> OSError | None:
        """To the backend; kept in memory (and the error returned) if it fails."""
        try:
            self.backend.put_many(msgs)
        except OSError as err:
            return self._kept(msgs, err)
        self.write_error = None
        return None

    def take(self, n: int, max_bytes: int = 0) -> list[Message]:
        """Up to ``n`` messages: half from the backend when it has any, the rest from memory.

        With ``max_bytes``, stop once that many body bytes are taken (at least one message):
        a consumer is never handed more than its connection may buffer.
        """
        backend = self.backend
        # Alternate which side gets the odd message, so that a run of take(1) serves both.
        self._flip = flip = not self._flip
        out = backend.read_many((n + flip) // 2, max_bytes) if backend.depth() else []
        mem = self._mem
        k = min(n - len(out), len(mem))
        if k:
            got = list(starmap(mem.popleft, repeat((), k)))  # k pops in C
            if self.track_bytes:
                self._removed(got)
            if max_bytes:
                # Checked after the fact, in one pass: the budget is rarely what limits a take.
                sizes = [m.size for m in out]
                sizes += [m.size for m in got]
                if sum(sizes) > max_bytes:
                    return self._trim(out, got, sizes, max_bytes)
            out += got
        if len(out) < n and backend.depth():
            if max_bytes:
                budget = max_bytes - sum(m.size for m in out)
                if budget > 0:
                    out += backend.read_many(n - len(out), budget)
            else:
                out += backend.read_many(n - len(out))
        return out

    def _trim(
        self, out: list[Message], got: list[Message], sizes: list[int], max_bytes: int
    ) -> list[Message]:
        """Keep what fits ``max_bytes`` (at least one message); the rest of ``got`` goes back
        to the head of memory, where it came from."""
        total = 0
        keep = 0
        for size in sizes:
            if keep and total + size > max_bytes:
                break
            total += size
            keep += 1
        first = len(out)
        back = got if keep <= first else got[keep - first :]  # to the head of memory again
        self._mem.extendleft(reversed(back))
        if self.track_bytes:
            self._added(back)
        if keep <= first:  # the backend's part alone filled the budget
            return out
        return out + got[: keep - first]

    def drop_oldest(self, n: int) -> int:
        """Drop up to ``n`` messages, oldest publish time first, across memory and backend
        (``take`` alternates the two, which is no age order: memory may hold the oldest).
        The backend is read one message ahead; one that is not dropped goes into memory in
        age order (a scan from the head: it costs while memory holds older messages; and that
        one message now waits in memory, past ``mem_size``). Returns how many were dropped."""
        mem = self._mem
        backend = self.backend
        dropped = 0
        ahead: Message | None = None
        while dropped < n:
            if ahead is None and backend.depth():
                ahead = backend.read_many(1)[0]
            if ahead is not None and (not mem or ahead.timestamp < mem[0].timestamp):
                if self.keeper is not None:
                    self.keeper.settled([ahead.id])
                ahead = None
            elif mem:
                m = mem.popleft()
                if self.track_bytes:
                    self.mem_bytes -= m.size
            else:
                break
            dropped += 1
        if ahead is not None:  # back into memory, in age order (memory is FIFO by age)
            i = 0
            while i < len(mem) and mem[i].timestamp <= ahead.timestamp:
                i += 1
            mem.insert(i, ahead)
            if self.track_bytes:
                self.mem_bytes += ahead.size
        return dropped

    def peek(self, n: int, *, newest: bool = False) -> list[Message]:
        """Up to ``n`` queued messages by publish time (oldest or newest first), not taken.
        Newest first looks at the last ``PEEK_SCAN`` in memory and the first ``PEEK_SCAN``
        the backend holds (it is read from its head)."""
        mem = self._mem
        if newest:
            part = heapq.nlargest(n, islice(reversed(mem), PEEK_SCAN), key=_timestamp)
            part += heapq.nlargest(n, self.backend.peek(PEEK_SCAN), key=_timestamp)
        else:
            part = list(islice(mem, n)) + self.backend.peek(n)
        return sorted(part, key=_timestamp, reverse=newest)[:n]

    def oldest(self) -> Iterator[Message] | None:
        """The messages in memory from its head, left in place (the queue must not change
        while it is walked); None while the backend holds some (they are older, and read
        from disk only when taken)."""
        if self.backend.depth():
            return None
        return iter(self._mem)

    def take_memory(self, n: int) -> list[Message]:
        mem = self._mem
        popleft = mem.popleft
        got = [popleft() for _ in range(min(n, len(mem)))]
        if self.track_bytes:
            self._removed(got)
        return got

    def empty(self) -> None:
        self._mem.clear()
        self.mem_bytes = 0
        self.backend.empty()

    def drain_memory(self) -> list[Message]:
        """Remove and return the in-memory messages (to flush them to the backend at exit)."""
        out = list(self._mem)
        self._mem.clear()
        self.mem_bytes = 0
        return out
