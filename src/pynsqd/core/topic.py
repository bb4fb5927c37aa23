"""A topic: takes published messages and gives every channel its own copy.

Theory of operation. nsqd runs a goroutine per topic that moves messages to channels. Here
fan-out is a plain call on the publisher's path: when the topic has channels, is not paused and
holds no backlog, ``put_many`` copies the batch into each channel at once (the first channel
keeps the original objects, the others get copies sharing the body bytes). Otherwise messages
wait in the topic's own queue (memory, then backend) — a topic with no channels keeps its
messages until one appears — and a drain moves them on, a bounded batch per loop turn, so a
large backlog never stalls the event loop. New messages queue behind the backlog, keeping order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

from ..protocol.headers import Blocks, WireForm, body_bytes, cut
from . import tracing
from .backend import BackendQueue, MessageLog
from .channel import Channel
from .dedup import DEFAULT_RECORDS, DEFAULT_WINDOW_NS
from .errors import NotRetained, QueueFull
from .guid import GUIDFactory
from .handoff import HandOff
from .idempotent import check_everywhere, same_bodies
from .message import Message
from .offsets import offset_ids
from .queue import MessageQueue
from .timed_queue import Scheduler
from .windows import track_partition

log = logging.getLogger("pynsqd")

#: Messages moved from a topic's backlog to its channels per loop turn: about a millisecond of
#: work, so that a large backlog never delays other clients' commands by more than that.
DRAIN_BATCH = 1024


class TopicOwner(Protocol):
    """What a topic needs of nsqd."""

    def make_channel(self, topic: Topic, name: str) -> Channel: ...
    def channel_deleted(self, topic: Topic, channel: Channel) -> None: ...
    def topic_emptied_of_channels(self, topic: Topic) -> None: ...
    def dead_letter(
        self, topic: Topic, channel: Channel, msgs: list[Message]
    ) -> OSError | QueueFull | None:
        """Messages of ``channel`` that used up their attempts, for its dead-letter topic."""

    def metadata_changed(self) -> None:
        """A topic's or channel's pause flag changed (nsqd persists nsqd.dat)."""


class Topic:
    __slots__ = (
        "_behind",
        "_drain_pending",
        "_owner",
        "bound_policy",
        "bounded",
        "channels",
        "dedup_window",
        "dropped_count",
        "duplicate_count",
        "ephemeral",
        "exiting",
        "guid",
        "hand_off",
        "kept_by",
        "log",
        "loop",
        "max_depth",
        "message_bytes",
        "message_count",
        "name",
        "on_bounds",
        "on_channel_added",
        "origin",
        "other_logs",
        "paused",
        "queue",
    )

    def __init__(
        self,
        name: str,
        owner: TopicOwner,
        loop: Scheduler,
        *,
        node_id: int,
        mem_queue_size: int,
        backend: BackendQueue,
        ephemeral: bool = False,
    ) -> None:
        self.name = name
        self._owner = owner
        self.loop = loop
        self.ephemeral = ephemeral
        self.guid = GUIDFactory(node_id)
        self.queue = MessageQueue(mem_queue_size, backend)
        backend.on_deferred = self.put_deferred
        self.channels: dict[str, Channel] = {}
        self.paused = False
        self.exiting = False
        self.message_count = 0
        self.message_bytes = 0
        self._drain_pending = False
        #: Messages published behind a backlog since the last drain: the next drain hands
        #: over that many on top of its batch, so a backlog shrinks however fast publishers
        #: add to it (one batch a turn fell behind 16 MPUB connections at once, and the
        #: channels' consumers starved with RDY to spare).
        self._behind = 0
        self.on_channel_added: Callable[[Channel], None] | None = None
        #: The retained log of a replayable topic; None: no retention (no cost).
        self.log: MessageLog | None = None
        #: ``--workers``: the worker of this node that keeps this topic's queue, when it is
        #: another one (``server/workers/peers.py``): a retained topic's log, or a bounded topic's
        #: queues (so that its bound is the node's). Publishes go there. None: this one.
        self.kept_by: int | None = None
        #: Told when ``bounded`` was recomputed (``--workers``: where the topic is kept).
        self.on_bounds: Callable[[Topic], None] | None = None
        # pynsqd's bound on the topic's own backlog while it has no channels (0: none).
        self.max_depth = 0
        self.bound_policy = "reject"
        self.bounded = False
        self.dropped_count = 0
        #: Idempotent publishes answered OK without a new record (``core/dedup.py``).
        self.duplicate_count = 0
        #: Its window: (records, ns) (``core/dedup.py``; the topic's settings).
        self.dedup_window = (DEFAULT_RECORDS, DEFAULT_WINDOW_NS)
        #: The other partitions' logs this node holds copies of (a replicated topic): a
        #: publish retried here after its first node died is recognised in them.
        #: Each with whether it is settled (says all its leader holds: no takeover under way).
        self.other_logs: Callable[[], list[tuple[MessageLog, bool]]] | None = None
        #: A replicated topic: this node's id, the origin of its partition. Its messages get
        #: offset IDs (``core/offsets.py``) and its channels keep done-windows. None: not
        #: replicated (no cost).
        self.origin: int | None = None
        #: A retained topic's hand-off from its log to its channels (``core/handoff.py``).
        self.hand_off = HandOff(self)

    def __repr__(self) -> str:
        return f"Topic({self.name})"

    # -- a replicated topic: its place in the cluster (``cluster/checkpoints.py``) ---------

    def replicate_as(self, origin: int) -> None:
        """Replicated, as node ``origin``'s partition: its publishes get offset IDs."""
        self.origin = origin

    @property
    def depth(self) -> int:
        log = self.log
        return len(self.queue) + (log.latest - log.handed if log is not None else 0)

    # -- publishing -----------------------------------------------------------------------

    def put_bodies(self, bodies: list[bytes], defer_ms: int = 0, headers: Blocks = None) -> int:
        """PUB, MPUB, DPUB: make messages with fresh IDs (``headers``: their blocks, or a
        ``WireForm``) and publish them. Returns the log's offset past them (-1: the topic keeps
        no log). Raises OSError (not stored) or QueueFull (a bounded queue with policy reject
        has no room: nothing stored)."""
        size = body_bytes(bodies, headers)
        if self.bounded:
            self._check_room(len(bodies), size)
        if len(bodies) == 1 and not defer_ms and not isinstance(headers, WireForm):
            body = bodies[0]  # a single PUB: no batch machinery
            ids = self.guid.new_ids(1) if self.origin is None else self._offset_ids(1)
            one = [Message(ids[0], body, time.time_ns(), 0, headers[0] if headers else b"")]
            return self._publish(one, len(body))
        ts = time.time_ns()
        n = len(bodies)
        ids = self.guid.new_ids(n) if self.origin is None else self._offset_ids(n)
        msgs = Message.many(ids, bodies, ts, headers)
        if defer_ms:
            due = ts + defer_ms * 1_000_000
            for m in msgs:
                m.defer_until_ns = due
        return self._publish(msgs, size)

    def _publish(
        self, msgs: list[Message], size: int, identity: tuple[bytes, int] | None = None
    ) -> int:
        """Every publish's ending: ``msgs`` (``size`` body bytes) into the log (returns its
        offset past them) or the queues (-1), counted, the bounds kept, traced (a replicated
        topic's records until the partition's HW passes them: their commit)."""
        end = -1
        if self.log is not None:
            end = self._put_logged(msgs, identity)
        else:
            self.put_many(msgs)
        self.message_count += len(msgs)
        self.message_bytes += size
        if self.bounded:
            self._trim()
        if tracing.TRACER is not None:
            tracing.TRACER.published(self.name, msgs, end if self.origin is not None else -1)
        return end

    def put_identified(
        self,
        bodies: list[bytes],
        defer_ms: int,
        producer: bytes,
        first: int,
        headers: Blocks = None,
    ) -> tuple[int, int]:
        """An idempotent PUB, MPUB or DPUB (``core/dedup.py``): the messages numbered from
        ``first`` that the log already holds are not written again. Returns (how many were
        duplicates, the end of what the answer waits for: the log's end, or past the last
        duplicate's record). Raises NotRetained, DedupError, OSError, QueueFull."""
        log = self.log
        if log is None:
            raise NotRetained(self.name)
        log.set_dedup(*self.dedup_window)
        bodies, headers = cut(bodies, headers)  # the dedup compares bodies
        now = time.time_ns()
        if self.other_logs is None:
            verdict = log.identities().check(producer, first, len(bodies), now, log.latest)
            if verdict.offsets:
                same_bodies(log, producer, first, bodies, verdict)
        else:
            verdict = check_everywhere(log, self.other_logs(), producer, first, bodies, now)
        dups = verdict.duplicates
        self.duplicate_count += dups
        if dups == len(bodies):
            return dups, verdict.last_offset + 1
        new = bodies[dups:] if dups else bodies
        if self.bounded:
            self._check_room(len(new), sum(map(len, new)))
        ts = now
        ids = self.guid.new_ids(len(new)) if self.origin is None else self._offset_ids(len(new))
        msgs = Message.many(ids, new, ts, headers[dups:] if headers is not None else None)
        if defer_ms:
            due = ts + defer_ms * 1_000_000
            for m in msgs:
                m.defer_until_ns = due
        return dups, self._publish(msgs, sum(map(len, new)), (producer, first + dups))

    def _offset_ids(self, n: int) -> list[bytes]:
        """IDs for the next ``n`` offsets of this node's partition (the log appends them next)."""
        assert self.origin is not None and self.log is not None
        return offset_ids(self.origin, self.log.latest, n)

    def log_handed(self) -> int:
        return self.log.handed if self.log is not None else 0

    def put_many(self, msgs: list[Message]) -> None:
        """Raises OSError if a backend could not store the messages. Channels that could not
        write them keep them in memory (another channel may have stored them already), but
        the publisher is told: its OK means stored as ``--mem-queue-size`` says."""
        if self.channels and not self.paused and not len(self.queue):
            err = self.fan_out(msgs)
            if err is not None:
                raise err
        else:
            self.queue.put_many(msgs)
            self._behind += len(msgs)
            self.schedule_drain()

    def publish_existing(self, msgs: list[Message]) -> None:
        """Publish messages that keep their IDs (dead-lettering): as ``put_bodies``."""
        if self.bounded:
            self._check_room(len(msgs), sum(m.size for m in msgs))
        if self.origin is not None:  # a replicated topic's IDs say where a message is
            ids = self._offset_ids(len(msgs))
            msgs = [
                Message(i, m.body, m.timestamp, 0, m.headers)
                for i, m in zip(ids, msgs, strict=True)
            ]
        self._publish(msgs, sum(m.size for m in msgs))

    # -- bounds (pynsqd) ------------------------------------------------------------------

    def refresh_bounds(self) -> None:
        """Recompute ``bounded`` (a bound was set, or a channel came or went): publishing
        pays one attribute check while nothing is bounded."""
        self.bounded = bool(self.max_depth) or any(ch.bounds.on for ch in self.channels.values())
        in_bytes = any(ch.bounds.max_bytes for ch in self.channels.values())
        if in_bytes != self.queue.track_bytes:  # the topic's backlog counts for those bounds
            self.queue.count_bytes(in_bytes)
        if self.on_bounds is not None:
            self.on_bounds(self)

    def _check_room(self, n: int, size: int = 0) -> None:
        """Policy reject: refuse the whole publish if any bounded queue it goes to is full."""
        if self.channels:
            for ch in self.channels.values():
                bounds = ch.bounds
                if bounds.on and bounds.policy == "reject":
                    # What waits in the topic (paused, or not yet handed over) goes to every
                    # channel: it counts (its bytes only as far as they are in memory).
                    why = bounds.over(n + self.depth, size + self.queue.mem_bytes)
                    if why is not None:
                        raise QueueFull(
                            f"{self.name}:{ch.name}", bounds.depth, bounds.max_depth, why
                        )
        elif self.max_depth and self.bound_policy == "reject" and self.depth + n > self.max_depth:
            raise QueueFull(self.name, self.depth, self.max_depth)

    def _trim(self) -> None:
        """Policy drop-oldest: queues past their bound drop the messages next in line."""
        if self.channels:
            for ch in self.channels.values():
                if ch.bounds.on and ch.bounds.policy == "drop-oldest":
                    ch.bounds.trim()
            return
        excess = self.depth - self.max_depth
        if not self.max_depth or self.bound_policy != "drop-oldest" or excess <= 0:
            return
        dropped = 0
        if self.log is not None and self.log.handed < self.log.visible:
            step = min(excess, self.log.visible - self.log.handed)
            self.log.hand_to(self.log.handed + step)
            self.hand_off.save()
            dropped += step
        while dropped < excess and len(self.queue):
            dropped += self.queue.drop_oldest(excess - dropped)
        self.dropped_count += dropped

    def _put_logged(self, msgs: list[Message], identity: tuple[bytes, int] | None = None) -> int:
        """A replayable topic: the log is its queue. The batch is appended (OSError: nothing
        is published); then it goes to the channels at once if nothing is waiting, else it
        waits in the log, behind the backlog, and the drain hands it over in order. Returns
        the log's offset past the batch."""
        log = self.log
        assert log is not None
        first = log.append(msgs, identity)
        end = first + len(msgs)
        if (
            log.handed == first
            and log.visible > first
            and self.channels
            and not self.paused
            and not self.hand_off.held
            and not len(self.queue)
        ):
            err = self.fan_out(msgs)
            self.hand_off.handed_to(log.latest, first if err is not None else None)
            if err is not None:
                raise err
            return end
        self._behind += len(msgs)
        self.schedule_drain()
        return end

    def fan_out(self, msgs: list[Message], *, mixed: bool = False) -> OSError | None:
        """Every channel gets the messages; returns the first backend error (none are lost)."""
        channels = iter(self.channels.values())
        first = next(channels)
        err = None
        for ch in channels:
            err = ch.put_many([m.copy() for m in msgs], mixed=mixed) or err
        return first.put_many(msgs, mixed=mixed) or err

    def schedule_drain(self) -> None:
        if (
            not self._drain_pending
            and self.channels
            and not self.paused
            and not self.hand_off.held
            and (len(self.queue) or (self.log is not None and self.log.handed < self.log.visible))
        ):
            self._drain_pending = True
            self.loop.call_soon(self._drain)

    def _drain(self) -> None:
        self._drain_pending = False
        if self.paused or self.exiting or not self.channels or self.hand_off.held:
            return
        queue = self.queue
        tlog = self.log
        # A batch per turn, and what publishers added meanwhile: the backlog never grows
        # because of the drain (what channels cannot deliver waits in their own queues).
        n, self._behind = DRAIN_BATCH + self._behind, 0
        if tlog is not None and not len(queue):
            # The backlog in the log: handed over first, the position moved after (saved at
            # the end of the turn), so a crash repeats a batch, never skips one.
            batch, nxt = tlog.read_messages(tlog.handed, n)
            first = tlog.handed
            err = self.hand_off.hand_over(batch, first) if batch else None
            self.hand_off.handed_to(nxt, first if err is not None else None)
        elif queue.mem_depth:
            # DPUBs waiting here may be mixed with plain messages.
            self.fan_out(queue.take_memory(n), mixed=True)
        else:
            # From disk to disk: channels take the records still encoded, unless they have
            # room in memory. The topic's read is held until every channel has stored them, so
            # a crash at any instant leaves each message in the topic or in every channel (a
            # channel that cannot write keeps them in memory: see Channel.put_raw).
            backend = queue.backend
            records = backend.read_raw(n, hold=True)
            try:
                if records:
                    for ch in self.channels.values():
                        ch.put_raw(records)
            finally:
                backend.commit_reads()
        if self.bounded:
            self._trim()  # drop-oldest channels: the backlog handed over may pass their bound
        self.schedule_drain()

    # -- channels -------------------------------------------------------------------------

    def get_channel(self, name: str) -> Channel:
        """Get or create a channel; a new one starts receiving at once."""
        ch = self.channels.get(name)
        if ch is None:
            ch = self._owner.make_channel(self, name)
            if self.origin is not None and not ch.ephemeral and self.log is not None:
                # It gets the partition from the hand-off position on.
                track_partition(ch, self.origin, self.log.handed)
            self.channels[name] = ch
            self.refresh_bounds()
            if self.on_channel_added is not None:
                self.on_channel_added(ch)
            self.schedule_drain()
        return ch

    def delete_channel(self, name: str) -> bool:
        ch = self.channels.pop(name, None)
        if ch is None:
            return False
        self.refresh_bounds()
        ch.close(delete=True)
        self._owner.channel_deleted(self, ch)
        if self.ephemeral and not self.channels and not self.exiting:
            self._owner.topic_emptied_of_channels(self)
        return True

    def dead_letter(self, channel: Channel, msgs: list[Message]) -> OSError | QueueFull | None:
        return self._owner.dead_letter(self, channel, msgs)

    def channel_emptied_of_clients(self, channel: Channel) -> None:
        # An #ephemeral channel goes with its last consumer.
        if self.channels.get(channel.name) is channel:
            self.delete_channel(channel.name)

    # -- administration -------------------------------------------------------------------

    def put_deferred(self, msgs: list[Message]) -> None:
        """Deferred messages read back from the backend: straight to the channels."""
        if self.channels:
            self.fan_out(msgs)
        else:
            self.queue.put_many(msgs)

    def pause(self) -> None:
        self.paused = True
        self.metadata_changed()

    def unpause(self) -> None:
        self.paused = False
        self.schedule_drain()
        self.metadata_changed()

    def metadata_changed(self) -> None:
        """A pause flag changed: nsqd persists its metadata."""
        self._owner.metadata_changed()

    def empty(self) -> None:
        """Drop the topic's own queue (not its channels'), as nsqd's ``/topic/empty``; for a
        replayable topic, its backlog (the messages stay in the log, readable by offset)."""
        self.queue.empty()
        if self.log is not None:
            self.hand_off.restart(self.log.latest)

    def close(self, *, delete: bool) -> None:
        """Close every channel, then the topic; one channel's failure never stops the others
        from flushing (it is logged, and the first error is raised at the end)."""
        self.exiting = True
        first: Exception | None = None
        for name in list(self.channels):
            try:
                if delete:
                    self.delete_channel(name)
                else:
                    self.channels[name].close(delete=False)
            except Exception as err:
                log.error("CHANNEL(%s:%s): failed to close - %s", self.name, name, err)
                first = first or err
        try:
            self._close_queue(delete=delete)
        except Exception as err:
            log.error("TOPIC(%s): failed to close - %s", self.name, err)
            first = first or err
        if self.log is not None:
            try:
                self.log.delete() if delete else self.log.close()
            except Exception as err:
                log.error("TOPIC(%s): failed to close its log - %s", self.name, err)
                first = first or err
        if first is not None:
            raise first

    def _close_queue(self, *, delete: bool) -> None:
        if delete:
            self.queue.backend.delete()
            return
        leftovers = self.queue.drain_memory()
        if leftovers:
            self.queue.backend.put_many(leftovers)
        self.queue.backend.close()
