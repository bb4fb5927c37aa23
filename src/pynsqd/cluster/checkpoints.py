"""Channels of replicated topics across a failover: checkpoints, adoption, restore, take-back.

Theory of operation (``docs/replication.md``, "Channels across a failover"). A replicated
topic's messages have offset IDs and each of its channels keeps a ``DoneWindow`` per partition
(``core/offsets.py``): the offsets it is responsible for, minus those it is done with. Every
``CHECKPOINT_EVERY`` seconds this node writes, for each (topic, partition) its channels hold
windows of, one etcd key ``parts/<topic>/<origin>/channels/<me>``: every channel's window, and
for its own partition the log's hand-off position. Each write is a txn guarded by the key's
revision as this node last wrote it, so a write never undoes an adoption.

**Adoption.** The leader of a partition (after a takeover, or the origin after it took its
partition back) adopts the windows of every holder that is no longer a live member of the
cluster: one txn, guarded by its epoch and the holder key's revision, puts a tombstone
(``adopted_by``, ``end``) in the holder's key and the merged windows in its own; then it replays
the adopted pending offsets from its copy of the partition into its own channels of the same
names (created, and so registered with nsqlookupd, if need be). An open window (the dead
origin's) is closed at the partition's sealed end. Duplicates: what was FIN'd since the last
checkpoint, and what was in flight.

**A holder that was adopted** (it was paused or cut off, and comes back; or it restarts) finds
the tombstone (its next write fails, or ``restore`` reads it): its windows of that partition
close, so its channels drop those messages at delivery instead of delivering them again; for its
own partition its hand-off waits until it takes the partition back, and then goes on from the
partition's end with fresh windows.

**Restore.** At start the node reads its own keys before any channel delivers (channels and
hand-offs are held while it joins). After a clean stop its channels' disk queues match their
windows; after a crash (the last checkpoint is not marked clean) each channel of a replicated
topic is rebuilt: its messages with offset IDs are dropped and its pending offsets are put back
from the local copies of their partitions, so a crash no longer loses what was in flight or
deferred (nsqd loses it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from ..core.channel import Channel
from ..core.offsets import DoneWindow
from ..core.topic import Topic
from ..core.windows import (
    adopted_below,
    drop_offset_messages,
    merge_window,
    set_window,
    track_partition,
)
from ..log import LOGGER_NAME
from ..storage.topiclog import TopicLog
from .etcd import Compare, EtcdError, KeyValue, put_op, range_op
from .partition import Partition, Role
from .records import (
    ChannelCheckpoint,
    RecordError,
    Stored,
    Tombstone,
    decode_checkpoint,
)
from .view import ClusterView

__all__ = ["CHECKPOINT_EVERY", "ChannelHost", "Checkpoints"]

log = logging.getLogger(LOGGER_NAME)

#: Seconds between two checkpoints of a partition's channel windows.
CHECKPOINT_EVERY = 1.0
#: Messages read from a queue per loop turn while a channel is rebuilt.
REBUILD_BATCH = 1024

PartKey = tuple[str, int]
#: A holder's key of a partition: its checkpoint, or the tombstone of its adoption.
Held = Stored[ChannelCheckpoint | Tombstone]


def _held(kv: KeyValue) -> Held | None:
    """A checkpoint key as etcd answered it; None when it does not decode."""
    try:
        return Stored(kv.key, decode_checkpoint(kv.value), kv.mod_revision)
    except RecordError as err:
        log.error("CLUSTER: ignoring unreadable checkpoint %s - %s", kv.key, err)
        return None


class RetainedLogs(Protocol):
    """What replication needs of the retained logs' one owner (``server/retention.py``)."""

    def get(self, name: str) -> TopicLog | None:
        """A retained topic's log (None: the topic keeps no log)."""

    def drop_replica(self, topic: str, origin: int) -> None:
        """This node's copy of another node's partition is no longer kept: closed and its
        files removed."""

    def open_replica(self, topic: str, origin: int) -> TopicLog:
        """This node's copy of node ``origin``'s partition of ``topic``."""

    @property
    def rewinds(self) -> Replays: ...


class Replays(Protocol):
    """Messages of a log put back into a channel (``server/rewind.py``)."""

    async def replay_ranges(
        self,
        topic: Topic,
        channel: Channel,
        tlog: TopicLog,
        ranges: list[tuple[int, int]],
        attempts: Mapping[int, int] | None = None,
        due: Mapping[int, int] | None = None,
    ) -> int:
        """Put the log's messages at ``ranges`` into ``channel``, with ``attempts`` and REQ
        ``due`` times (wall clock, ms) by offset; returns how many."""


