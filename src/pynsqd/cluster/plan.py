"""The plan: what this node does about each partition, decided from one read of etcd. No I/O.

Theory of operation (``docs/replication.md``). Every tick the replicator reads the cluster's
keys (``records.ClusterState``) and, for each partition whose assignment names this node, asks
``Plan.decide`` what to do, given the partition as this node holds it (``Facts``). The answer is
a list of ``Action`` values that ``cluster/replicator.py`` carries out in order (etcd txns,
fetch tasks, channel adoption); nothing here touches a socket, a file or a clock other than the
``now`` it is given. The rules:

- **Leaderless** (the leader key is gone: its lease lapsed or was revoked). A leader steps down;
  fetching stops. A member of the in-sync set campaigns once the partition has been leaderless
  for ``rank * RANK_DELAY`` seconds: the origin at once (rank 0), the others in in-sync order,
  so the origin wins when it is alive. A copy outside the in-sync set never campaigns (no unclean
  election: it may lack what was acknowledged), nor does a member whose log **lost** records
  after an fsync covered them (``Facts.lost``: a file damaged or cut short while the node was
  down): it may hold less than was committed, and whoever follows the leader it would be cuts
  its log to that leader's end. It fetches what it lost from whoever leads, and campaigns again
  once it holds it. When no in-sync member that may lead is alive the partition is offline,
  said once per outage.
- **Led by this node at its epoch**: the leader's tick (in-sync set, fsync, HW); once the node
  has joined, it adopts the channel checkpoints of holders that left, and an origin that took
  its partition back lets its channels go on. A leader whose log **lost** records while it led
  (a closed segment found damaged when read: ``TopicLog.damaged``) gives way to a live in-sync
  copy (step down, resign): it follows, and fetches them again. With no such copy it leads on,
  its reads skipping the lost offsets (nothing better holds them), and says so.
- **A leadership key naming this node at another epoch** (a registration since, after a pause
  or a restart): given up, guarded by that key's revision; the next read elects anew.
- **Led by another node**: follow it at its epoch (a fetch task, started again every tick in
  case one died or a failed take-back stopped it). The origin, in sync and caught up with a
  takeover leader (which never appends), takes its partition back.
- **Placement** (``to_place``, ``to_replace``). A node places its own partition of a replicated
  topic by rendezvous hashing over the live nodes. Its leader re-places it: a copy on a node
  that has not been a member for ``replace_after`` seconds (it died, or never came back) moves
  to a live node that holds none, and a partition placed on fewer nodes than its settings want
  (too few were live) grows as nodes join. A new copy goes only to a node seen alive lately:
  each node re-writes its registration every beat (``membership.BEAT``), and one whose key
  stood still for ``fresh_within`` seconds is passed over (a killed node stays registered
  until its lease lapses: a topic placed meanwhile got copies that never fetched). The origin
  keeps its copy (it takes its partition back when it returns); a node that leaves the
  assignment stops holding its copy.

Past defects the kill -9 soaks found, each a case in ``tests/unit/cluster/test_plan.py``: a node
that took back a partition and failed must follow again on the next tick; a fetch stopped by a
failed take-back must start again; a leadership of a previous registration must be released, not
led; an out-of-sync copy must not campaign even when every in-sync member is dead; adoption
waits until the node has restored its own channels; an in-sync copy whose newest segment was cut
short while its node was down must not campaign (it led with fewer records than were committed,
and the others cut theirs to its end: issue 56).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from .records import (
    Assignment,
    ClusterState,
    Leadership,
    Member,
    PartKey,
    PartRecords,
    Stored,
)
from .settings import ReplicationSettings

__all__ = [
    "FRESH_WITHIN",
    "RANK_DELAY",
    "Action",
    "Adopt",
    "Campaign",
    "Facts",
    "Follow",
    "Lead",
    "Leaderless",
    "Offline",
    "Place",
    "Plan",
    "Replace",
    "Resign",
    "ResumeChannels",
    "StartFetch",
    "StepDown",
    "StopFetch",
    "TakeBack",
    "rendezvous",
]

#: A leaderless partition's in-sync members campaign after rank times this (the origin first).
RANK_DELAY = 0.4
#: A node whose registration was not re-written for this long is not given a new copy: about
#: a second (it beats every ``membership.BEAT``, 0.5 s; this node reads every 0.25 s).
FRESH_WITHIN = 1.5


# -- actions: what the shell carries out, in order --------------------------------------------


@dataclass(frozen=True)
class StepDown:
    why: str


@dataclass(frozen=True)
class StopFetch:
    pass


@dataclass(frozen=True)
class Leaderless:
    """Forget the leader this node knew (role none, leader -1)."""


@dataclass(frozen=True)
class Campaign:
    """Create the leader key under this node's lease while the in-sync set is as read."""


