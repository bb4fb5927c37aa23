"""Where a topic's or channel's messages go past ``--mem-queue-size``.

nsqd's ``BackendQueue``: a go-diskqueue for normal topics and channels, a dummy that drops
messages for ``#ephemeral`` ones. The core sees only this interface; ``storage/`` provides the
disk implementation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from .dedup import Dedup
from .message import Message


class MessageLog(Protocol):
    """A replayable topic's retained log (``storage/topiclog.py``)."""

    def append(self, msgs: list[Message], identity: tuple[bytes, int] | None = None) -> int:
        """Log new messages in order before they fan out; return the first one's offset.
        Raises OSError if they could not be logged (then none of them is published).
        ``identity``: an idempotent publish's producer and first sequence number."""

    def bodies_at(self, offsets: list[int]) -> list[bytes | None]:
        """The bodies of the records at ``offsets`` (ascending), None where one is gone."""

    def identities(self) -> Dedup:
        """What the log remembers of idempotent publishes (``core/dedup.py``)."""

    def set_dedup(self, records: int, window_ns: int) -> None:
        """Its window (the topic's settings)."""

    def sync_wait(self, end: int) -> Callable[[Callable[[str | None], None]], None] | None:
        """What the OK of records below ``end`` waits for (``--sync-every=1``'s group commit:
        an fsync that covers them); None: nothing (synced already, or synced in ``append``,
        or in the background as ``--sync-every`` allows)."""

    @property
    def committed(self) -> int | None:
        """A replicated partition's high watermark; None: not replicated."""

    @property
    def earliest(self) -> int:
        """The oldest retained offset."""

    @property
    def latest(self) -> int:
        """The next offset to be written."""

    @property
    def visible(self) -> int:
        """The end of what channels may be handed: ``latest``, or a replicated partition's
        high watermark (what enough replicas hold)."""

    @property
    def size(self) -> int:
        """Bytes on disk."""

    @property
    def segment_count(self) -> int: ...

    @property
    def handed(self) -> int:
        """The first offset not yet handed to the topic's channels: a retained topic's backlog
        is ``[handed, latest)``, kept only in the log (the log is the topic's queue)."""

    def hand_to(self, offset: int) -> None:
        """``handed`` moves to ``offset`` (the only writer of it outside the log)."""

    def save_handed(self, position: int | None = None) -> None:
        """Make ``handed`` (or an earlier ``position``) survive a crash: the saved position
        only ever lags what every channel has stored, so a crash repeats, never skips.
        Raises OSError."""

    def read_messages(self, offset: int, max_count: int) -> tuple[list[Message], int]:
        """Logged messages from ``offset`` (or the first retained one after it), and the
        offset after the last of them."""

    def close(self) -> None: ...

    def delete(self) -> None: ...


class InFlightKeeper(Protocol):
    """Where a channel's messages read from its backend stay stored until the channel is done
    with them (``--mem-queue-size=0``; ``storage/in_flight_journal.py``): told of each
    delivery (attempts) and of each message done with (finished, stored again, dropped)."""

    def delivered(self, msgs: list[Message]) -> None: ...
    def deferred(self, msg_id: bytes, due_ns: int) -> None:
        """REQ'd with a timeout: after a crash it waits until ``due_ns`` (wall clock) again."""

    def settled(self, ids: list[bytes]) -> None: ...


class BackendQueue(Protocol):
    #: Given, by the topic or channel that owns the queue, the messages read back whose due
    #: time (DPUB) is still ahead: they wait there, not here.
    on_deferred: Callable[[list[Message]], None] | None

    def put_many(self, msgs: list[Message]) -> None:
        """Store messages in order; raise OSError if they could not be stored."""

    def read_many(self, max_count: int, max_bytes: int = 0) -> list[Message]:
        """The next stored messages, oldest first; returned messages are consumed.

        With ``max_bytes``, stop once that many body bytes were read (at least one message).
        """

    def put_raw(self, records: list[bytes]) -> None:
        """Store messages already in nsqd's encoding (``Message.encode``)."""

    def read_raw(self, max_count: int, max_bytes: int = 0, *, hold: bool = False) -> list[bytes]:
        """Like ``read_many``, but the messages stay encoded.

        With ``hold``, their consumption is made durable only by ``commit_reads``: a crash before
        it brings them back. A move to another queue stores them there first, then commits.
        """

    def commit_reads(self) -> None: ...

    def peek(self, max_count: int) -> list[Message]:
        """Up to ``max_count`` of the next messages, oldest first, not consumed."""

    def depth(self) -> int: ...

    def byte_size(self) -> int:
        """Bytes stored, about (for a bound in bytes)."""

    def empty(self) -> None: ...

    def close(self) -> None:
        """Flush and close; the messages stay stored."""

    def delete(self) -> None:
        """Close and remove everything stored."""


class DummyBackend:
    """The ``#ephemeral`` backend: overflow is dropped, as in nsqd."""

    __slots__ = ("dropped", "on_deferred")

    def __init__(self) -> None:
        self.dropped = 0
        self.on_deferred: Callable[[list[Message]], None] | None = None

    def put_many(self, msgs: list[Message]) -> None:
        self.dropped += len(msgs)

    def read_many(self, max_count: int, max_bytes: int = 0) -> list[Message]:
        return []

    def put_raw(self, records: list[bytes]) -> None:
        self.dropped += len(records)

    def read_raw(self, max_count: int, max_bytes: int = 0, *, hold: bool = False) -> list[bytes]:
        return []

    def commit_reads(self) -> None:
        pass

    def peek(self, max_count: int) -> list[Message]:
        return []

    def depth(self) -> int:
        return 0

    def byte_size(self) -> int:
        return 0

    def empty(self) -> None:
        pass

    def close(self) -> None:
        pass

    def delete(self) -> None:
        pass
