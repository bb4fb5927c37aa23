"""A topic's or channel's queue: up to ``--mem-queue-size`` messages in memory, then a backend.

nsqd selects on its memory Go channel and its disk queue at random, so messages that spilled to
disk lose their order (and, under steady load, can starve). Here, once anything is in the
backend, new messages follow it there until it drains: delivery stays FIFO across the spill.
"""

from __future__ import annotations

from collections import deque

from .backend import BackendQueue
from .message import Message


class MessageQueue:
    __slots__ = ("_mem", "backend", "mem_size")

    def __init__(self, mem_size: int, backend: BackendQueue) -> None:
        self.mem_size = mem_size
        self.backend = backend
        self._mem: deque[Message] = deque()

    def __len__(self) -> int:
        """nsqd's ``depth``: memory plus backend (not in-flight or deferred)."""
        return len(self._mem) + self.backend.depth()

    @property
    def mem_depth(self) -> int:
        return len(self._mem)

    def put(self, msg: Message) -> None:
        if len(self._mem) < self.mem_size and not self.backend.depth():
            self._mem.append(msg)
        else:
            self.backend.put_many([msg])

    def put_many(self, msgs: list[Message]) -> None:
        mem = self._mem
        room = self.mem_size - len(mem)
        if room >= len(msgs) and not self.backend.depth():
            mem.extend(msgs)
            return
        if room > 0 and not self.backend.depth():
            mem.extend(msgs[:room])
            msgs = msgs[room:]
        self.backend.put_many(msgs)

    def put_front(self, msgs: list[Message]) -> None:
        """Return messages to the head of the queue (they were taken from it earlier)."""
        self._mem.extendleft(reversed(msgs))

    def take(self, n: int) -> list[Message]:
        """Up to ``n`` messages, oldest first."""
        mem = self._mem
        k = min(n, len(mem))
        popleft = mem.popleft
        out = [popleft() for _ in range(k)]
        if k < n and self.backend.depth():
            out.extend(self.backend.read_many(n - k))
        return out

    def empty(self) -> None:
        self._mem.clear()
        self.backend.empty()

    def drain_memory(self) -> list[Message]:
        """Remove and return the in-memory messages (to flush them to the backend at exit)."""
        out = list(self._mem)
        self._mem.clear()
        return out