@dataclass(frozen=True)
class Offline:
    """Say once: no member of the in-sync set that may lead is alive; this copy may not lead
    (outside the set, or ``lost``: the offsets its log lost, ``first-last``)."""

    isr: tuple[int, ...]
    lost: str = ""


@dataclass(frozen=True)
class Lead:
    """The leader's tick: the in-sync set, the fsync, the HW."""


@dataclass(frozen=True)
class Adopt:
    """Adopt the channel checkpoints of holders no longer in the cluster."""


@dataclass(frozen=True)
class ResumeChannels:
    """The origin leads its partition again: its channels go on (``Checkpoints.took_back``)."""


@dataclass(frozen=True)
class Resign:
    """Delete a leadership of this node that it does not serve, guarded by its revision."""

    leader: Stored[Leadership]


@dataclass(frozen=True)
class Follow:
    node: int
    http: str
    epoch: int


@dataclass(frozen=True)
class StartFetch:
    """Fetch at the current epoch (a no-op when that fetch runs)."""


@dataclass(frozen=True)
class TakeBack:
    """The origin leads again by a txn guarded by the takeover leader's key and the in-sync
    set; if the txn fails the partition forgets its role (the next tick follows whoever leads),
    if it succeeds and the node has joined, its channels go on."""

    leader: Stored[Leadership]


@dataclass(frozen=True)
class Replace:
    """The leader's new assignment of a partition: ``gone`` replaced (or copies added)."""

    assignment: Assignment
    gone: tuple[int, ...]
    same_host: bool = False


@dataclass(frozen=True)
class Place:
    """Create this node's own partition of a replicated topic: assignment and in-sync set."""

    topic: str
    assignment: Assignment
    short: bool  # fewer live nodes than the settings' replicas: placed on those there are
    #: Fewer hosts than copies: some copies share a host (a lost host loses them together).
    same_host: bool = False


Action = (
    StepDown
    | StopFetch
    | Leaderless
    | Campaign
    | Offline
    | Lead
    | Adopt
    | ResumeChannels
    | Resign
    | Follow
    | StartFetch
    | TakeBack
)


# -- what the plan is told of one partition ----------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """One partition as this node holds it, at this tick."""

    key: PartKey
    me: Member
    #: ``Role.value`` of the partition here: "none", "leader" or "follower".
    role: str
    epoch: int
    isr: tuple[Member, ...]
    #: Follower: the leader's log end at its last answer equals this copy's end.
    caught_up: bool
    #: The node has restored its channels (``ClusterView.ready``).
    ready: bool = True
    #: Some holder has a channel checkpoint of this partition.
    checkpoints: bool = False
    #: The origin's topic holds its hand-off (its channels were adopted, or it is taking back).
    hand_off_held: bool = False
    #: The offsets this copy's log lost after an fsync covered them (``TopicLog.lost``:
    #: ``first-last``), until it has fetched them again; "" when it lost nothing.
    lost: str = ""

    @property
    def is_origin(self) -> bool:
        return self.key[1] == self.me[0]


