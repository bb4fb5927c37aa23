"""Messages a channel delivers for another worker's channel (``--workers``).

Theory of operation. With several worker processes behind one address, each worker keeps its
own topics and channels (its own disk and ids); a message stays in the worker its producer's
connection landed on. When a worker's channel has consumers and nothing of its own left to give
them, its relay (``server/workers/relay.py``) pulls from the same channel of the other workers: each
link is an ordinary V2 consumer there, so that worker's channel keeps the message's one copy,
its attempts, timeout, TTL, dead-lettering and its FIN. Here the message is *lent*: it waits in
``queue`` until a consumer has room, is delivered and tracked in flight like any other, and
its end (FIN, REQ, a timeout here, its consumer leaving) goes back over the link it came by;
it never enters this worker's queue or disk. A message is lent exactly while its id is in
``lent``.

One channel's order. Lent messages wait here in publish order (``add`` merges each batch
in). While both they and the channel's own wait, its consumers are handed the oldest first, in
runs (``merge``): the order in which one nsqd's queue would have them. A message's age is its
publish time; one of this worker's that was delivered and requeued went to the back of the
queue then, so its age is its last delivery. (A lent message's requeues on the worker that lent
it are not known here: it is ordered by its publish time.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from itertools import pairwise
from time import time_ns
from typing import Protocol

from .message import ConsumerLike, Message
from .timed_queue import Scheduler, TimedQueue


class Lender(Protocol):
    """The link a lent message came by: its end goes back there."""

    def fin(self, ids: list[bytes]) -> None: ...
    def req(self, msg_id: bytes, timeout_ms: int) -> None: ...
    def touch(self, msg_id: bytes) -> None: ...


class Demand(Protocol):
    """The relay: told when this channel's room for lent messages may have changed."""

    def demand_changed(self) -> None: ...
    def consumers_changed(self) -> None: ...


class _Gone:
    """The lender of a message whose link closed: its end goes nowhere (the other worker
    already took its copy back)."""

    def fin(self, ids: list[bytes]) -> None:
        pass

    def req(self, msg_id: bytes, timeout_ms: int) -> None:
        pass

    def touch(self, msg_id: bytes) -> None:
        pass


GONE = _Gone()


class Borrower(Protocol):
    """What lent messages need of the channel they are delivered by (``core/channel.py``)."""

    loop: Scheduler
    clients: dict[int, ConsumerLike]
    in_flight: dict[bytes, Message]
    tq: TimedQueue

    @property
    def queue(self) -> OwnQueue: ...
    def fly_own(self, client: ConsumerLike, n: int) -> list[Message]:
        """``n`` of its own queued messages in flight to ``client``, not yet sent: those
        that flew (some may be screened out)."""


class OwnQueue(Protocol):
    """The channel's own queue (``core/queue.MessageQueue``), as the merge reads it."""

    def __len__(self) -> int: ...
    def oldest(self) -> Iterator[Message] | None: ...


def _timestamp(m: Message) -> int:
    return m.timestamp


def _interleave(
    own: Iterator[Message], lent: Iterator[Message], n: int, room: int, offset: float
) -> list[tuple[bool, int]]:
    """The next up to ``n`` messages (``room`` body bytes, at least one) of the channel's own
    queue and the lent one, oldest first: runs of (own?, count). An own message's age is its
    publish time, or its last delivery (``offset`` turns the loop's clock into ns) if it was
    requeued; a tie goes to the channel's own."""
    runs: list[tuple[bool, int]] = []
    o = next(own, None)
    ok = 0 if o is None else (o.timestamp if not o.attempts else int(o.delivery_ts * 1e9 + offset))
    lm = next(lent, None)
    side = True
    count = 0
    size = 0
    for _ in range(n):
        if o is not None and (lm is None or ok <= lm.timestamp):
            m, is_own = o, True
            o = next(own, None)
            if o is not None:
                ok = o.timestamp if not o.attempts else int(o.delivery_ts * 1e9 + offset)
        elif lm is not None:
            m, is_own = lm, False
            lm = next(lent, None)
        else:
            break
        size += m.size
        if size > room and (count or runs):
            break
        if is_own is side:
            count += 1
        else:
            if count:
                runs.append((side, count))
            side, count = is_own, 1
    if count:
        runs.append((side, count))
    return runs


