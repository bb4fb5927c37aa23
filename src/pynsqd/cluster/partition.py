"""One replicated partition as this node sees it: its role, epoch, in-sync set and high
watermark. No I/O: ``cluster/replicator.py`` feeds it what etcd and the fetches say.

Theory of operation (``docs/replication.md`` has the whole model). A partition is one node's own
retained log of a topic, ``(topic, origin)``: only the origin ever appends to it, and ``replicas``
nodes hold copies. etcd names the partition's leader (a key bound to the leader's lease); the
key's ``mod_revision`` when it was written is the leader's **epoch**, the fencing token of the
data path. Followers pull the leader's records (``GET /topic/log`` with ``replica`` and ``epoch``):
the offset each asks for is its acknowledgement that it holds (fsynced, with ``durability=fsync``)
everything before it. The leader's own acknowledgement is what its fsync covered.

The high watermark (HW) is the smallest acknowledgement over the in-sync set as recorded in etcd,
the leader included, and it moves only while that set has at least ``min_insync`` members: a
record below it is on every in-sync replica. Only the leader changes the in-sync set, by a txn
that holds only while its epoch is current; only a member of the set can become leader. So every
committed record is on any future leader: a new leader never needs what it does not have, and a
leader that was paused or cut off can append locally but never commit (its followers fetch from
the new leader and stop acknowledging to it).

A takeover leader (a follower that took the partition after the origin's lease lapsed) never
appends: its log end is final for that epoch. Replicas whose log goes beyond the leader's truncate
what is beyond, guided by the epoch history each keeps (``storage/epochs.py``; KIP-101): the
leader answers a follower's last epoch with where that epoch ended in its own history.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core import tracing
from ..storage.epochs import EpochHistory
from ..storage.topiclog import TopicLog
from .records import Member
from .settings import ReplicationSettings

__all__ = ["Member", "Partition", "Role"]


class Role(enum.Enum):
    NONE = "none"  # not yet placed, or no leader known
    LEADER = "leader"
    FOLLOWER = "follower"


@dataclass
class Waiter:
    end: int
    done: Callable[[str | None], None]


@dataclass
class Partition:
    topic: str
    origin: int
    me: Member
    log: TopicLog
    history: EpochHistory
    settings: ReplicationSettings
    role: Role = Role.NONE
    epoch: int = 0
    leader: int = -1
    leader_http: str = ""
    #: The in-sync set as etcd holds it, and the revision of that key (txn guard).
    isr: list[Member] = field(default_factory=list)
    isr_revision: int = 0
    replicas: list[int] = field(default_factory=list)
    #: Leader: each follower's last acknowledged offset, and when it last was caught up.
    acks: dict[Member, int] = field(default_factory=dict)
    caught_up_at: dict[Member, float] = field(default_factory=dict)
    #: Leader: when it answered each follower's last fetch, until the follower asks again (a
    #: follower silent for ``--replica-stall-max`` after an answer stopped fetching).
    answered_at: dict[Member, float] = field(default_factory=dict)
    #: Leader: publishes waiting for the HW to pass their end, in order.
    waiters: list[Waiter] = field(default_factory=list)
    #: Leader: whether its lease is known valid (a second guard: commits stop without it).
    lease_ok: bool = True
    #: The high watermark: every offset below it is committed.
    hw: int = 0
    #: Follower: the leader's log end at its last answer (an origin takes its partition back
    #: once it has caught up with it).
    leader_latest: int = -1
    #: Follower: its fetch stream to the leader is open (a leader that died closed it).
    streaming: bool = False
    #: Follower: the epoch in which this copy last held all its leader had (-1: never).
    caught_up_epoch: int = -1

    def __post_init__(self) -> None:
        if not self.is_origin:
            self.log.commit_to(0)  # a copy shows nothing until its leader says it is committed

    @staticmethod
    def hold_unplaced(tlog: TopicLog) -> None:
        """A retained topic's first replicated publish, before its partition is placed:
        nothing from here on is visible (handed to channels, read) before it commits."""
        if tlog.committed is None:
            tlog.commit_to(tlog.latest)

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.origin}"

    @property
    def is_origin(self) -> bool:
        return self.origin == self.me[0]

    @property
    def writable(self) -> bool:
        """Whether publishes to the origin's topic may append: it leads its own partition, or
        no other node is known to lead it."""
        return self.is_origin and (self.role is Role.LEADER or self.leader in (-1, self.me[0]))

    @property
    def settled(self) -> bool:
        """A copy that holds all that its partition held when its leader last changed: led by
        this node, or following a live leader (an open stream: a leader killed closes it at
        once) and caught up with it at least once in its epoch. Not while a takeover is under
        way, nor before a copy has fetched what the new leader had (a record of the dead
        leader's that only the new one held). A copy briefly behind a live leader is settled:
        what it lacks was published there, on a live node."""
        if self.role is Role.LEADER:
            return True
        return (
            self.role is Role.FOLLOWER
            and self.streaming
            and self.leader != -1
            and self.caught_up_epoch == self.epoch
        )

    def own_ack(self) -> int:
        if self.settings.durability == "fsync":
            return min(self.log.synced, self.log.latest)
        return self.log.latest

    def lost(self) -> str:
        """The offsets this copy cannot vouch for, "first-last" ("": none): records its log
        lost after an fsync covered them (``TopicLog.lost``); its epoch history damaged, every
        record it holds (it cannot tell which a leader would keep); its synced mark unreadable,
        whatever followed its end (``SyncedMark.unknown``, until a leader vouches for it)."""
        lost = self.log.lost()
        if lost is not None:
            return f"{lost[0]}-{lost[1]}"
        if self.history.damaged and self.log.latest > self.log.earliest:
            return f"{self.log.earliest}-{self.log.latest - 1}"
        if self.log.mark.unknown:
            return f"from {self.log.latest} on, perhaps (its synced mark is unreadable)"
        return ""

    # -- leader ---------------------------------------------------------------------------

    def become_leader(self, epoch: int, now: float) -> None:
        """Won the election at ``epoch``: the in-sync followers get ``--replica-lag-max`` to
        fetch from it before they leave the set."""
        self.role = Role.LEADER
        self.epoch = epoch
        self.leader = self.me[0]
        self.acks.clear()
        self.caught_up_at = {m: now for m in self.isr if m != self.me}
        self.answered_at.clear()
        # The first leader of a partition owns what its log held before (a topic retained
        # before it was replicated, publishes taken while it was being placed).
        self.history.begin(epoch, self.log.latest if self.history.entries else self.log.earliest)

    def step_down(self, why: str) -> None:
        self.role = Role.NONE if self.leader == self.me[0] else self.role
        if self.leader == self.me[0]:
            self.leader = -1
        self.fail_waiters(why)

    def fetched(self, member: Member, offset: int, now: float) -> None:
        """A follower in this epoch asked for ``offset``: it holds everything before it. An
        in-sync follower asking below the high watermark lost what it had acknowledged (its
        log was damaged while its node was down): it is no longer counted, and leaves the
        in-sync set at the next tick (``isr_change``) until it has caught up again."""
        self.answered_at.pop(member, None)
        if offset < self.hw and member in self.isr and member != self.me:
            self.acks[member] = offset
            self.caught_up_at.pop(member, None)
            return
        if offset > self.acks.get(member, -1):
            self.acks[member] = offset
        if offset >= self.log.latest:
            self.caught_up_at[member] = now

    def answered(self, member: Member, now: float) -> None:
        """The leader answered ``member``'s fetch: it is expected to ask again at once."""
        self.answered_at[member] = now

    def stream_closed(self, member: Member) -> None:
        """``member``'s fetch stream ended (its process died, or it reconnects): it counts as
        silent from now on until it asks again."""
        self.answered_at[member] = -math.inf

    def stalled(self, member: Member, now: float, stall_max: float) -> bool:
        """Whether ``member`` was answered more than ``stall_max`` seconds ago and has not
        asked again since."""
        return now - self.answered_at.get(member, math.inf) > stall_max

    def compute_hw(self) -> int:
        """The new high watermark (never lower than the current one)."""
        if self.role is not Role.LEADER or not self.lease_ok:
            return self.hw
        if len(self.isr) < self.settings.min_insync or self.me not in self.isr:
            return self.hw
        low = self.own_ack()
        for m in self.isr:
            if m != self.me:
                low = min(low, self.acks.get(m, 0))
        return max(self.hw, min(low, self.log.latest))

    def advance(self) -> bool:
        """Move the HW as far as the acknowledgements allow; answer the publishes it passed.
        Returns whether it moved."""
        hw = self.compute_hw()
        moved = hw > self.hw
        self.hw = hw
        self.publish_visibility()
        if not moved:
            return False
        if tracing.TRACER is not None and self.is_origin:
            tracing.TRACER.committed(self.topic, hw)
        if self.waiters:
            done = [w for w in self.waiters if w.end <= hw]
            if done:
                self.waiters = [w for w in self.waiters if w.end > hw]
                for w in done:
                    w.done(None)
        return True

    def publish_visibility(self) -> None:
        """What readers and channels see: committed offsets; with ``acks=leader`` the origin
        shows what it wrote (replication follows: a failover can take the lag back)."""
        if self.settings.acks == "leader" and self.is_origin and self.role is Role.LEADER:
            self.log.commit_to(None)
        else:
            self.log.commit_to(min(self.hw, self.log.latest))

    def fail_waiters(self, why: str) -> None:
        if tracing.TRACER is not None and self.is_origin:
            tracing.TRACER.uncommitted(self.topic, why)
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            w.done(why)

    def isr_change(
        self,
        now: float,
        lag_max: float,
        live: Callable[[Member], bool],
        stall_max: float = math.inf,
    ) -> list[Member] | None:
        """The in-sync set the leader should record now (None: keep it): followers caught up
        join; followers that have not caught up within ``lag_max``, that stopped asking
        (``stalled``: silent ``stall_max`` seconds after an answer, or their stream closed),
        whose node is no longer a live member of the cluster (``live``), or that the
        assignment no longer names (``replicas``: re-placed), leave."""
        if self.role is not Role.LEADER:
            return None
        new = [
            m
            for m in self.isr
            if m == self.me
            or (
                m[0] in self.replicas
                and live(m)
                and now - self.caught_up_at.get(m, -math.inf) <= lag_max
                and not self.stalled(m, now, stall_max)
            )
        ]
        for m, at in self.caught_up_at.items():
            if (
                m not in new
                and m[0] in self.replicas
                and live(m)
                and now - at <= lag_max
                and not self.stalled(m, now, stall_max)
                and self.acks.get(m, -1) >= self.log.latest
            ):
                new.append(m)
        if self.me not in new:
            new.insert(0, self.me)
        return new if sorted(new) != sorted(self.isr) else None

    # -- follower -------------------------------------------------------------------------

    def follow(self, leader: int, http: str, epoch: int) -> None:
        """Another node leads at ``epoch``. Publishes this node appended and still waits for
        fail now, whatever the role was (a leaderless origin takes publishes): the new leader
        may not have them, and their offsets may be truncated and reused."""
        if self.leader == self.me[0] and self.role is Role.LEADER:
            self.step_down("the partition has a new leader")
        self.fail_waiters(f"node {leader} leads the partition now")
        self.role = Role.FOLLOWER
        self.leader, self.leader_http, self.epoch = leader, http, epoch

    def leader_answered(self, latest: int, hw: int) -> None:
        """Follower: the leader's log end and high watermark, as its last fetch answer said;
        this copy commits what it holds below that HW."""
        self.leader_latest = latest
        if self.log.latest >= latest:
            self.caught_up_epoch = self.epoch
            self.log.mark.vouch(self.log.latest)  # it holds the leader's whole log
        self.hw = max(self.hw, min(hw, self.log.latest))
        self.log.commit_to(self.hw)

    def end_for(self, epoch: int) -> int:
        """Leader: where the follower whose last epoch is ``epoch`` must cut its log."""
        return self.history.end_for(epoch, self.log.latest)
