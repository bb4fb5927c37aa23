"""A replicated topic's channel's replication state: one ``DoneWindow`` per partition.

Theory of operation (``docs/replication.md``, "Channels across a failover"). A channel of a
replicated topic holds messages of one or more partitions (its own node's, and those it took
over). ``PartitionWindows`` keeps, per partition (keyed by its origin node), what the channel is
responsible for and done with (``offsets.DoneWindow``), and is the one object the channel calls
for it: FIN, expiry and dead-lettering mark offsets done (``mark_done``), a REQ or a timeout notes
attempts (``note_attempts``), delivery drops what another node took over (``screen``), and an
empty closes or advances every window (``emptied``). Replication (``cluster/checkpoints.py``)
changes a channel's windows only through this module's functions (``track_partition``,
``set_window``, ``merge_window``, ``adopted_below``, ``drop_offset_messages``), which create this
object on first use; otherwise it reads it as a mapping.

A channel of a topic that is not replicated has none (``Channel.windows`` is None: no cost).
No I/O, no clock: tested in ``tests/unit/core/test_windows.py``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Protocol

from .message import Message
from .offsets import DoneWindow, decode_offset_id, is_offset_id
from .queue import MessageQueue
from .timed_queue import TimedQueue


class PartitionWindows(Mapping[int, DoneWindow]):
    """The windows of one channel, by partition origin; read as a ``Mapping``."""

    __slots__ = ("_by_origin",)

    def __init__(self) -> None:
        self._by_origin: dict[int, DoneWindow] = {}

    def __getitem__(self, origin: int) -> DoneWindow:
        return self._by_origin[origin]

    def __iter__(self) -> Iterator[int]:
        return iter(self._by_origin)

    def __len__(self) -> int:
        return len(self._by_origin)

    def __repr__(self) -> str:
        return f"PartitionWindows({self._by_origin!r})"

    # -- the channel's traffic ------------------------------------------------------------

    def screen(self, batch: list[Message]) -> tuple[list[Message], int]:
        """The messages of ``batch`` still pending here (another node may have taken a
        partition's state over), and how many were dropped."""
        windows = self._by_origin
        keep = []
        stale = 0
        for m in batch:
            at = decode_offset_id(m.id)
            if at is not None:
                w = windows.get(at[0])
                if w is not None and not w.is_pending(at[1]):
                    stale += 1
                    continue
            keep.append(m)
        return keep, stale

    def note_attempts(self, msgs: Iterable[Message], due_ms: int = 0) -> None:
        """Messages back in the queue: their attempts so far (and when a REQ's delay ends),
        for a takeover to go on from."""
        windows = self._by_origin
        for m in msgs:
            at = decode_offset_id(m.id)
            w = windows.get(at[0]) if at is not None else None
            if w is not None and at is not None:
                w.note_attempts(at[1], m.attempts, due_ms)

    def mark_done(self, ids: Iterable[bytes]) -> None:
        """These messages are done with here (FIN, expired, dead-lettered)."""
        windows = self._by_origin
        for msg_id in ids:
            at = decode_offset_id(msg_id)
            w = windows.get(at[0]) if at is not None else None
            if w is not None and at is not None:
                w.mark(at[1])

    def emptied(self, handed: int) -> None:
        """The channel was emptied: its own partition is done below the topic's hand-off
        position ``handed``; the partitions it took over are closed."""
        for w in self._by_origin.values():
            if w.end is None:
                w.done_below(handed)
            else:
                w.close()

    # -- replication's changes (through the channel) --------------------------------------

    def track(self, origin: int, low: int) -> None:
        """Responsible for ``origin``'s partition from ``low`` on (kept if it already is)."""
        self._by_origin.setdefault(origin, DoneWindow(low))

    def set(self, origin: int, window: DoneWindow) -> None:
        """``origin``'s window as a checkpoint or a take-back says it is."""
        self._by_origin[origin] = window

    def merge(self, origin: int, window: DoneWindow) -> None:
        """Adopted: what another holder was responsible for joins this window."""
        mine = self._by_origin.get(origin)
        self._by_origin[origin] = window if mine is None else mine.union(window)

    def adopted_below(self, origin: int, end: int, *, own: bool) -> None:
        """Another node took over this channel's part of ``origin``'s partition below
        ``end``. The node's own partition stays this channel's from ``end`` on; another
        partition's window closes."""
        w = self._by_origin.get(origin)
        if own:
            if w is None or w.end is not None:
                self._by_origin[origin] = w = DoneWindow(end)
            w.done_below(end)
        elif w is not None:
            w.close()


# -- what replication changes of a channel (``cluster/checkpoints.py``, the topic) ----------


class Replicated(Protocol):
    """What these functions read and change of a channel (``core/channel.Channel``)."""

    windows: PartitionWindows | None

    @property
    def queue(self) -> MessageQueue: ...

    tq: TimedQueue
    deferred: dict[bytes, Message]

    def schedule_pump(self) -> None: ...


def _windows(channel: Replicated) -> PartitionWindows:
    if channel.windows is None:
        channel.windows = PartitionWindows()
    return channel.windows


def track_partition(channel: Replicated, origin: int, low: int) -> None:
    """Responsible for ``origin``'s partition from ``low`` on (kept if it already is)."""
    _windows(channel).track(origin, low)


def set_window(channel: Replicated, origin: int, window: DoneWindow) -> None:
    """``origin``'s window as a checkpoint or a take-back says it is."""
    _windows(channel).set(origin, window)


def merge_window(channel: Replicated, origin: int, window: DoneWindow) -> None:
    """Adopted: what another holder was responsible for joins the channel's window."""
    _windows(channel).merge(origin, window)


def adopted_below(channel: Replicated, origin: int, end: int, *, own: bool) -> None:
    """Another node took over the channel's part of ``origin``'s partition below ``end``
    (``PartitionWindows.adopted_below``): its messages below ``end`` are dropped at delivery."""
    if channel.windows is None:
        return
    channel.windows.adopted_below(origin, end, own=own)
    channel.schedule_pump()


def drop_offset_messages(channel: Replicated, batch: int) -> Iterator[int]:
    """Rebuilding after a crash: every message with an offset ID leaves the channel's queue and
    deferred set (the log puts them back); the others stay. Yields after each ``batch`` read
    from the queue (the caller lets the loop run), then once more when done."""
    queue = channel.queue
    kept: list[Message] = []
    n = len(queue)
    while n > 0:
        taken = queue.take(min(n, batch))
        if not taken:
            break
        n -= len(taken)
        kept.extend(m for m in taken if not is_offset_id(m.id))
        yield len(taken)
    deferred = channel.deferred
    for msg_id in [i for i in deferred if is_offset_id(i)]:
        channel.tq.remove(deferred.pop(msg_id))
    if kept:
        queue.keep_many(kept)
    yield 0