def rendezvous(
    topic: str,
    origin: int,
    nodes: Iterable[int],
    count: int,
    hosts: Mapping[int, str] | None = None,
    lanes: Mapping[int, int] | None = None,
) -> list[int]:
    """The origin, then the ``count - 1`` other live nodes with the highest hash for it; with
    ``lanes`` (node -> its worker index on its node), those of the origin's worker index
    first (so a producer's home worker, the same index on every node of as many workers,
    holds the copies of its other homes' partitions: ``docs/exactly-once.md``); with ``hosts``
    (node -> host label), nodes on a host that holds no copy yet first."""

    def weight(n: int) -> bytes:
        return hashlib.sha256(f"{topic}/{origin}/{n}".encode()).digest()

    others = sorted((n for n in nodes if n != origin), key=weight, reverse=True)
    if lanes:
        lane = lanes.get(origin, 0)
        others.sort(key=lambda n: lanes.get(n, 0) != lane)  # stable: by weight within
    if not hosts:
        return [origin, *others[: count - 1]]
    return [origin, *spread(others, count - 1, {host_of(hosts, origin)}, hosts)]


def host_of(hosts: Mapping[int, str], node: int) -> str:
    """A node's host label; a node without one is a host of its own."""
    return hosts.get(node) or f"node {node}"


def spread(ranked: list[int], count: int, used: set[str], hosts: Mapping[int, str]) -> list[int]:
    """``count`` of ``ranked`` (best first): those on hosts not in ``used`` first, then the rest
    (more copies than hosts: some share one)."""
    chosen: list[int] = []
    rest: list[int] = []
    for n in ranked:
        if len(chosen) == count:
            break
        h = host_of(hosts, n)
        if h in used:
            rest.append(n)
        else:
            chosen.append(n)
            used.add(h)
    return chosen + rest[: count - len(chosen)]


def shares_a_host(replicas: Iterable[int], hosts: Mapping[int, str]) -> bool:
    labels = [host_of(hosts, n) for n in replicas]
    return len(set(labels)) < len(labels)


