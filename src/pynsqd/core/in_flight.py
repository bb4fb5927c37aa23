"""A channel's messages out of its queue: in flight to a consumer, or deferred (nsqd's
``inFlightMessages``/``inFlightPQ`` and ``deferredMessages``/``deferredPQ``). No I/O.

Theory of operation. A message delivered to a consumer is **in flight** (``flying``, by ID) until
its consumer finishes or requeues it, or its deadline passes; a message requeued with a timeout,
or published deferred, is **deferred** (``deferred``) until it is due. Both kinds of deadline
share one ``TimedQueue`` (``tq``), whose ``on_due`` hands the channel what came due. An ID is in
flight once: a second copy of it reaching the head of the queue (a rewound copy, or a crash's
second copy) waits **behind** it (``behind``), counted in the channel's depth, and goes back to
the head of the queue when the ID leaves flight (``release``), so FIN/REQ/TOUCH stay
unambiguous. The channel (``core/channel.py``) decides what happens to a message that leaves:
this class only keeps the books, with the FIN loop inline (a call per FIN costs 35 ns).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Container, Iterable

from . import tracing
from .errors import ChannelError, NotInFlight, NotOwner
from .message import MAX_ATTEMPTS, MAX_DEFER_NS, ConsumerLike, Message
from .timed_queue import TICK, Scheduler, TimedQueue

__all__ = ["InFlight"]


class InFlight:
    __slots__ = ("behind", "deferred", "flying", "label", "loop", "tq")

    def __init__(
        self,
        loop: Scheduler,
        on_due: Callable[[list[Message]], None],
        label: tuple[str, str] = ("", ""),
    ) -> None:
        self.loop = loop
        #: (topic, channel): what the tracer (``core/tracing.py``) calls its deliveries.
        self.label = label
        self.flying: dict[bytes, Message] = {}
        self.deferred: dict[bytes, Message] = {}
        self.behind: dict[bytes, list[Message]] = {}
        self.tq = TimedQueue(loop, on_due)

    def waiting(self) -> int:
        """Second copies waiting behind an ID in flight."""
        behind = self.behind
        return sum(map(len, behind.values())) if behind else 0

    def fly(
        self, batch: list[Message], client: ConsumerLike, now: float, deadline: float
    ) -> list[Message]:
        """``batch`` goes to ``client`` until ``deadline``: the messages that flew (a second
        copy of an ID in flight waits behind it instead)."""
        fly = self.flying.setdefault  # one lookup both checks and inserts
        dups = 0
        for msg in batch:
            if fly(msg.id, msg) is not msg:
                self.behind.setdefault(msg.id, []).append(msg)
                dups += 1
                continue
            if msg.attempts < MAX_ATTEMPTS:
                msg.attempts += 1
            msg.client = client
            msg.delivery_ts = now
        if dups:
            batch = [m for m in batch if self.flying.get(m.id) is m]
        self.tq.push_many(batch, deadline)
        if tracing.TRACER is not None and batch:
            tracing.TRACER.delivering(*self.label, batch, str(client.id))
        return batch

    def take(self, client: ConsumerLike, msg_id: bytes) -> Message:
        """``client``'s message in flight. Raises NotInFlight or NotOwner."""
        msg = self.flying.get(msg_id)
        if msg is None:
            raise NotInFlight(msg_id)
        if msg.client is not client:
            raise NotOwner(msg_id)
        return msg

    def finish_many(
        self,
        client: ConsumerLike,
        ids: list[bytes],
        sink: Callable[[int], None] | None,
        now_ns: int,
    ) -> tuple[int, ChannelError | None]:
        """FIN of a run of ids: how many were finished (the first ones), and the error of the
        first that is not ``client``'s to finish (the rest are not looked at)."""
        flying = self.flying
        pop = flying.pop
        done = 0
        err: ChannelError | None = None
        for msg_id in ids:
            msg = pop(msg_id, None)
            if msg is None:
                err = NotInFlight(msg_id)
                break
            if msg.client is not client:
                flying[msg_id] = msg  # back, if at the end of the order: not ours to FIN
                err = NotOwner(msg_id)
                break
            msg.tq_seq = 0  # TimedQueue.remove, inline
            msg.client = None
            done += 1
            if sink is not None:
                sink(now_ns - msg.timestamp)
        self.tq.removed(done)
        if tracing.TRACER is not None and done:
            tracing.TRACER.ended(*self.label, ids[:done], "fin")
        return done, err

    def due(
        self, msgs: list[Message], give_back: Callable[[Message], bool] | None
    ) -> tuple[list[Message], dict[ConsumerLike, int]]:
        """What the timed queue says came due: in-flight messages past their deadline leave
        flight (timed out, counted by consumer; ``give_back`` takes one another worker lent,
        ``core/lending.py``), deferred ones whose time came leave deferral; returns those to
        queue again and the timeouts."""
        ready: list[Message] = []
        timed_out: dict[ConsumerLike, int] = {}
        for msg in msgs:
            client = msg.client
            if client is not None:  # an in-flight message whose deadline passed
                del self.flying[msg.id]
                msg.client = None
                timed_out[client] = timed_out.get(client, 0) + 1
                if tracing.TRACER is not None:
                    tracing.TRACER.ended(*self.label, [msg.id], "timeout")
                if give_back is not None and give_back(msg):
                    continue
            elif msg.id not in self.deferred:
                continue  # a second copy deferred under the same ID already came due
            elif msg.defer_until_ns:  # a DPUB: due by the wall clock
                left_ns = msg.defer_until_ns - time.time_ns()
                if left_ns > 0:  # a hair early by the wall clock: not yet
                    self.tq.push(msg, self.loop.time() + left_ns / 1e9 + TICK)
                    continue
                msg.defer_until_ns = 0
                del self.deferred[msg.id]
            else:
                del self.deferred[msg.id]  # a REQ with a timeout
            ready.append(msg)
        return ready, timed_out

    def land(self, msg: Message, why: str = "req") -> None:
        """``msg`` leaves flight (a REQ; ``why``: for the tracer): no longer anyone's, no
        deadline."""
        del self.flying[msg.id]
        self.tq.remove(msg)
        msg.client = None
        if tracing.TRACER is not None:
            tracing.TRACER.ended(*self.label, [msg.id], why)

    def land_all(self, client: ConsumerLike) -> list[Message]:
        """Every message in flight to ``client`` leaves flight (it went away)."""
        mine = [m for m in self.flying.values() if m.client is client]
        for m in mine:
            self.land(m, "requeued")
        return mine

    def defer(self, msg: Message, due: float) -> None:
        self.deferred[msg.id] = msg
        self.tq.push(msg, due)

    def retime(self, msg: Message, due: float) -> None:
        """A new deadline (TOUCH)."""
        self.tq.remove(msg)
        self.tq.push(msg, due)

    def release(self, ids: Iterable[bytes]) -> list[Message]:
        """IDs that left flight: the copy waiting behind each, oldest first."""
        behind = self.behind
        back = []
        for msg_id in ids:
            waiting = behind.get(msg_id)
            if waiting is not None:
                back.append(waiting.pop(0))
                if not waiting:
                    del behind[msg_id]
        return back

    def clear(self) -> None:
        """Everything goes (an emptied or deleted channel)."""
        for m in self.tq.clear():
            m.client = None
        self.flying.clear()
        self.deferred.clear()
        self.behind.clear()

    def keep_at_exit(self, now: float, now_ns: int, lent: Container[bytes]) -> list[Message]:
        """A channel stopping keeps its messages: those in flight back to the queue, those
        deferred with their due time as a wall-clock deferral (nsqio/nsq#1107), the copies
        behind; not those ``lent`` (another worker's channel takes them back). All the books
        are cleared."""
        pending = []
        for due, m in self.tq.clear_with_due():
            if m.id in lent:
                continue
            if m.client is None:
                # Capped so that a corrupt far-future due time cannot overflow int64 on disk.
                delay_ns = min(max(1, int((due - now) * 1e9)), MAX_DEFER_NS)
                m.defer_until_ns = now_ns + delay_ns
            m.client = None
            pending.append(m)
        for waiting in self.behind.values():
            pending += waiting
        self.flying.clear()
        self.deferred.clear()
        self.behind.clear()
        return pending
