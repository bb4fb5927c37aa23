"""A channel: one queue of a topic's messages, shared by competing consumers.

Theory of operation. Messages arrive through ``put`` (from the topic's fan-out, a requeue or
a due deferral) into a ``MessageQueue``. Delivery is pull-based and batched: whenever a
consumer may have become ready (RDY raised, a FIN/REQ/timeout lowered its in-flight count,
its socket drained) or a message arrived, the channel schedules one ``_pump`` for the end of
the loop turn. The pump hands each ready consumer (``in_flight < RDY``, nsqd's window rule;
RDY is never decremented) a share of the queued messages in one call, so the per-message cost
is a few attribute writes, a dict insert and a heap push: no task, future or timer per message.

Messages in flight or deferred are kept in the channel's ``ledger`` (``core/in_flight.py``:
their deadlines in one ``TimedQueue``, second copies of an ID in flight waiting behind it); the
channel decides what happens to one that leaves. When a consumer disconnects its in-flight
messages go back to the head of the queue at once (nsqd waits for their timeout; README,
"Differences from nsqd").

A replicated topic's channel (``windows`` set) also keeps, per partition, what it is
responsible for and done with, behind one object it calls (``core/windows.py``): FIN, expiry
and dead-lettering mark offsets done, a REQ or timeout notes attempts, and a message whose
offset is no longer pending here (another node took the partition's channel state over) is
dropped at delivery.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import Protocol

from .backend import BackendQueue, InFlightKeeper
from .errors import (
    AlreadyDeferred,
    Exiting,
    QueueFull,
    TooManyConsumers,
)
from .in_flight import InFlight
from .lending import Lending
from .lifecycle import Bounds, Screen
from .message import ConsumerLike, Message
from .queue import MessageQueue
from .timed_queue import TICK, Scheduler
from .windows import PartitionWindows

log = logging.getLogger("pynsqd")


class ChannelOwner(Protocol):
    """What a channel needs of its topic and of nsqd."""

    name: str

    def channel_emptied_of_clients(self, channel: Channel) -> None: ...
    def dead_letter(self, channel: Channel, msgs: list[Message]) -> OSError | QueueFull | None:
        """Publish messages that used up their attempts to the channel's dead-letter topic;
        the error if they could not be stored there (they then stay on the channel)."""

    def metadata_changed(self) -> None:
        """A pause flag changed (nsqd persists its metadata)."""

    def log_handed(self) -> int:
        """The retained log's hand-off position (every offset before it reached the channels)."""