@dataclass
class Plan:
    """The plan's memory between ticks: since when each partition has been leaderless, and
    which were said to be offline."""

    node_id: int
    leaderless_since: dict[PartKey, float] = field(default_factory=dict)
    offline: set[PartKey] = field(default_factory=set)
    #: Seconds a copy's node may be missing from the cluster before its copy is re-placed.
    replace_after: float = 30.0
    #: Since when each (partition, node) of an assignment has been missing.
    missing_since: dict[tuple[PartKey, int], float] = field(default_factory=dict)
    #: Each registered node's beat as last seen here: its key's revision, and when it changed.
    beats: dict[int, tuple[int, float]] = field(default_factory=dict)
    #: A node whose beat stood still this long gets no new copy (killed: its registration
    #: lives until its lease lapses).
    fresh_within: float = FRESH_WITHIN

    def note_beats(self, state: ClusterState, now: float) -> None:
        """Take in one read's beats (``ClusterState.beats``)."""
        for n, revision in state.beats.items():
            seen = self.beats.get(n)
            if seen is None or seen[0] != revision:
                self.beats[n] = (revision, now)
        for n in [n for n in self.beats if n not in state.nodes]:
            del self.beats[n]

    def placeable(self, state: ClusterState, now: float) -> list[int]:
        """The registered nodes a new copy may go to: this one, and those whose beat was
        seen to change within ``fresh_within`` (a node not yet seen counts until then)."""
        return sorted(
            n
            for n in state.nodes
            if n == self.node_id or now - self.beats.get(n, (0, now))[1] <= self.fresh_within
        )

    def replicas(self, rec: PartRecords) -> tuple[int, ...] | None:
        """The copies of a partition when this node holds one of them, else None."""
        if rec.assignment is None or self.node_id not in rec.assignment.value.replicas:
            return None
        return rec.assignment.value.replicas

    def to_place(
        self, state: ClusterState, retained: Callable[[str], bool], now: float = 0.0
    ) -> list[Place]:
        """This node's own partitions to create: every replicated topic it retains that has
        none yet, placed by rendezvous hashing over the live nodes (``placeable``)."""
        out = []
        for topic, settings in state.settings.items():
            if not settings.replicated or (topic, self.node_id) in state.parts:
                continue
            if not retained(topic):
                continue
            out.append(self._place(topic, settings, state, self.placeable(state, now)))
        return out

    def to_replace(
        self,
        key: PartKey,
        rec: PartRecords,
        settings: ReplicationSettings,
        state: ClusterState,
        now: float,
    ) -> Replace | None:
        """The leader of ``key``: a new assignment when a copy's node has been gone for
        ``replace_after`` seconds, or the partition has fewer copies than ``settings`` want
        and a live node holds none; None when it stays."""
        if rec.assignment is None:
            return None
        current = rec.assignment.value.replicas
        gone: list[int] = []
        for n in current:
            if n in state.nodes or n in (key[1], self.node_id):
                self.missing_since.pop((key, n), None)
                continue
            since = self.missing_since.setdefault((key, n), now)
            if now - since >= self.replace_after:
                gone.append(n)
        # Live nodes holding no copy, best first for this partition: each replaces a gone
        # copy (none there: the gone copy stays, its node may come back), then the
        # partition grows to the copies its settings want.
        spare = [n for n in self.placeable(state, now) if n not in current]
        hosts = state.hosts()
        ranked = rendezvous(key[0], key[1], spare, len(spare) + 1, lanes=state.lanes())[1:]
        # Hosts that keep a copy are taken: a replacement goes to another host first.
        used = {host_of(hosts, n) for n in current if n not in gone}
        ranked = spread(ranked, len(ranked), used, hosts)
        new = list(current)
        moved: list[int] = []
        for n in gone:
            if not ranked:
                break
            new[new.index(n)] = ranked.pop(0)
            moved.append(n)
            self.missing_since.pop((key, n), None)
        while len(new) < settings.replicas and ranked:
            new.append(ranked.pop(0))
        if tuple(new) == current:
            return None
        return Replace(Assignment(tuple(new)), tuple(moved), shares_a_host(new, hosts))

    def _place(
        self, topic: str, settings: ReplicationSettings, state: ClusterState, nodes: list[int]
    ) -> Place:
        hosts = state.hosts()
        replicas = rendezvous(topic, self.node_id, nodes, settings.replicas, hosts, state.lanes())
        return Place(
            topic,
            Assignment(tuple(replicas)),
            len(replicas) < settings.replicas,
            shares_a_host(replicas, hosts),
        )

    def decide(
        self,
        facts: Facts,
        leader: Stored[Leadership] | None,
        now: float,
        live: Callable[[Member], bool],
    ) -> list[Action]:
        """What to do about one partition this node holds a copy of."""
        key, me = facts.key, facts.me
        if leader is None:
            out: list[Action] = []
            if facts.role == "leader":
                out.append(StepDown("its leadership key is gone (lease lapsed)"))
            out += [StopFetch(), Leaderless()]
            since = self.leaderless_since.setdefault(key, now)
            if me in facts.isr and not facts.lost:
                rank = 0 if facts.is_origin else 1 + facts.isr.index(me)
                if now - since >= rank * RANK_DELAY:
                    out.append(Campaign())
            elif key not in self.offline and not any(
                live(m) for m in facts.isr if m != me or not facts.lost
            ):
                self.offline.add(key)
                out.append(Offline(tuple(m[0] for m in facts.isr), facts.lost))
            return out
        self.leaderless_since.pop(key, None)
        self.offline.discard(key)
        mine = leader.value.node == me[0]
        if mine and leader.mod_revision == facts.epoch and facts.role == "leader":
            if facts.lost and any(live(m) for m in facts.isr if m != me):
                # Its copy lost records while it led (a damaged closed segment, found when
                # read): a copy that holds them leads instead; this one fetches them again.
                return [StepDown(f"its copy lost offsets {facts.lost}"), Resign(leader)]
            out = [Lead()]
            if not facts.ready:
                return out  # channels are restored first (``Replicator.start``)
            if facts.checkpoints:
                out.append(Adopt())
            if facts.is_origin and facts.hand_off_held:
                out.append(ResumeChannels())
            return out
        if mine:
            return [Resign(leader)]
        out = []
        if facts.role != "follower" or facts.epoch != leader.mod_revision:
            out.append(Follow(leader.value.node, leader.value.http, leader.mod_revision))
        out.append(StartFetch())
        if facts.is_origin and me in facts.isr and facts.caught_up and not facts.lost:
            out += [StopFetch(), TakeBack(leader)]
        return out

    def forget(self, keys: Iterable[PartKey]) -> None:
        for key in keys:
            self.leaderless_since.pop(key, None)
            self.offline.discard(key)
