"""A topic's or channel's queue: up to ``--mem-queue-size`` messages in memory, then a backend.

As in nsqd, a message goes to memory whenever there is room and to the backend otherwise, so a
consumer that keeps up never costs a disk write. nsqd reads memory and disk in random order,
which can starve the disk under steady load; ``take`` instead reads the two in alternating
halves, so the oldest (spilled) messages keep moving. There is no global order, as in nsqd.
"""

from __future__ import annotations

from collections import deque

from .backend import BackendQueue
from .message import Message, decode_message


class MessageQueue:
    __slots__ = ("_flip", "_mem", "backend", "mem_size")

    def __init__(self, mem_size: int, backend: BackendQueue) -> None:
        self.mem_size = mem_size
        self.backend = backend
        self._mem: deque[Message] = deque()
        self._flip = False

    def __len__(self) -> int:
        """nsqd's ``depth``: memory plus backend (not in-flight or deferred)."""
        return len(self._mem) + self.backend.depth()

    @property
    def mem_depth(self) -> int:
        return len(self._mem)

    def put(self, msg: Message) -> None:
        if len(self._mem) < self.mem_size:
            self._mem.append(msg)
        else:
            self.backend.put_many([msg])

    def put_many(self, msgs: list[Message]) -> None:
        mem = self._mem
        room = self.mem_size - len(mem)
        if room >= len(msgs):
            mem.extend(msgs)
            return
        if room > 0:
            mem.extend(msgs[:room])
            msgs = msgs[room:]
        self.backend.put_many(msgs)

    def put_raw(self, records: list[bytes]) -> None:
        """Encoded messages from another backend: stored as they are when memory is full."""
        room = self.mem_size - len(self._mem)
        if room > 0:
            self._mem.extend(map(decode_message, records[:room]))
            records = records[room:]
        if records:
            self.backend.put_raw(records)

    def put_front(self, msgs: list[Message]) -> None:
        """Return messages to the head of the queue (they were taken from it earlier)."""
        self._mem.extendleft(reversed(msgs))

    def take(self, n: int) -> list[Message]:
        """Up to ``n`` messages: half from the backend when it has any, the rest from memory."""
        backend = self.backend
        # Alternate which side gets the odd message, so that a run of take(1) serves both.
        self._flip = flip = not self._flip
        out = backend.read_many((n + flip) // 2) if backend.depth() else []
        mem = self._mem
        k = min(n - len(out), len(mem))
        if k:
            popleft = mem.popleft
            out += [popleft() for _ in range(k)]
        if len(out) < n and backend.depth():
            out += backend.read_many(n - len(out))
        return out

    def take_memory(self, n: int) -> list[Message]:
        mem = self._mem
        popleft = mem.popleft
        return [popleft() for _ in range(min(n, len(mem)))]

    def empty(self) -> None:
        self._mem.clear()
        self.backend.empty()

    def drain_memory(self) -> list[Message]:
        """Remove and return the in-memory messages (to flush them to the backend at exit)."""
        out = list(self._mem)
        self._mem.clear()
        return out