class Channel:
    __slots__ = (
        "_pump_pending",
        "_rr",
        "bounds",
        "clients",
        "deferred",
        "e2e_sink",
        "ephemeral",
        "exiting",
        "held",
        "in_flight",
        "keeper",
        "ledger",
        "lending",
        "loop",
        "max_consumers",
        "max_msg_timeout",
        "message_count",
        "name",
        "paused",
        "queue",
        "requeue_count",
        "screen",
        "stale_count",
        "timeout_count",
        "topic",
        "tq",
        "windows",
    )

    def __init__(
        self,
        topic: ChannelOwner,
        name: str,
        loop: Scheduler,
        *,
        mem_queue_size: int,
        backend: BackendQueue,
        max_msg_timeout: float,
        max_consumers: int = 0,
        ephemeral: bool = False,
        keeper: InFlightKeeper | None = None,
    ) -> None:
        self.topic = topic
        self.name = name
        self.loop = loop
        self.ephemeral = ephemeral
        self.queue = MessageQueue(mem_queue_size, backend, keeper)
        backend.on_deferred = self.put_deferred
        self.max_msg_timeout = max_msg_timeout
        self.max_consumers = max_consumers
        self.clients: dict[int, ConsumerLike] = {}
        #: Messages in flight and deferred (``core/in_flight.py``); its books, by their names.
        self.ledger = InFlight(loop, self._on_due, (topic.name, name))
        self.in_flight = self.ledger.flying
        self.deferred = self.ledger.deferred
        self.tq = self.ledger.tq
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.requeue_count = 0
        self.timeout_count = 0
        self._pump_pending = False
        self._rr = 0
        #: Called with (now_ns - msg.timestamp) for each FIN when e2e latency is tracked.
        self.e2e_sink: Callable[[int], None] | None = None
        # pynsqd's message lifecycle (``core/lifecycle.py``); all off by default.
        self.screen = Screen(self, lambda msgs: topic.dead_letter(self, msgs))
        self.bounds = Bounds(self)
        #: A replicated topic's channel: per partition (origin node), what it is responsible
        #: for and done with (``core/offsets.py``; checkpointed by ``cluster/checkpoints.py``).
        #: None: not replicated (no cost).
        self.windows: PartitionWindows | None = None
        #: Delivery waits (a replicated channel being restored at start).
        self.held = False
        #: Messages not delivered because another node took their partition's state over.
        self.stale_count = 0
        #: With ``--workers``: messages other workers' channels lend to this one's consumers
        #: (``core/lending.py``). None: one process (no cost).
        self.lending: Lending | None = None
        #: With ``--mem-queue-size=0``: the backend keeps what was read from it until this
        #: channel is done with it (``core.backend.InFlightKeeper``). None: no cost.
        self.keeper = keeper

    def set_lifecycle(
        self, max_attempts: int, msg_ttl_ns: int, max_depth: int, policy: str, max_bytes: int = 0
    ) -> None:
        """New settings; they apply from the next delivery (nothing in flight changes)."""
        self.screen.set(max_attempts, msg_ttl_ns)
        self.bounds.set(max_depth, policy, max_bytes)
        if self.clients:
            self.schedule_pump()

    def __repr__(self) -> str:
        return f"Channel({self.topic.name}:{self.name})"

    @property
    def depth(self) -> int:
        return len(self.queue) + self.ledger.waiting()

    def _release(self, ids: list[bytes]) -> None:
        """IDs that left flight: a copy waiting behind each goes to the head of the queue."""
        back = self.ledger.release(ids)
        if back:
            self._store_again(back, front=True)
            self.schedule_pump()

    def _store_again(self, msgs: list[Message], *, front: bool = False) -> None:
        """Messages back from flight or deferral, queued again (``front``: at its head): the
        keeper hears they are stored (if the backend fails they stay in memory, said once)."""
        err = self.queue.put_front(msgs) if front else self.queue.keep_many(msgs)
        if err is not None:
            self._kept_in_memory(len(msgs), err)
        elif self.keeper is not None and msgs:
            self.keeper.settled([m.id for m in msgs])

    # -- input ----------------------------------------------------------------------------

    def put_many(self, msgs: list[Message], *, mixed: bool = False) -> OSError | None:
        """Messages from the topic: counted, queued (or deferred), and offered to consumers.

        One publish is all deferred (DPUB) or none, so only its first message is looked at;
        ``mixed``: a backlog, where deferred and plain messages may come in any order, so each
        one is. Never loses them: if the backend fails they stay in memory and the error is
        returned.
        """
        self.message_count += len(msgs)
        plain = msgs
        if (mixed or msgs[0].defer_until_ns) and self.keeper is None:
            plain = [m for m in msgs if not m.defer_until_ns]
            for m in msgs:
                if m.defer_until_ns:
                    self._defer_until_ns(m)
        # With a keeper (--mem-queue-size=0) a DPUB is stored like any message, with its due
        # time: read back, it waits in the timed queue until due, kept by the keeper.
        return self._queued(len(plain), self.queue.keep_many(plain)) if plain else None

    def put_raw(self, records: list[bytes]) -> OSError | None:
        """Encoded messages moved from the topic's backend (never deferred); as ``put_many``."""
        self.message_count += len(records)
        return self._queued(len(records), self.queue.keep_raw(records))

    def _queued(self, n: int, err: OSError | None) -> OSError | None:
        """``n`` new messages are queued (or held in memory: ``err``): offered to consumers."""
        if err is not None:
            self._kept_in_memory(n, err)
        if self.clients:
            self.schedule_pump()
        return err

    def _kept_in_memory(self, n: int, err: OSError) -> None:
        log.warning(
            "CHANNEL(%s:%s): failed to write %d message(s) to disk, keeping them in memory "
            "(%d held past --mem-queue-size) - %s",
            self.topic.name,
            self.name,
            n,
            self.queue.overflow_count,
            err,
        )

    def put_deferred(self, msgs: list[Message]) -> None:
        """Deferred messages read back from the backend: into the timed queue, uncounted."""
        for m in msgs:
            self._defer_until_ns(m)

    def _defer_until_ns(self, msg: Message) -> None:
        # The due time is wall-clock (it survives restarts); the timed queue runs on loop time.
        from time import time_ns

        # loop.time() counts whole milliseconds (uvloop's uv_now, floored) and the timed queue
        # fires a tick early, so the due time is rounded up by a tick, and ``defer_until_ns``
        # stays set until _on_due checks it against the wall clock: never early.
        delay = max(0.0, (msg.defer_until_ns - time_ns()) / 1e9)
        self.ledger.defer(msg, self.loop.time() + delay + TICK)

    # -- delivery -------------------------------------------------------------------------

    def schedule_pump(self) -> None:
        if not self._pump_pending:
            self._pump_pending = True
            self.loop.call_soon(self._pump)

    def _pump(self) -> None:
        self._pump_pending = False
        if self.paused or self.exiting or self.held:
            return
        lending = self.lending
        if lending is not None and lending.queue and len(self.queue):
            lending.merge(self)  # --workers: lent and own both waiting, oldest first
        if len(self.queue):
            self._pump_queue()
        if lending is not None:
            lending.pump(self)

    def fly_own(self, client: ConsumerLike, n: int) -> list[Message]:
        """``n`` queued messages in flight to ``client``, not yet sent (``core.lending``'s
        merge sends them with lent ones, in one write): those that flew."""
        return self._fly(client, self.queue.take(n))

    def _pump_queue(self) -> None:
        queue = self.queue
        ready = [
            c for c in self.clients.values() if c.rdy > c.in_flight_count and not c.write_paused
        ]
        if len(ready) > 1:  # rotate so that no consumer is always first
            self._rr = (self._rr + 1) % len(ready)
            ready = ready[self._rr :] + ready[: self._rr]
        while ready:
            share = -(-len(queue) // len(ready))
            still_ready = []
            for client in ready:
                # A consumer is handed no more than its connection may buffer (bytes, not only
                # RDY): one that does not read pins at most that, the rest stays here.
                room = client.output_room()
                if room <= 0:
                    continue
                window = client.rdy - client.in_flight_count
                batch = queue.take(min(window, share), room)
                if not batch:
                    return
                sent = self._deliver(client, batch)
                if window > sent and client.output_room() > 0:
                    still_ready.append(client)
            if not len(queue):
                return
            ready = still_ready

    def _deliver(self, client: ConsumerLike, batch: list[Message]) -> int:
        """Hand ``batch`` to ``client``; returns how many it got."""
        batch = self._fly(client, batch)
        if batch:
            client.send_messages(batch)
        return len(batch)

    def _fly(self, client: ConsumerLike, batch: list[Message]) -> list[Message]:
        """``batch`` screened (stale, expired, unsampled ones dropped) and in flight to
        ``client``: what is to be sent."""
        flown = self._screen_and_fly(client, batch)
        if self.keeper is not None:
            self._tell_keeper(batch, flown)
        return flown

    def _screen_and_fly(self, client: ConsumerLike, batch: list[Message]) -> list[Message]:
        if self.windows is not None:
            batch, stale = self.windows.screen(batch)
            self.stale_count += stale
            if not batch:
                return []
        if self.screen.on:
            batch = self.screen.batch(batch)
            if not batch:
                return []
        if client.sample_rate:
            # nsqd drops unsampled messages from the channel (README, "Differences from nsqd").
            rate = client.sample_rate
            batch = [m for m in batch if random.randrange(100) <= rate]
            if not batch:
                return []
        now = self.loop.time()
        return self.ledger.fly(batch, client, now, now + client.msg_timeout)

    def _tell_keeper(self, batch: list[Message], flown: list[Message]) -> None:
        """The keeper hears of the deliveries, and of the messages of ``batch`` dropped (not
        flown, and not waiting behind a copy in flight)."""
        keeper = self.keeper
        assert keeper is not None
        if flown:
            keeper.delivered(flown)
        if len(flown) < len(batch):
            sent = {id(m) for m in flown}
            behind = self.ledger.behind
            keeper.settled(
                [
                    m.id
                    for m in batch
                    if id(m) not in sent and not any(w is m for w in behind.get(m.id, ()))
                ]
            )

    # -- consumer commands ----------------------------------------------------------------

    def finish_many(self, client: ConsumerLike, ids: list[bytes]) -> None:
        """FIN a run of ids (one pipelined read's worth), the one body of FIN. The ids before
        the first that is not this client's to finish are finished; that one raises
        NotInFlight or NotOwner, as every consumer command of the channel raises."""
        sink = self.e2e_sink
        now_ns = time.time_ns() if sink is not None else 0
        done, err = self.ledger.finish_many(client, ids, sink, now_ns)
        client.finished(done)
        if self.keeper is not None and done:
            self.keeper.settled(ids[:done])
        if self.windows is not None and done:
            self.windows.mark_done(ids[:done])
        if self.ledger.behind:
            self._release(ids[:done])
        if self.lending is not None and done:
            self.lending.finished(ids[:done])
            self.schedule_pump()
        elif done and len(self.queue):
            self.schedule_pump()
        if err is not None:
            raise err

    def requeue(self, client: ConsumerLike, msg_id: bytes, timeout: float) -> None:
        """REQ: back to the queue now (timeout 0) or deferred by ``timeout`` seconds."""
        if self.exiting:
            raise Exiting()
        msg = self.ledger.take(client, msg_id)
        if timeout > 0 and msg_id in self.deferred:
            raise AlreadyDeferred(msg_id)
        self.ledger.land(msg)
        client.requeued()
        if self.lending is not None and self.lending.give_back(msg, int(timeout * 1000)):
            self.schedule_pump()  # counted by the channel that lent it
            return
        self.requeue_count += 1
        if self.windows is not None:
            due_ms = time.time_ns() // 1_000_000 + int(timeout * 1000) if timeout > 0 else 0
            self.windows.note_attempts((msg,), due_ms)
        if timeout > 0:
            self.ledger.defer(msg, self.loop.time() + timeout)
            if self.keeper is not None:
                self.keeper.deferred(msg_id, time.time_ns() + int(timeout * 1e9))
        else:
            self._store_again([msg])
            self.bounds.count_over(1)
        if self.ledger.behind:
            self._release([msg_id])
        self.schedule_pump()

    def touch(self, client: ConsumerLike, msg_id: bytes) -> None:
        msg = self.ledger.take(client, msg_id)
        now = self.loop.time()
        self.ledger.retime(
            msg, min(now + client.msg_timeout, msg.delivery_ts + self.max_msg_timeout)
        )
        if self.lending is not None:
            self.lending.touched(msg_id)

    # -- timeouts and deferrals -----------------------------------------------------------

    def _on_due(self, msgs: list[Message]) -> None:
        lending = self.lending
        ready, timed_out = self.ledger.due(msgs, None if lending is None else lending.give_back)
        for client, n in timed_out.items():
            client.released(n)
        count = sum(timed_out.values())
        self.timeout_count += count
        if count and self.windows is not None:
            self.windows.note_attempts(ready)
        self._store_again(ready)
        if count:
            self.bounds.count_over(count)
            if self.ledger.behind:
                self._release([m.id for m in ready if m.id in self.ledger.behind])
        self.schedule_pump()

    # -- consumers ------------------------------------------------------------------------

    def add_client(self, client: ConsumerLike) -> None:
        if self.exiting:
            raise Exiting()
        if client.id in self.clients:
            return
        if self.max_consumers and len(self.clients) >= self.max_consumers:
            raise TooManyConsumers(self.topic.name, self.name, self.max_consumers)
        self.clients[client.id] = client
        if self.lending is not None:
            self.lending.demand.consumers_changed()

    def remove_client(self, client: ConsumerLike) -> None:
        """A consumer left: requeue its in-flight messages at once (README: differences)."""
        if self.clients.pop(client.id, None) is None:
            return
        self.requeue_client_messages(client)
        if self.lending is not None:
            self.lending.demand.consumers_changed()
        if self.ephemeral and not self.clients and not self.exiting:
            self.topic.channel_emptied_of_clients(self)

    def requeue_client_messages(self, client: ConsumerLike) -> None:
        """Its in-flight messages go back to the head of the queue, within ``--mem-queue-size``
        (the rest to the backend), and count as requeued."""
        mine = self.ledger.land_all(client)
        if not mine:
            return
        client.released(len(mine))
        if self.lending is not None:
            give_back = self.lending.give_back
            mine = [m for m in mine if not give_back(m)]
            if not mine:
                self.schedule_pump()
                return
        self.requeue_count += len(mine)
        if self.windows is not None:
            self.windows.note_attempts(mine)
        self._store_again(mine, front=True)
        self.bounds.count_over(len(mine))
        if self.ledger.behind:
            self._release([m.id for m in mine])
        self.schedule_pump()

    # -- administration -------------------------------------------------------------------

    def pause(self) -> None:
        self.paused = True
        self.topic.metadata_changed()  # nsqd.dat keeps the paused flag

    def unpause(self) -> None:
        self.paused = False
        self.schedule_pump()
        self.topic.metadata_changed()

    def empty(self) -> None:
        """Drop queued, in-flight and deferred messages (nsqd's ``Empty``)."""
        self.ledger.clear()
        self.screen.passing.clear()
        for c in self.clients.values():
            c.emptied()
        self.queue.empty()
        if self.lending is not None:
            self.lending.forget()
        if self.windows is not None:
            self.windows.emptied(self.topic.log_handed())

    def close(self, *, delete: bool) -> None:
        """Stop the channel. On delete its messages go; otherwise they are kept in the backend."""
        self.exiting = True
        for c in list(self.clients.values()):
            c.close_for_exit()
        self.clients.clear()
        if delete:
            self.ledger.clear()
            self.queue.backend.delete()
            return
        # In-flight and deferred messages go back to the queue so that nothing is lost; the
        # deferred ones keep their due time (nsqio/nsq#1107).
        lent = self.lending.lent if self.lending is not None else {}
        kept = self.ledger.keep_at_exit(self.loop.time(), time.time_ns(), lent)
        leftovers = self.queue.drain_memory() + kept
        if leftovers:
            self.queue.backend.put_many(leftovers)
            if self.keeper is not None:
                self.keeper.settled([m.id for m in kept])  # stored again
        self.queue.backend.close()
