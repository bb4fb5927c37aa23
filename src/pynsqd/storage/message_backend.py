"""The disk backend of a topic or channel: messages encoded into a go-diskqueue."""

from __future__ import annotations

from ..core.message import Message, decode_message
from .diskqueue import DiskQueue


class DiskBackend:
    """``core.backend.BackendQueue`` over a ``DiskQueue``, in nsqd's message encoding."""

    __slots__ = ("dq",)

    def __init__(self, dq: DiskQueue) -> None:
        self.dq = dq

    def put_many(self, msgs: list[Message]) -> None:
        self.dq.put_many([m.encode() for m in msgs])

    def read_many(self, max_count: int) -> list[Message]:
        return list(map(decode_message, self.dq.read_many(max_count)))

    def put_raw(self, records: list[bytes]) -> None:
        self.dq.put_many(records)

    def read_raw(self, max_count: int) -> list[bytes]:
        return self.dq.read_many(max_count)

    def depth(self) -> int:
        return self.dq.depth()

    def empty(self) -> None:
        self.dq.empty()

    def close(self) -> None:
        self.dq.close()

    def delete(self) -> None:
        self.dq.delete()

    def sync_if_due(self, now: float) -> None:
        self.dq.sync_if_due(now)
