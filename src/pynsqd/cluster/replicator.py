"""Replicated topics: this node's part in the cluster, put together.

Theory of operation (``docs/replication.md``; the rules are ``cluster/partition.py``'s and
``cluster/plan.py``'s, without I/O). The parts, each in its own file: ``membership.py`` (the
lease, the registration, the cluster's secret), ``leader.py`` (taking the lead, the in-sync
set, the group fsync, serving fetches, publishes that wait for their commit), ``follower.py``
(the fetch tasks), ``gate.py`` (what a publish asks: the gate, the wait for a take-back, the
flags' default settings) and this file, **the shell of the plan**: every ``TICK`` seconds (or
at once, when a follower caught up or an in-sync set can grow) one range read of ``<K>/``
gives nodes, topics' settings and partitions, and ``Plan.decide`` answers for each partition
this node holds a copy of with actions carried out here (``_carry_out``): lead, follow (a
fetch task at the leader's epoch), campaign, take back, adopt; the leader re-places copies
whose node is gone (``Plan.to_replace``); a deleted topic's partition goes (its keys, every
copy). It is also what the server and the HTTP API see (``publishing``, ``committed``,
``wait``, ``fetch``, ``describe``).

**Publishing.** ``publishing.gate`` gives the protocol the origin partition of a replicated
topic; with ``acks=all`` its OK waits for the high watermark (``wait``), or ``E_PUB_FAILED``
after ``--replication-timeout``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Container
from typing import Any, Protocol

from ..log import LOGGER_NAME
from ..options import Options
from ..storage.epochs import EpochHistory
from ..storage.topiclog import TopicLog
from .checkpoints import CHECKPOINT_EVERY, ChannelHost, Checkpoints
from .etcd import Compare, EtcdError, WatchEvent, delete_op, every, put_op
from .follower import Following
from .gate import PublishGate
from .leader import Leading
from .membership import Membership
from .partition import Partition, Role
from .plan import (
    Action,
    Adopt,
    Campaign,
    Facts,
    Follow,
    Lead,
    Leaderless,
    Offline,
    Place,
    Plan,
    Replace,
    Resign,
    ResumeChannels,
    StartFetch,
    StepDown,
    StopFetch,
    TakeBack,
)
from .records import ClusterState, InSync, PartKey, PartRecords
from .report import describe, offline
from .settings import ReplicationSettings, check_change
from .view import ClusterView

__all__ = ["ReplicaHost", "Replicator"]

log = logging.getLogger(LOGGER_NAME)

#: Seconds between two reads of the cluster's state in etcd.
TICK = 0.25
#: Seconds between two compactions of etcd's key history (as Kubernetes' API server does):
#: each compacts to the revision the previous one saw, so history a few minutes deep is kept.
COMPACT_EVERY = 300.0


class Compaction:
    """When to compact etcd's history, and to which revision (no I/O: the plan asks ``due``
    with the store's revision each tick)."""

    def __init__(self, now: Callable[[], float], every: float = COMPACT_EVERY) -> None:
        self.now = now
        self.every = every
        self._next = now() + every
        self._seen = 0

    def due(self, revision: int) -> int | None:
        """The revision to compact to now, or None."""
        if self.now() < self._next:
            return None
        self._next = self.now() + self.every
        target, self._seen = self._seen, revision
        return target or None


class ReplicaHost(ChannelHost, Protocol):
    """What replication needs of nsqd (and, through ``ChannelHost``, its channels)."""

    @property
    def opts(self) -> Options: ...
    @property
    def data_path(self) -> str: ...
    @property
    def http_address(self) -> str: ...
    @property
    def tcp_address(self) -> str: ...
    @property
    def worker_index(self) -> int: ...