class Lending:
    __slots__ = ("demand", "lent", "queue")

    def __init__(self, demand: Demand) -> None:
        self.demand = demand
        #: id -> the link it came by, for every lent message here (queued or in flight).
        self.lent: dict[bytes, Lender] = {}
        #: Lent messages not yet delivered to a consumer.
        self.queue: deque[Message] = deque()

    def pump(self, channel: Borrower) -> None:
        """Lent messages to the channel's consumers with room left after its own, then the
        relay is told how much room is left (it asks the other workers for that much). Only
        this worker's own consumers: a lent message is never lent on to another worker's
        link (a chain of lenders could bring it back here by a second link, and the FIN of
        one copy would go to the other's lender)."""
        if self.queue:
            for client in list(channel.clients.values()):
                if client.is_link:
                    continue
                window = client.rdy - client.in_flight_count
                if window <= 0 or client.write_paused:
                    continue
                room = client.output_room()
                if room <= 0:
                    continue
                batch = self.take(window, room)
                if not batch:
                    break
                self._deliver(channel, client, batch)
                if not self.queue:
                    break
        self.demand.demand_changed()

    def merge(self, channel: Borrower) -> None:
        """Lent messages and the channel's own both waiting: to its consumers oldest first
        (see the module's doc). For each consumer with room, one walk down both queues picks
        its next messages in that order, and they go out in one write; the walk costs what
        it hands out, however finely the two queues interleave. Stops when one queue is
        empty (``pump`` and the channel's own pump hand out the rest)."""
        offset = time_ns() - channel.loop.time() * 1e9
        own_queue = channel.queue
        for client in list(channel.clients.values()):
            if not self.queue or not len(own_queue):
                return
            if client.is_link:
                continue
            window = client.rdy - client.in_flight_count
            room = client.output_room()
            if window <= 0 or room <= 0 or client.write_paused:
                continue
            own_iter = own_queue.oldest()
            if own_iter is None:
                return  # a backlog on disk: older, the channel's own go first
            runs = _interleave(own_iter, iter(self.queue), window, room, offset)
            sent: list[Message] = []
            for own, n in runs:
                if own:
                    sent += channel.fly_own(client, n)
                else:
                    sent += self._fly(channel, client, self.take(n, 0))
            if sent:
                client.send_messages(sent)

    def _deliver(self, channel: Borrower, client: ConsumerLike, batch: list[Message]) -> None:
        sent = self._fly(channel, client, batch)
        if sent:
            client.send_messages(sent)

    def _fly(self, channel: Borrower, client: ConsumerLike, batch: list[Message]) -> list[Message]:
        """Lent messages in flight to ``client``, not yet sent. Screened, counted and
        attempted by the channel that lent them."""
        now = channel.loop.time()
        fly = channel.in_flight.setdefault
        sent = []
        for msg in batch:
            if fly(msg.id, msg) is not msg:  # not expected (ids carry the worker's node id)
                self.give_back(msg)
                continue
            msg.client = client
            msg.delivery_ts = now
            sent.append(msg)
        channel.tq.push_many(sent, now + client.msg_timeout)
        return sent

    def add(self, msgs: list[Message], lender: Lender) -> None:
        lent = self.lent
        for m in msgs:
            lent[m.id] = lender
        q = self.queue
        if (q and msgs and msgs[0].timestamp < q[-1].timestamp) or any(
            a.timestamp > b.timestamp for a, b in pairwise(msgs)
        ):
            self.queue = deque(sorted([*q, *msgs], key=_timestamp))  # publish order
        else:
            q.extend(msgs)

    def take(self, n: int, room: int) -> list[Message]:
        """Up to ``n`` queued lent messages, their bodies within ``room`` bytes (at least one;
        0: no limit)."""
        q = self.queue
        out: list[Message] = []
        size = 0
        while q and len(out) < n:
            m = q[0]
            size += m.size
            if out and room and size > room:
                break
            out.append(q.popleft())
        return out

    def finished(self, ids: list[bytes]) -> None:
        """FIN'd here: each to its lender, one FIN run per lender."""
        runs: dict[Lender, list[bytes]] = {}
        last: Lender | None = None
        run: list[bytes] = []
        pop = self.lent.pop
        for i in ids:
            lender = pop(i, None)
            if lender is None:
                continue
            if lender is not last:  # FINs come in runs from one link
                last = lender
                run = runs.setdefault(lender, [])
            run.append(i)
        for lender, fins in runs.items():
            lender.fin(fins)

    def give_back(self, msg: Message, timeout_ms: int = 0) -> bool:
        """REQ, a timeout here or its consumer gone: back to its lender (True if it was lent)."""
        lender = self.lent.pop(msg.id, None)
        if lender is None:
            return False
        lender.req(msg.id, timeout_ms)
        return True

    def touched(self, msg_id: bytes) -> None:
        lender = self.lent.get(msg_id)
        if lender is not None:
            lender.touch(msg_id)

    def give_back_waiting(self, lender: Lender) -> None:
        """What ``lender`` lent that waits here, not yet delivered: back to it (its worker's
        copy got consumers of its own, who are served there first)."""
        back = [m for m in self.queue if self.lent.get(m.id) is lender]
        if not back:
            return
        self.queue = deque(m for m in self.queue if self.lent.get(m.id) is not lender)
        for m in back:
            del self.lent[m.id]
            lender.req(m.id, 0)

    def forget(self, lender: Lender | None = None) -> None:
        """The link is gone (its worker requeues what it lent), or the channel is emptied or
        closed: drop what it lent that waits here; in flight ones end with their consumer."""
        if lender is None:
            for m in self.queue:
                self.lent.pop(m.id, None)
            self.queue.clear()
            self.lent = dict.fromkeys(self.lent, GONE)
            return
        self.queue = deque(m for m in self.queue if self.lent.get(m.id) is not lender)
        lent = self.lent
        for i in [i for i, v in lent.items() if v is lender]:
            lent[i] = GONE  # in flight here: still not this worker's, so never kept here
