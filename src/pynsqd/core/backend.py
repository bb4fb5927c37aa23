"""Where a topic's or channel's messages go past ``--mem-queue-size``.

nsqd's ``BackendQueue``: a go-diskqueue for normal topics and channels, a dummy that drops
messages for ``#ephemeral`` ones. The core sees only this interface; ``storage/`` provides the
disk implementation.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

from .message import Message


class BackendQueue(Protocol):
    def put_many(self, msgs: list[Message]) -> None:
        """Store messages in order; raise OSError if they could not be stored."""

    def read_many(self, max_count: int) -> list[Message]:
        """The next stored messages, oldest first; returned messages are consumed."""

    def depth(self) -> int: ...

    def empty(self) -> None: ...

    def close(self) -> None:
        """Flush and close; the messages stay stored."""

    def delete(self) -> None:
        """Close and remove everything stored."""


class DummyBackend:
    """The ``#ephemeral`` backend: overflow is dropped, as in nsqd."""

    __slots__ = ("dropped",)

    def __init__(self) -> None:
        self.dropped = 0

    def put_many(self, msgs: list[Message]) -> None:
        self.dropped += len(msgs)

    def read_many(self, max_count: int) -> list[Message]:
        return []

    def depth(self) -> int:
        return 0

    def empty(self) -> None:
        pass

    def close(self) -> None:
        pass

    def delete(self) -> None:
        pass


class MemoryBackend:
    """An unbounded in-memory backend: overflow kept for the life of the process."""

    __slots__ = ("_q",)

    def __init__(self) -> None:
        self._q: deque[Message] = deque()

    def put_many(self, msgs: list[Message]) -> None:
        self._q.extend(msgs)

    def read_many(self, max_count: int) -> list[Message]:
        q = self._q
        n = min(max_count, len(q))
        return [q.popleft() for _ in range(n)]

    def depth(self) -> int:
        return len(self._q)

    def empty(self) -> None:
        self._q.clear()

    def close(self) -> None:
        pass

    def delete(self) -> None:
        self._q.clear()