class Replicator:
    def __init__(self, host: ReplicaHost, *, now: Callable[[], float] = time.monotonic) -> None:
        self.host = host
        opts = host.opts
        self.opts = opts
        self.node_id = opts.node_id
        self.member = Membership(
            opts,
            host.data_path,
            host.http_address,
            host.tcp_address,
            now=now,
            worker=host.worker_index,
        )
        self.now = now
        #: The cluster as last read, the partitions held: what the parts below share.
        self.view = ClusterView(self.member, host.topics)
        self.defaults = ReplicationSettings(
            opts.replicas,
            opts.replication_min_insync or opts.replicas // 2 + 1,
            opts.replication_acks,
            opts.replication_durability,
        )
        #: The partitions this node holds a copy of, by (topic, origin).
        self.partitions = self.view.partitions
        self.leading = Leading(self.view)
        #: Set to read the cluster now rather than at the next tick (a follower that caught
        #: up, a leader whose in-sync set can grow: a take-back in one round, not three).
        self._wake = asyncio.Event()
        self.following = Following(self.member, self._wake.set)
        self.leading.kick = self._wake.set
        self.checkpoints = Checkpoints(self.view, host)
        #: The decisions (no I/O): ``cluster/plan.py``.
        # A copy's node missing for --replica-replace-after is gone: its copy moves.
        self.plan = Plan(self.node_id, replace_after=self.member.opts.replica_replace_after)
        #: Unreadable keys logged, at the revision logged.
        self._unreadable: dict[str, int] = {}
        #: This node's partitions of deleted topics whose keys etcd has not deleted yet.
        self._deleting: set[PartKey] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.compaction = Compaction(now)
        #: The etcd revision the last ``_refresh`` read the cluster at (``_watch`` from there).
        self.revision = 0
        #: Held while a read of the cluster is acted on (``_refresh``).
        self._reading = asyncio.Lock()
        #: What a publish asks: ``cluster/gate.py``.
        self.publishing = PublishGate(
            self.view,
            self.defaults,
            retained=host.retention.get,
            track=self.checkpoints.track,
            spawn=lambda coro: self._tasks.append(asyncio.create_task(coro)),
        )

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """Join the cluster. Raises ``RuntimeError`` with the one line to show."""
        etcd = self.member.etcd
        began = asyncio.get_running_loop().time()
        try:
            await etcd.wait_ready(10.0)
        except EtcdError as err:
            raise RuntimeError(f"--etcd-endpoints: {err}") from None
        await self.member.register()
        await self.member.load_secret()
        await self._refresh()
        mine = {
            part: holders[self.node_id]
            for part, holders in self.view.state.checkpoints.items()
            if self.node_id in holders
        }
        await self.checkpoints.restore(mine)
        await self.checkpoints.write()  # not clean any more: a crash from here rebuilds
        self.host.joined()
        self.checkpoints.hold_adopted()
        self.view.ready = True
        self._tasks.append(asyncio.create_task(self.member.keepalive_loop(self._lease_expired)))
        self._tasks.append(
            asyncio.create_task(every(TICK, self._refresh, "read the cluster", self._wake))
        )
        self._tasks.append(asyncio.create_task(self._watch()))
        self._tasks.append(
            asyncio.create_task(every(CHECKPOINT_EVERY, self.checkpoints.write, "checkpoint"))
        )
        log.info(
            "CLUSTER(%s): node %d joined (etcd %s, lease TTL %ds) in %.1f ms",
            self.opts.cluster_name,
            self.node_id,
            ",".join(etcd.endpoints),
            self.member.ttl,
            (asyncio.get_running_loop().time() - began) * 1000,
        )

    async def abort(self) -> None:
        """``start`` failed: nothing more is written to etcd (a refused duplicate must not
        touch the keys of the node it duplicates); the clients are closed."""
        for t in self._tasks:
            t.cancel()
        await self.following.close()
        await self.member.etcd.close()

    async def stop(self) -> None:
        """Leave: fail waiting publishes, stop fetching, give up the lease (its leaderships
        go with it, so followers take over at once)."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await self.following.close()
        for p in self.partitions.values():
            p.fail_waiters("nsqd is exiting")
        self.publishing.wake_writable("nsqd is exiting")
        await self.checkpoints.stop()
        await self.member.leave()

    def _lease_expired(self) -> None:
        for p in self.partitions.values():
            if p.role is Role.LEADER:
                p.step_down("the node's etcd lease expired")

    # -- the plan -------------------------------------------------------------------------

    async def _refresh(self) -> None:
        """Read the cluster and act on it, one read at a time: a read older than a placement
        made by another one meanwhile took the new partition for a deleted topic's and
        dropped it (``POST /topic/replication`` reads too, beside the tick)."""
        async with self._reading:
            await self._read_and_act()

    async def _read_and_act(self) -> None:
        keys = self.member.keys
        kvs, revision = await self.member.etcd.get_prefix(keys.prefix + "/")
        self.revision = revision
        compact_to = self.compaction.due(revision)
        if compact_to is not None:
            await self.member.etcd.compact(compact_to)
        state = ClusterState.parse(keys, kvs)
        for key, rev, why in state.unreadable:
            if self._unreadable.get(key) != rev:
                self._unreadable[key] = rev
                log.error("CLUSTER: ignoring unreadable key %s - %s", key, why)
        held = self._take(state)
        for topic, settings in state.settings.items():
            if settings.replicated and topic in self.host.topics:
                self.checkpoints.track(self.host.topics[topic])
        if self.defaults.replicated:
            for name in self.host.topics:
                if name not in state.settings and self._retained(name):
                    self.publishing.write_defaults(name)
        for place in self.plan.to_place(state, self._retained, self.now()):
            await self._place(place)
        for part, p in held.items():
            rec = state.parts[part]
            if p is None:
                continue
            if rec.isr is not None:
                p.isr = list(rec.isr.value.members)
                p.isr_revision = rec.isr.mod_revision
            own = self.host.topics.get(p.topic) if p.is_origin else None
            facts = Facts(
                part,
                self.member.me,
                p.role.value,
                p.epoch,
                tuple(p.isr),
                caught_up=p.leader_latest == p.log.latest,
                ready=self.view.ready,
                checkpoints=bool(state.checkpoints.get(part)),
                hand_off_held=own is not None and own.hand_off.held,
                lost=p.lost(),
            )
            for action in self.plan.decide(facts, rec.leader, self.now(), state.live):
                if not await self._carry_out(p, action):
                    break
            wanted = state.settings.get(part[0])
            if p.role is Role.LEADER and wanted is not None and self.view.ready:
                replace = self.plan.to_replace(part, rec, wanted, state, self.now())
                if replace is not None:
                    await self._replace(p, rec, replace)
        self._drop_unassigned(state, held)
        self.publishing.wake_writable()  # a partition taken back takes its publishes
        if self._deleting:
            await self._delete_keys()

    async def _watch(self) -> None:
        """Read the cluster again as soon as a change that moves a partition is seen
        (``Keys.moves_partitions``), not at the next tick: a follower fetches from a new
        leader, a restarted node's take-back is acknowledged by its followers, a lease's end
        is acted on, within a round trip. Only the partitions' keys are watched (the nodes'
        beats, a few a second each, would be read by every node for nothing; a topic's new
        settings and a node's arrival wait for the tick). A hint only: the state is what
        ``_refresh`` reads, which still runs every tick; a watch that fails or ends is opened
        again after one."""
        keys = self.member.keys

        def seen(events: list[WatchEvent]) -> None:
            if any(keys.moves_partitions(e.key, e.deleted, e.version) for e in events):
                self._wake.set()

        while True:
            # etcd's outage is said by the calls; the ticks go on meanwhile.
            with contextlib.suppress(EtcdError):
                await self.member.etcd.watch(keys.prefix + "/parts/", self.revision + 1, seen)
            await asyncio.sleep(TICK)

    def _take(self, state: ClusterState) -> dict[PartKey, Partition | None]:
        """The cluster as read, and a copy for each partition it places on this node, in one
        step with no await between: a publish never finds its partition in the state with no
        copy here yet (it was refused as held elsewhere while the tick campaigned for another
        partition, the moment a new topic's placement was read). ``None``: an own partition
        of a topic this node does not retain."""
        self.view.state = state
        self.plan.note_beats(state, self.now())
        held: dict[PartKey, Partition | None] = {}
        for part, rec in state.parts.items():
            replicas = self.plan.replicas(rec)
            if replicas is not None:
                held[part] = self._partition(part[0], part[1], list(replicas))
        return held

    async def _replace(self, p: Partition, rec: PartRecords, replace: Replace) -> None:
        """The leader's new assignment of ``p``, guarded by the one it read and by its
        leadership (a later leader, or another re-placement, wins; the next tick reads)."""
        assert rec.assignment is not None
        keys = self.member.keys
        result = await self.member.etcd.txn(
            [
                Compare(rec.assignment.key, "MOD", "EQUAL", rec.assignment.mod_revision),
                Compare(keys.part(p.topic, p.origin, "leader"), "MOD", "EQUAL", p.epoch),
            ],
            [put_op(rec.assignment.key, replace.assignment.encode())],
        )
        if not result.succeeded:
            return
        new = list(replace.assignment.replicas)
        _say_replaced(p.name, p.replicas, replace, self.plan.replace_after)
        p.replicas = new

    def topic_deleted(self, topic: str) -> None:
        """nsqd deleted ``topic``: this node's partition of it goes, here and everywhere (its
        keys are deleted from etcd, every node holding a copy drops it on its next read).
        Publishes waiting for it fail; its followers' fetches are refused."""
        key = (topic, self.node_id)
        p = self.partitions.pop(key, None)
        if p is not None:
            self._forget(p, "the topic was deleted")
        if key in self.view.state.parts or p is not None:
            self._deleting.add(key)
            self._tasks.append(asyncio.create_task(self._delete_keys()))

    async def _delete_keys(self) -> None:
        """The keys of this node's deleted partitions (tried again every tick until etcd
        takes it)."""
        for topic, origin in list(self._deleting):
            prefix = self.member.keys.part(topic, origin, "")
            try:
                await self.member.etcd.txn([], [delete_op(prefix, prefix=True)])
            except EtcdError as err:
                log.warning("CLUSTER: partition %s/%d: deleting it failed - %s", topic, origin, err)
                continue
            self._deleting.discard((topic, origin))
            log.info("CLUSTER: partition %s/%d: deleted (its topic was deleted)", topic, origin)

    def _forget(self, p: Partition, why: str) -> None:
        """Stop holding ``p``: no fetch, no leading, waiting publishes fail with ``why``."""
        key = (p.topic, p.origin)
        self.following.stop(key)
        if p.role is Role.LEADER:
            p.step_down(why)
        p.fail_waiters(why)
        p.role = Role.NONE
        self.leading.unwatch(p)
        self.plan.forget([key])

    def _drop_unassigned(self, state: ClusterState, held: Container[PartKey]) -> None:
        """Copies this node holds of partitions whose assignment no longer names it (the
        leader re-placed them while this node was gone): no longer fetched or served. The
        files stay (a later assignment may name this node again)."""
        for key in [k for k in self.partitions if k not in held]:
            p = self.partitions[key]
            if key not in state.parts:
                # Its keys are gone: its origin deleted the topic. The copy goes too.
                del self.partitions[key]
                self._forget(p, "the topic was deleted on its origin node")
                if not p.is_origin:
                    self.host.retention.drop_replica(p.topic, p.origin)
                log.warning(
                    "CLUSTER: partition %s: deleted on its origin node; this node's copy is "
                    "removed",
                    p.name,
                )
                continue
            if p.role is Role.LEADER or p.is_origin:
                continue
            del self.partitions[key]
            self._forget(p, "this node no longer holds a copy")
            log.warning(
                "CLUSTER: partition %s: this node no longer holds a copy (re-placed while it "
                "was gone)",
                p.name,
            )

    def _retained(self, topic: str) -> bool:
        return topic in self.host.topics and self.host.retention.get(topic) is not None

    async def _place(self, place: Place) -> None:
        """This node's own partition of a replicated topic it retains: placed and led by it."""
        _say_placing(place, self.view.state)
        keys = self.member.keys
        assignment = keys.part(place.topic, self.node_id, "assignment")
        await self.member.etcd.txn(
            [Compare(assignment, "CREATE", "EQUAL", 0)],
            [
                put_op(assignment, place.assignment.encode()),
                put_op(
                    keys.part(place.topic, self.node_id, "isr"),
                    InSync((self.member.me,)).encode(),
                ),
            ],
        )

    def _partition(self, topic: str, origin: int, replicas: list[int]) -> Partition | None:
        key = (topic, origin)
        p = self.partitions.get(key)
        if p is not None:
            p.replicas = replicas
            p.settings = self.view.state.settings.get(topic, p.settings)
            return p
        if origin == self.node_id:
            tlog = self.host.retention.get(topic)
            if tlog is None:
                return None
        else:
            tlog = self.host.retention.open_replica(topic, origin)
        p = Partition(
            topic,
            origin,
            self.member.me,
            tlog,
            EpochHistory(tlog.directory),
            self.view.state.settings.get(topic, self.defaults),
        )
        p.replicas = replicas
        self.partitions[key] = p
        self.leading.watch(p)
        log.info("CLUSTER: partition %s: holding a copy (replicas %s)", p.name, replicas)
        return p

    async def _carry_out(self, p: Partition, action: Action) -> bool:
        """One action of the plan; False: the rest of this tick's actions for ``p`` wait."""
        key = (p.topic, p.origin)
        match action:
            case StepDown(why):
                if p.role is Role.LEADER:
                    log.warning("CLUSTER: partition %s: stepping down - %s", p.name, why)
                p.step_down(why)
            case StopFetch():
                self.following.stop(key)
            case Leaderless():
                p.role, p.leader = Role.NONE, -1
            case Campaign():
                await self.leading.campaign(p)
            case Offline(isr, lost):
                # No unclean election: a copy outside the in-sync set, or one that lost
                # records, may lack what was acknowledged (``report.offline``).
                log.warning("CLUSTER: partition %s: offline - %s", p.name, offline(isr, lost))
            case Lead():
                await self.leading.lead(p)
            case Adopt():
                await self.checkpoints.adopt(p, self.view.state.checkpoints.get(key, {}))
            case ResumeChannels():
                await self.checkpoints.took_back(p)  # led again: its channels go on
            case Resign(leader):
                # A leadership this node no longer serves (a registration since): given up.
                with contextlib.suppress(EtcdError):
                    await self.member.etcd.txn(
                        [Compare(leader.key, "MOD", "EQUAL", leader.mod_revision)],
                        [delete_op(leader.key)],
                    )
            case Follow(node, http, epoch):
                log.info(
                    "CLUSTER: partition %s: following node %s at epoch %d", p.name, node, epoch
                )
                p.follow(node, http, epoch)
            case StartFetch():
                self.following.start(p)
            case TakeBack(leader):
                if not await self.leading.take_back(p, leader):
                    p.role = Role.NONE  # the next tick follows whoever leads now
                    return False
                if self.view.ready:
                    await self.checkpoints.took_back(p)
        return True

    # -- what the server and the HTTP API ask -----------------------------------------------

    def committed(self, topic: str, end: int) -> bool:
        """Whether a publish ending at ``end`` may be answered now."""
        return self.leading.committed(topic, end)

    def wait(self, topic: str, end: int, done: Callable[[str | None], None]) -> None:
        """Call ``done(None)`` once offsets below ``end`` are committed, ``done(reason)`` when
        they could not be in ``--replication-timeout`` (they may still be)."""
        self.leading.wait(topic, end, done)

    def read_log(self, topic: str, origin: int) -> TopicLog | None:
        """A partition's log for plain readers (``partition=`` on ``/topic/log``)."""
        p = self.partitions.get((topic, origin))
        return p.log if p is not None else None

    async def set_settings(
        self, topic: str, get: Callable[[str], str | None]
    ) -> ReplicationSettings:
        """``POST /topic/replication``: kept in etcd for every node. Raises SettingsError or
        EtcdError."""
        base = self.view.state.settings.get(topic, self.defaults)
        settings = ReplicationSettings.parse(get, base)
        placed = any(name == topic for name, _ in self.view.state.parts)
        check_change(topic, base, settings, placed=placed)
        await self.member.etcd.put(self.member.keys.topic(topic), settings.encode())
        await self._refresh()
        return settings

    async def replicated_anywhere(self, topic: str) -> bool:
        """Whether ``topic`` has settings in etcd, asked now (the last read may be a tick
        old). Raises EtcdError."""
        if topic in self.view.state.settings:
            return True
        return await self.member.etcd.get(self.member.keys.topic(topic)) is not None

    def settings_for(self, topic: str) -> ReplicationSettings | None:
        return self.view.state.settings.get(topic)

    def node_addresses(self) -> dict[str, str]:
        """Every registered node's HTTP address, by node id (as etcd holds them)."""
        return {str(n): info.http for n, info in sorted(self.view.state.nodes.items()) if info.http}

    def alive(self) -> list[int]:
        return self.plan.placeable(self.view.state, self.now())  # for /info: seen alive lately

    def describe(self, topic: str) -> list[dict[str, Any]]:
        """For ``/stats`` and ``/topic/config``: every partition of ``topic`` this node holds
        (``report.describe``)."""
        return describe(topic, self.partitions, self.view.state, time.time(), self.node_id)


