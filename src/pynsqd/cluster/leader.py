"""The leader's side of a replicated partition: taking the lead, the in-sync set, the group
fsync, the followers' fetches, and the publishes that wait for their commit.

Theory of operation (the rules are ``cluster/partition.py``'s, the model ``docs/replication.md``).

- **Taking the lead.** A leaderless partition's in-sync member campaigns with a txn that creates
  the leader key under its lease only while the in-sync set is the one it read; the origin takes
  its partition back from a takeover leader the same way, once it is in sync and caught up. The
  txn's revision is the new **epoch**.
- **Leading.** Each tick the leader drops members that lag more than ``--replica-lag-max`` (or
  left) from the in-sync set and adds back those caught up, by a txn guarded by its epoch: a
  leader that was superseded finds out there and steps down.
- **Group commit.** Appends kick one fsync at a time, off the event loop; appends meanwhile ride
  the next one. The leader's acknowledgement is what its fsync covered.
- **Fetches** (``fetch``; the wire format is ``cluster/fetch.py``): the follower's epoch must
  be the leader's; its offset is its acknowledgement (the HW may move); at the end of the log it
  waits (long-poll) for an append or a new HW. A follower beyond the leader's end of its last
  epoch is told to truncate; one behind the leader's retention is told to start again from the
  earliest offset.
- **Publishing** (``committed``/``wait``): a publish's OK waits until the HW covers its records,
  or fails after ``--replication-timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from functools import partial

from ..log import LOGGER_NAME
from ..storage.group_sync import GroupSync
from ..storage.topiclog import OffsetOutOfRange, TopicLog
from .etcd import Compare, put_op
from .fetch import FetchAnswer, FetchRequest
from .partition import Member, Partition, Role, Waiter
from .records import InSync, Leadership, Stored
from .view import ClusterView

__all__ = ["Leading"]

log = logging.getLogger(LOGGER_NAME)

#: The longest a follower's fetch may wait at the end of the log (ms).
MAX_WAIT_MS = 5000
#: The most one fetch answer carries (a follower asks for less).
MAX_FETCH_BYTES = 16 << 20

PartitionKey = tuple[str, int]


class Leading:
    """What this node does for the partitions it leads (and the publishes to its own)."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view
        self.member = view.member
        self.partitions = view.partitions
        self.opts = view.opts
        #: Read the cluster now (the replicator's): a follower outside the in-sync set
        #: caught up, so the set can grow this round.
        self.kick: Callable[[], None] = lambda: None
        #: The partitions' group fsyncs (durability=fsync).
        self._fsyncs = GroupSync()
        #: Set on an append or a new HW: the followers' waiting fetches answer.
        self._appended: dict[PartitionKey, asyncio.Event] = {}
        #: Publishes to a replicated topic whose partition is not placed yet, by topic.
        self._pending: dict[str, list[Waiter]] = {}

    def watch(self, p: Partition) -> None:
        """A partition this node now holds: its appends wake fetches and kick the fsync; the
        publishes that waited for its placement wait for its HW."""
        key = (p.topic, p.origin)
        self._appended[key] = asyncio.Event()
        p.log.on_append = lambda: self._on_append(key)
        if p.is_origin:
            p.waiters.extend(self._pending.pop(p.topic, []))

    def unwatch(self, p: Partition) -> None:
        """A partition this node no longer holds: its publishes fail, its fetches end."""
        key = (p.topic, p.origin)
        event = self._appended.pop(key, None)
        if event is not None:
            event.set()  # a waiting fetch answers now (NOT_LEADER)
        p.log.on_append = None

    # -- taking the lead ------------------------------------------------------------------

    def _value(self) -> bytes:
        return Leadership(self.member.node_id, self.member.http).encode()

    async def campaign(self, p: Partition) -> None:
        keys = self.member.keys
        if not self.member.lease_alive:
            return
        result = await self.member.etcd.txn(
            [
                Compare(keys.part(p.topic, p.origin, "leader"), "CREATE", "EQUAL", 0),
                Compare(keys.part(p.topic, p.origin, "isr"), "MOD", "EQUAL", p.isr_revision),
            ],
            [put_op(keys.part(p.topic, p.origin, "leader"), self._value(), self.member.lease)],
        )
        if result.succeeded:
            self._became_leader(p, result.revision)

    async def take_back(self, p: Partition, leader: Stored[Leadership]) -> bool:
        """The origin, caught up and in sync with a takeover leader (which never appends),
        leads its partition again: offsets go on from the same end."""
        keys = self.member.keys
        result = await self.member.etcd.txn(
            [
                Compare(leader.key, "MOD", "EQUAL", leader.mod_revision),
                Compare(keys.part(p.topic, p.origin, "isr"), "MOD", "EQUAL", p.isr_revision),
            ],
            [put_op(leader.key, self._value(), self.member.lease)],
        )
        if result.succeeded:
            self._became_leader(p, result.revision)
        return result.succeeded

    def _became_leader(self, p: Partition, epoch: int) -> None:
        p.become_leader(epoch, self.member.now())
        p.leader_http = self.member.http
        log.info(
            "CLUSTER: partition %s: leader at epoch %d, offsets %d-%d, in sync %s",
            p.name,
            epoch,
            p.log.earliest,
            p.log.latest,
            [m[0] for m in p.isr],
        )
        self.kick_sync(p)
        self.advance(p)

    async def lead(self, p: Partition) -> None:
        """A tick of a partition this node leads: the in-sync set, the fsync, the HW."""
        new = p.isr_change(
            self.member.now(),
            self.opts.replica_lag_max,
            self.view.live,
            stall_max=self.opts.replica_stall_max,
        )
        if new is not None:
            keys = self.member.keys
            result = await self.member.etcd.txn(
                [Compare(keys.part(p.topic, p.origin, "leader"), "MOD", "EQUAL", p.epoch)],
                [put_op(keys.part(p.topic, p.origin, "isr"), InSync(tuple(new)).encode())],
            )
            if not result.succeeded:
                p.step_down("superseded while changing the in-sync set")
                return
            log.info(
                "CLUSTER: partition %s: in sync %s -> %s",
                p.name,
                _members(p.isr, new),
                _members(new, p.isr),
            )
            p.isr, p.isr_revision = new, result.revision
            event = self._appended.get((p.topic, p.origin))
            if event is not None:
                event.set()  # waiting fetches answer now: an origin back in sync takes back
        self.kick_sync(p)
        self.advance(p)

    def advance(self, p: Partition) -> None:
        p.lease_ok = self.member.lease_alive
        if not p.advance():
            return
        event = self._appended.get((p.topic, p.origin))
        if event is not None:
            event.set()  # the followers' waiting fetches answer with the new HW
        if p.is_origin:
            topic = self.view.topics.get(p.topic)
            if topic is not None and topic.log is p.log:
                topic.schedule_drain()

    # -- the group fsync ------------------------------------------------------------------

    def _on_append(self, key: PartitionKey) -> None:
        event = self._appended.get(key)
        if event is not None:
            event.set()
        p = self.partitions.get(key)
        if p is not None and p.role is Role.LEADER:
            self.kick_sync(p)
            if p.settings.durability == "pagecache":
                self.advance(p)

    def kick_sync(self, p: Partition) -> None:
        """durability=fsync: the partition's records to disk, a group fsync off the loop
        (``storage/group_sync.py``; started from the append itself, before the followers'
        fetches are answered); each one that ends moves the commit point if it can. A failed
        one is logged and stops the commit point below what it covered
        (``TopicLog.unsafe_from``): publishes past it fail after --replication-timeout and
        /ping says why; a restart scans the log again."""
        if p.settings.durability != "fsync" or p.log.synced >= p.log.latest:
            return
        self._fsyncs.request(p.log, partial(self._synced, p))

    def _synced(self, p: Partition) -> None:
        if p.role is Role.LEADER:
            self.advance(p)

    # -- the followers' fetches -----------------------------------------------------------

    async def fetch(self, topic: str, origin: int, req: FetchRequest) -> FetchAnswer:
        """A follower's fetch: checks its epoch, records its acknowledgement, waits up to
        ``wait_ms`` at the end of the log, answers with the records from its offset."""
        p = self.partitions.get((topic, origin))
        if p is None or p.role is not Role.LEADER:
            return FetchAnswer(409, "NOT_LEADER", epoch=p.epoch if p else 0)
        if req.epoch != p.epoch:
            # Even a later epoch is only a claim: etcd says who leads (the next tick reads it),
            # so a stray or hostile fetch cannot unseat a leader.
            return FetchAnswer(409, "EPOCH_MISMATCH", epoch=p.epoch)
        if req.replica not in p.replicas:
            # Not (or no longer) a copy of this partition: it was re-placed while that node
            # was gone; its own next read of the assignment stops it.
            return FetchAnswer(409, "NOT_REPLICA", epoch=p.epoch)
        end = p.end_for(req.last_epoch)
        if req.offset > end:
            return FetchAnswer(409, "TRUNCATE", epoch=p.epoch, truncate_to=end)
        if req.offset < p.log.earliest:
            # Retention here removed what the follower needs next: it starts again from here.
            return FetchAnswer(409, "RESET", epoch=p.epoch, start=p.log.earliest)
        member = (req.replica, req.storage)
        p.fetched(member, req.offset, self.member.now())
        if member not in p.isr and req.offset >= p.log.latest:
            self.kick()
        self.advance(p)
        wait_ms = min(req.wait_ms, MAX_WAIT_MS)
        if req.offset >= p.log.latest and wait_ms:
            event = self._appended[(topic, origin)]
            event.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_ms / 1000):
                    await event.wait()
            if p.role is not Role.LEADER or p.epoch != req.epoch:
                return FetchAnswer(409, "NOT_LEADER", epoch=p.epoch)
        p.answered(member, self.member.now())  # it asks again at once, or it stopped fetching
        try:
            records = _read(p.log, req.offset, min(req.max_bytes, MAX_FETCH_BYTES))
        except (OSError, OffsetOutOfRange) as err:
            log.error("CLUSTER: partition %s: reading for a follower failed - %s", p.name, err)
            return FetchAnswer(500, "INTERNAL_ERROR", epoch=p.epoch)
        return FetchAnswer(
            200,
            epoch=p.epoch,
            hw=p.hw,
            latest=p.log.latest,
            earliest=p.log.earliest,
            epochs=list(p.history.entries),
            records=records,
        )

    def stream_closed(self, topic: str, origin: int, req: FetchRequest) -> None:
        """A follower's fetch stream ended (``req`` its last request): it no longer fetches
        until it asks again, and leaves the in-sync set at the next tick if it does not."""
        p = self.partitions.get((topic, origin))
        if p is None or p.role is not Role.LEADER or req.epoch != p.epoch:
            return
        member = (req.replica, req.storage)
        if member in p.isr:
            p.stream_closed(member)
            self.kick()

    # -- publishing -----------------------------------------------------------------------

    def committed(self, topic: str, end: int) -> bool:
        """Whether a publish to this node's partition ending at ``end`` may be answered now."""
        p = self.partitions.get((topic, self.member.node_id))
        if p is None:
            return False
        return p.hw >= end or (p.settings.acks == "leader" and p.role is Role.LEADER)

    def wait(self, topic: str, end: int, done: Callable[[str | None], None]) -> None:
        """Call ``done(None)`` once offsets below ``end`` are committed, ``done(reason)`` when
        they could not be in ``--replication-timeout`` (they may still be)."""
        own = (topic, self.member.node_id)
        p = self.partitions.get(own)
        # Waiting for the partition to be placed (its first publish), else for the HW.
        queue = p.waiters if p is not None else self._pending.setdefault(topic, [])
        settled = False

        def settle(why: str | None) -> None:
            nonlocal settled
            if not settled:
                settled = True
                handle.cancel()
                done(why)

        def timed_out() -> None:
            part = self.partitions.get(own)
            for q in (queue, part.waiters if part is not None else []):
                if waiter in q:
                    q.remove(waiter)
            hw = part.hw if part is not None else 0
            outage = self.member.etcd.outage()
            why = f"; {outage}" if outage is not None else ""
            settle(f"replication timeout (committed below {hw}, this publish ends at {end}{why})")

        handle = asyncio.get_running_loop().call_later(self.opts.replication_timeout, timed_out)
        waiter = Waiter(end, settle)
        queue.append(waiter)


def _members(these: list[Member], other: list[Member]) -> list[int | str]:
    """Node ids for the log; a node that is in both sets with another data directory (it came
    back with an empty disk: a new member) shows its storage id too, so that a change of
    storage never reads as "[1, 2] -> [1, 2]"."""
    ids_elsewhere = {m[0]: m for m in other}
    return [
        f"{m[0]} (storage {m[1]})" if m[0] in ids_elsewhere and ids_elsewhere[m[0]] != m else m[0]
        for m in these
    ]


def _read(tlog: TopicLog, offset: int, max_bytes: int) -> bytes:
    """The records from ``offset`` to the end of the log, whole, at most ``max_bytes`` (at
    least one record), as the log holds them. They were just written: the page cache has them."""
    parts: list[bytes] = []
    for rng in tlog.read_ranges(offset, tlog.latest, tlog.latest - offset, max_bytes):
        with open(rng.path, "rb", buffering=0) as f:
            f.seek(rng.start)
            parts.append(f.read(rng.end - rng.start))
    return b"".join(parts)