class ChannelHost(Protocol):
    """What the channel checkpoints need of nsqd."""

    @property
    def topics(self) -> Mapping[str, Topic]: ...
    @property
    def retention(self) -> RetainedLogs: ...

    def serve_topic(self, name: str) -> Topic:
        """The topic, created if need be (registered with nsqlookupd, its channels fetched)."""

    def joined(self) -> None:
        """Channels deliver and logs hand off (held while joining)."""


class Checkpoints:
    def __init__(self, view: ClusterView, host: ChannelHost) -> None:
        self.view = view
        self.member = view.member
        self.host = host
        self.partitions = view.partitions
        self.me = view.node_id
        #: This node's keys: the revision it last wrote (0: none), the value it wrote.
        self.revs: dict[PartKey, int] = {}
        self.written: dict[PartKey, bytes] = {}
        #: The last tombstone of each of this node's keys it has acted on: (revision, end).
        self.adopted: dict[PartKey, tuple[int, int]] = {}
        #: Own partitions adopted at an offset: the hand-off goes on from there once this
        #: node leads them again.
        self._resume_at: dict[PartKey, int] = {}
        self._tasks: set[asyncio.Task[Any]] = set()

    def key(self, part: PartKey, holder: int | None = None) -> str:
        holder = self.me if holder is None else holder
        return self.member.keys.checkpoint(part[0], part[1], holder)

    # -- tracking ---------------------------------------------------------------------------

    def track(self, topic: Topic) -> None:
        """``topic`` is replicated: offset IDs for its publishes, windows for its channels."""
        if topic.origin is not None or topic.log is None or topic.ephemeral:
            return
        topic.replicate_as(self.me)
        name, me, parts = topic.name, self.me, self.partitions
        # Idempotent publishing: a producer whose node died publishes here next; the copies
        # of the other nodes' partitions held here say what it already wrote there.
        topic.other_logs = lambda: [
            (p.log, p.settled) for (t, origin), p in parts.items() if t == name and origin != me
        ]
        handed = topic.log.handed
        for ch in topic.channels.values():
            if not ch.ephemeral:
                track_partition(ch, self.me, handed)

    def _windows(self) -> dict[PartKey, dict[str, DoneWindow]]:
        out: dict[PartKey, dict[str, DoneWindow]] = {}
        for topic in list(self.host.topics.values()):
            if topic.origin is None:
                continue
            for ch in topic.channels.values():
                if ch.windows:
                    for origin, w in ch.windows.items():
                        out.setdefault((topic.name, origin), {})[ch.name] = w
        return out

    def _value(self, part: PartKey, windows: Mapping[str, DoneWindow], clean: bool) -> bytes:
        topic = self.host.topics.get(part[0])
        own_log = topic.log if part[1] == self.me and topic is not None else None
        return ChannelCheckpoint(
            self.me,
            self.member.storage,
            clean,
            {name: w.encode() for name, w in windows.items()},
            own_log.handed if own_log is not None else None,
        ).encode()

    # -- writing ----------------------------------------------------------------------------

    async def write(self, *, clean: bool = False) -> None:
        """Every changed window of this node's channels, one key per partition (a partition
        whose channels or topic went is written empty: a takeover must not bring them back)."""
        parts = self._windows()
        for part in self.written:
            parts.setdefault(part, {})
        for part, windows in parts.items():
            if part in self.adopted and not any(w.pending(None) for w in windows.values()):
                continue  # another node holds it: nothing of it is this node's any more
            if part[1] == self.me and part in self._resume_at:
                continue  # written once it leads its partition again (its windows start then)
            value = self._value(part, windows, clean)
            if self.written.get(part) == value:
                continue
            await self._put(part, value)

    async def _put(self, part: PartKey, value: bytes) -> bool:
        key = self.key(part)
        rev = self.revs.get(part, 0)
        guard = Compare(key, "MOD", "EQUAL", rev) if rev else Compare(key, "CREATE", "EQUAL", 0)
        result = await self.member.etcd.txn([guard], [put_op(key, value)], [range_op(key)])
        if result.succeeded:
            self.revs[part] = result.revision
            self.written[part] = value
            return True
        current = result.ranges[0][0] if result.ranges and result.ranges[0] else None
        held = _held(current) if current is not None else None
        if current is None:
            self.revs[part] = 0
        elif held is None or self._tombstone(part, held) or self._ours(held):
            self.revs[part] = current.mod_revision
        # else: the windows of a data directory this node lost, not yet adopted: kept.
        return False

    def _guard(self, part: PartKey) -> Compare:
        """This node's key is as it last wrote (or found) it."""
        key, rev = self.key(part), self.revs.get(part, 0)
        return Compare(key, "MOD", "EQUAL", rev) if rev else Compare(key, "CREATE", "EQUAL", 0)

    def _ours(self, held: Held) -> bool:
        """Whether a key holds windows of this data directory (not of one this node lost)."""
        doc = held.value
        return not isinstance(doc, ChannelCheckpoint) or doc.storage == self.member.storage

    def _tombstone(self, part: PartKey, held: Held) -> bool:
        """Whether ``kv`` (this node's key) says another node adopted it; if so, act on it:
        the adopter has everything below the tombstone's end. An own partition's channels stay
        responsible from that end on (its hand-off waits until this node leads it again);
        another partition's windows close."""
        doc = held.value
        if not isinstance(doc, Tombstone):
            return False
        if self.adopted.get(part, (0, 0))[0] == held.mod_revision:
            return True  # acted on already
        end = doc.end
        self.adopted[part] = (held.mod_revision, end)
        topic = self.host.topics.get(part[0])
        closed = 0
        if topic is not None:
            for ch in topic.channels.values():
                if ch.windows is None:
                    continue
                adopted_below(ch, part[1], end, own=part[1] == self.me)
                closed += 1
            if part[1] == self.me:
                topic.hand_off.hold()  # until this node leads its partition again
                self._resume_at[part] = end
        (log.warning if closed else log.info)(
            "CLUSTER: partition %s/%d: node %s took over this node's channels of it (%d "
            "here) below offset %d; they no longer deliver its messages below it",
            part[0],
            part[1],
            doc.adopted_by,
            closed,
            end,
        )
        return True

    # -- restore at start -------------------------------------------------------------------

    async def restore(self, mine: Mapping[PartKey, Held]) -> None:
        """At start, before channels deliver: this node's checkpoints (``mine``) back into
        its channels; after a crash, those channels rebuilt from the logs."""
        docs: dict[PartKey, ChannelCheckpoint] = {}
        for part, held in mine.items():
            if self._tombstone(part, held):
                self.revs[part] = held.mod_revision
                continue
            doc = held.value
            if not isinstance(doc, ChannelCheckpoint) or doc.storage != self.member.storage:
                continue  # a data directory this node lost: the partition's leader adopts it
            self.revs[part] = held.mod_revision
            docs[part] = doc
        for (name, _), doc in docs.items():
            topic = self.host.topics.get(name)
            if topic is not None and topic.origin is not None:
                for ch_name in doc.channels:
                    # A crash can come before nsqd.dat lists a new channel: the checkpoint
                    # does, and its messages are in the log.
                    topic.get_channel(ch_name)
        by_topic: dict[str, dict[int, ChannelCheckpoint]] = {}
        for (name, origin), doc in docs.items():
            by_topic.setdefault(name, {})[origin] = doc
        rebuild: list[tuple[Topic, Channel]] = []
        for topic in list(self.host.topics.values()):
            if topic.origin is None:
                continue
            saved = by_topic.get(topic.name, {})
            resume = self._resume_at.get((topic.name, self.me))
            for ch in topic.channels.values():
                if ch.windows is not None:
                    self._restore_windows(ch, saved, resume)
            if resume is not None or any(not doc.clean for doc in saved.values()):
                rebuild.extend((topic, ch) for ch in topic.channels.values() if ch.windows)
        for topic, ch in rebuild:
            await self._rebuild(topic, ch)

    def _restore_windows(
        self, ch: Channel, saved: Mapping[int, ChannelCheckpoint], resume: int | None
    ) -> None:
        """A channel's windows as its topic's checkpoints (by partition) hold them."""
        windows = ch.windows
        assert windows is not None
        for origin, doc in saved.items():
            window = doc.channels.get(ch.name)
            if window is not None:
                try:
                    set_window(ch, origin, DoneWindow.decode(window))
                except ValueError as err:
                    log.error("CLUSTER: %s:%s: %s", ch.topic.name, ch.name, err)
            elif origin == self.me and doc.handed is not None:
                # Created after that checkpoint: it had nothing before its hand-off.
                now = windows.get(origin)
                low = doc.handed if now is None else min(doc.handed, now.low)
                set_window(ch, origin, DoneWindow(low))
        if resume is not None:
            # Adopted below ``resume``; from there on it is this node's (what it was handed
            # after a take-back, before the crash, included).
            set_window(ch, self.me, DoneWindow(resume))

    def hold_adopted(self) -> None:
        """Own partitions adopted by another node: their hand-off waits until this node leads
        them again."""
        for name, _ in self._resume_at:
            topic = self.host.topics.get(name)
            if topic is not None:
                topic.hand_off.hold()

    def _source(self, topic: Topic, origin: int) -> TopicLog | None:
        if origin == self.me:
            return topic.log if isinstance(topic.log, TopicLog) else None
        p = self.partitions.get((topic.name, origin))
        return p.log if p is not None else None

    async def _rebuild(self, topic: Topic, ch: Channel) -> None:
        """After a crash: the channel's offset-ID messages go, its pending offsets come back
        from the logs (what was in flight or deferred at the crash included)."""
        windows = ch.windows
        assert windows is not None
        sources = {origin: self._source(topic, origin) for origin in windows}
        missing = [o for o, s in sources.items() if s is None and windows[o].pending(None)]
        if missing:
            log.error(
                "CHANNEL(%s:%s): not rebuilt after the crash: no local copy of partition(s) %s",
                topic.name,
                ch.name,
                missing,
            )
            return
        for taken in drop_offset_messages(ch, REBUILD_BATCH):
            if taken:
                await asyncio.sleep(0)
        count = 0
        for origin, w in windows.items():
            src = sources[origin]
            if src is None:
                continue
            upto = topic.log.handed if origin == self.me and topic.log is not None else src.latest
            ranges = [(s, upto if e is None else e) for s, e in w.pending(upto)]
            count += await self.host.retention.rewinds.replay_ranges(
                topic, ch, src, ranges, w.attempts, w.due
            )
        log.warning(
            "CHANNEL(%s:%s): rebuilt after a crash from its checkpoint: %d messages put back "
            "from the log (what was in flight or deferred included)",
            topic.name,
            ch.name,
            count,
        )

    # -- adoption by a partition's leader ---------------------------------------------------

    async def adopt(self, p: Partition, holders: Mapping[int, Held]) -> None:
        """This node leads ``p``: take over the windows of holders no longer in the cluster."""
        for holder, held in holders.items():
            if p.role is not Role.LEADER:
                return
            doc = held.value
            if isinstance(doc, Tombstone):
                await self._adopt_after_take_back(p, holder, held, doc)
                continue
            storage = doc.storage
            if (holder, storage) == self.member.me or self.view.live((holder, storage)):
                continue
            theirs: dict[str, DoneWindow] = {}
            for name, saved in doc.channels.items():
                try:
                    theirs[name] = DoneWindow.decode(saved)
                except ValueError as err:
                    log.error("CLUSTER: checkpoint %s: %s", held.key, err)
            ends = [w.end for w in theirs.values()]
            if None in ends:
                end = p.log.latest  # the origin's own windows: its partition ends here now
            else:
                end = max([e for e in ends if e is not None], default=0)
            if p.hw < end:
                continue  # not all of it is committed yet: the next tick
            for w in theirs.values():
                w.close_at(end)
            await self._adopt(p, holder, held, theirs, end)

    async def _adopt_after_take_back(
        self, p: Partition, holder: int, held: Held, tomb: Tombstone
    ) -> None:
        """The origin's key still holds the tombstone of an earlier adoption, but the log goes
        on past its end: the origin took its partition back, published, and died before it
        wrote a checkpoint of its own (every second). Its channels were responsible for
        everything from the tombstone's end, and nothing of that is known done: all of it is
        adopted as pending (delivered again, at least once, rather than never; issue 43)."""
        if holder != p.origin or self.view.registered(holder):
            return
        end = p.log.latest
        if tomb.end >= end or p.hw < end:
            return  # nothing after the adoption, or not all of it committed yet: next tick
        topic = self.host.topics.get(p.topic)
        if topic is None:
            return
        # The origin's channels: those the tombstone names (the adoption that wrote it took
        # them over, and they went on from its end), and any of this node's with a window of
        # the partition. This node may hold none: another node made that adoption.
        names = set(tomb.channels or ()) | {
            name
            for name, ch in topic.channels.items()
            if not ch.ephemeral and ch.windows is not None and p.origin in ch.windows
        }
        if tomb.channels is None and not names:  # a tombstone from before they were named
            names = {
                name
                for name, ch in topic.channels.items()
                if not ch.ephemeral and ch.windows is not None
            }
        theirs = {name: DoneWindow(tomb.end, end) for name in sorted(names)}
        log.warning(
            "CLUSTER: partition %s: node %d took it back after an adoption and went before it "
            "wrote a checkpoint; offsets %d-%d are taken as pending in its channels",
            p.name,
            holder,
            tomb.end,
            end - 1,
        )
        await self._adopt(p, holder, held, theirs, end)

    async def _adopt(
        self, p: Partition, holder: int, kv: Held, theirs: dict[str, DoneWindow], end: int
    ) -> None:
        part = (p.topic, p.origin)
        topic = self.host.serve_topic(p.topic)
        self.track(topic)
        channels = {name: topic.get_channel(name) for name in theirs}
        merged: dict[str, DoneWindow] = {}
        for name, ch in topic.channels.items():
            mine = ch.windows.get(p.origin) if ch.windows else None
            if name in theirs:
                merged[name] = theirs[name] if mine is None else mine.union(theirs[name])
            elif mine is not None:
                merged[name] = mine
        tomb = Tombstone(holder, self.me, end, tuple(sorted(theirs))).encode()
        mykey = self.key(part)
        leader = self.member.keys.part(p.topic, p.origin, "leader")
        mine_value = put_op(mykey, self._value(part, merged, False))
        if kv.key == mykey:
            # This node's own key, from a data directory it lost: replaced by what it holds.
            guards, ops = [Compare(kv.key, "MOD", "EQUAL", kv.mod_revision)], [mine_value]
        else:
            guards = [Compare(kv.key, "MOD", "EQUAL", kv.mod_revision), self._guard(part)]
            ops = [put_op(kv.key, tomb), mine_value]
        result = await self.member.etcd.txn(
            [*guards, Compare(leader, "MOD", "EQUAL", p.epoch)], ops
        )
        if not result.succeeded:
            return  # superseded, or a key moved: the next tick sees what is true now
        self.revs[part] = result.revision
        self.written.pop(part, None)
        for name, w in theirs.items():
            merge_window(channels[name], p.origin, w)
        # The replay runs beside the plan's ticks (a large backlog takes a while); a crash
        # before it ends is a crash of a node whose checkpoint already holds these windows.
        task = asyncio.create_task(self._replay(p, holder, topic, channels, theirs, end))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _replay(
        self,
        p: Partition,
        holder: int,
        topic: Topic,
        channels: Mapping[str, Channel],
        theirs: Mapping[str, DoneWindow],
        end: int,
    ) -> None:
        total = 0
        for name, w in theirs.items():
            ranges = [(s, e) for s, e in w.pending(end) if e is not None]
            total += await self.host.retention.rewinds.replay_ranges(
                topic, channels[name], p.log, ranges, w.attempts, w.due
            )
        log.warning(
            "CLUSTER: partition %s: took over node %d's channels of it (%s): %d messages "
            "pending there put back here",
            p.name,
            holder,
            ", ".join(sorted(theirs)) or "none",
            total,
        )

    # -- take-back --------------------------------------------------------------------------

    async def took_back(self, p: Partition) -> None:
        """The origin leads its own partition again. If its channels were adopted meanwhile,
        the hand-off goes on from where the adopter's responsibility ended (the adopter has
        everything before it); otherwise the channels simply carry on."""
        topic = self.host.topics.get(p.topic)
        if topic is None or topic.log is None:
            return
        part = (p.topic, p.origin)
        kv = await self.member.etcd.get(self.key(part))  # EtcdError: the next tick
        if kv is not None:
            self.revs[part] = kv.mod_revision
            held = _held(kv)
            if held is not None:
                self._tombstone(part, held)
        resume = self._resume_at.pop(part, None)
        if resume is not None:
            for ch in topic.channels.values():
                if ch.windows is not None:
                    track_partition(ch, self.me, resume)
            if topic.log.handed < resume:
                topic.hand_off.restart(min(resume, topic.log.latest))
            log.info(
                "CLUSTER: partition %s: its channels here go on from offset %d", p.name, resume
            )
        topic.hand_off.release()

    async def stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        with contextlib.suppress(EtcdError, Exception):
            await self.write(clean=True)