def _say_placing(place: Place, state: ClusterState) -> None:
    """What placing this node's own partition leaves short of the settings, in the log."""
    if place.short:
        log.warning(
            "CLUSTER: topic %s wants %d replicas, %d nodes are live: placing on %s",
            place.topic,
            state.settings[place.topic].replicas,
            len(place.assignment.replicas),
            list(place.assignment.replicas),
        )
    if place.same_host:
        log.warning(
            "CLUSTER: topic %s: fewer hosts than copies: replicas %s share a host (hosts %s;"
            " --host-label)",
            place.topic,
            list(place.assignment.replicas),
            sorted(set(state.hosts().values())),
        )


def _say_replaced(name: str, old: list[int], replace: Replace, after: float) -> None:
    """A leader's re-placement of its partition's copies, in the log."""
    new = list(replace.assignment.replicas)
    if replace.gone:
        log.warning(
            "CLUSTER: partition %s: node(s) %s gone for %gs: its copies re-placed, replicas "
            "%s -> %s",
            name,
            list(replace.gone),
            after,
            old,
            new,
        )
    else:
        log.info("CLUSTER: partition %s: replicas %s -> %s", name, old, new)
    if replace.same_host:
        log.warning(
            "CLUSTER: partition %s: fewer hosts than copies: replicas %s share a host", name, new
        )
