"""One timed priority queue for a channel's in-flight deadlines and deferred due times.

Theory of operation. nsqd keeps two hand-written heaps per channel and finds due items with a
100 ms random-sample scan over channels. Here each channel has one min-heap of
``(due, seq, [messages])`` and one timer armed at the earliest due time, so a message comes due
within a timer tick (about 1 ms), and an idle channel costs nothing. A batch delivered to one
client shares its deadline, so it is one heap entry, not one per message.

Removal (FIN, REQ, TOUCH) is lazy: the message's ``tq_seq`` is zeroed, and a message counts in
an entry only while ``message.tq_seq == entry.seq``. Entries whose messages are all gone are
dropped when they reach the top, and the heap is rebuilt when stale references outnumber live
ones, so memory stays proportional to what is really in flight (FINs arrive long before their
60 s deadlines) at an amortised O(1) cost per removal.
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heapify, heappop, heappush
from typing import Protocol

from .message import Message

#: Stale entries tolerated: a rebuild happens when entries exceed 3 x live + this.
_COMPACT_SLACK = 8192
TICK = 0.001


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Scheduler(Protocol):
    """What the core needs of an event loop."""

    def time(self) -> float: ...
    def call_at(self, when: float, callback: Callable[[], object], /) -> TimerHandle: ...
    def call_soon(self, callback: Callable[[], object], /) -> TimerHandle: ...


class TimedQueue:
    __slots__ = ("_heap", "_live", "_loop", "_on_due", "_refs", "_seq", "_timer", "_timer_at")

    def __init__(self, loop: Scheduler, on_due: Callable[[list[Message]], None]) -> None:
        self._loop = loop
        self._on_due = on_due
        self._heap: list[tuple[float, int, list[Message]]] = []
        self._live = 0  # messages whose entry is current
        self._refs = 0  # message references held by heap entries, live or stale
        self._seq = 0
        self._timer: TimerHandle | None = None
        self._timer_at = float("inf")

    def __len__(self) -> int:
        return self._live

    def push(self, msg: Message, due: float) -> None:
        self.push_many([msg], due)

    def push_many(self, msgs: list[Message], due: float) -> None:
        """Push messages that share one due time (a batch delivered to one client)."""
        if not msgs:
            return
        heap = self._heap
        # FINs come in about the order of delivery, so the oldest entries die first: drop them
        # from the top as they do, which keeps the heap small without rebuilding it. (Checking
        # an entry's last message first keeps this O(1) while the top is still in use.)
        while heap and heap[0][2][-1].tq_seq != heap[0][1] and not _is_live(heap[0]):
            self._refs -= len(heappop(heap)[2])
        self._seq = seq = self._seq + 1
        for msg in msgs:
            msg.tq_seq = seq
        heappush(heap, (due, seq, msgs))
        self._live += len(msgs)
        self._refs += len(msgs)
        if due < self._timer_at:
            self._arm(due)
        elif self._refs > 3 * self._live + _COMPACT_SLACK:
            self._compact()

    def remove(self, msg: Message) -> None:
        """Forget ``msg``'s entry; it must be live (``msg.tq_seq != 0``)."""
        msg.tq_seq = 0
        self._live -= 1

    def removed(self, n: int) -> None:
        """``remove`` done by the caller for ``n`` live messages (their ``tq_seq`` zeroed):
        the FIN loop's way, without a call per message."""
        self._live -= n

    def live_entries(self) -> list[tuple[float, Message]]:
        """Every live message with its due time, earliest first (for inspection)."""
        return [(due, m) for due, seq, msgs in sorted(self._heap) for m in msgs if m.tq_seq == seq]

    def clear(self) -> list[Message]:
        """Drop every entry; return the messages that were live, earliest first."""
        return [m for _, m in self.clear_with_due()]

    def clear_with_due(self) -> list[tuple[float, Message]]:
        """Like ``clear``, with each message's due time (to keep deferrals at exit)."""
        live = self.live_entries()
        for _, m in live:
            m.tq_seq = 0
        self._heap = []
        self._live = self._refs = 0
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = float("inf")
        return live

    def pop_due(self, now: float) -> list[Message]:
        """Remove and return every live message due at or before ``now``."""
        heap = self._heap
        due_msgs: list[Message] = []
        while heap and heap[0][0] <= now:
            _, seq, msgs = heappop(heap)
            self._refs -= len(msgs)
            for msg in msgs:
                if msg.tq_seq == seq:
                    msg.tq_seq = 0
                    due_msgs.append(msg)
        self._live -= len(due_msgs)
        return due_msgs

    def _arm(self, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = when
        self._timer = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = float("inf")
        # Timers have millisecond resolution and may fire a hair early; take what is due within
        # a tick rather than re-arming a zero-delay timer until the clock catches up.
        due = self.pop_due(self._loop.time() + TICK)
        heap = self._heap
        while heap and not _is_live(heap[0]):  # skip stale tops before re-arming
            self._refs -= len(heappop(heap)[2])
        if heap:
            self._arm(heap[0][0])
        if due:
            self._on_due(due)

    def _compact(self) -> None:
        heap = []
        refs = 0
        for due, seq, msgs in self._heap:
            live = [m for m in msgs if m.tq_seq == seq]
            if live:
                heap.append((due, seq, live))
                refs += len(live)
        heapify(heap)
        self._heap = heap
        self._refs = refs


def _is_live(entry: tuple[float, int, list[Message]]) -> bool:
    seq = entry[1]
    for m in entry[2]:  # noqa: SIM110 - a plain loop: half the cost of any() over a generator
        if m.tq_seq == seq:
            return True
    return False
