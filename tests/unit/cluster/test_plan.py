"""The replication plan without I/O (``cluster/plan.py``) and the records kept in etcd
(``cluster/records.py``): each decision on its own, then whole elections, failovers and
take-backs of three simulated nodes over a fake etcd (transactions, leases) on a fake clock,
in milliseconds. The same rules run on real processes under kill -9 in
``tests/fault/test_replication.py``."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from pynsqd.cluster.etcd import Compare, KeyValue, delete_op, put_op
from pynsqd.cluster.plan import (
    RANK_DELAY,
    Adopt,
    Campaign,
    Facts,
    Follow,
    Lead,
    Leaderless,
    Offline,
    Plan,
    Resign,
    ResumeChannels,
    StartFetch,
    StepDown,
    StopFetch,
    TakeBack,
    rendezvous,
)
from pynsqd.cluster.records import (
    Assignment,
    ChannelCheckpoint,
    ClusterState,
    InSync,
    Keys,
    Leadership,
    NodeRecord,
    RecordError,
    Stored,
    Tombstone,
    decode_checkpoint,
)
from pynsqd.cluster.settings import ReplicationSettings

M1, M2, M3 = (1, "s1"), (2, "s2"), (3, "s3")
PART = ("t", 1)
KEYS = Keys("/pynsqd/test")


def everyone(member: tuple[int, str]) -> bool:
    return True


def nobody(member: tuple[int, str]) -> bool:
    return False


def leader(node: int, epoch: int) -> Stored[Leadership]:
    return Stored(KEYS.part("t", 1, "leader"), Leadership(node, f"n{node}:4151"), epoch)


def facts(me: tuple[int, str], **kw: Any) -> Facts:
    base: dict[str, Any] = {
        "key": PART,
        "me": me,
        "role": "none",
        "epoch": 0,
        "isr": (M1, M2, M3),
        "caught_up": False,
    }
    base.update(kw)
    return Facts(**base)


# -- records ------------------------------------------------------------------------------------


def test_every_record_round_trips_and_a_bad_value_is_a_record_error() -> None:
    node = NodeRecord(4, "abc", "h:4151", "h:4150", "/data")
    assert NodeRecord.decode(node.encode()) == node
    assert Assignment.decode(Assignment((1, 5, 2)).encode()) == Assignment((1, 5, 2))
    assert InSync.decode(InSync((M1, M3)).encode()) == InSync((M1, M3))
    assert Leadership.decode(Leadership(2, "h:1").encode()) == Leadership(2, "h:1")
    cp = ChannelCheckpoint(2, "s2", True, {"c": {"low": 3, "end": None, "done": []}}, 7)
    assert decode_checkpoint(cp.encode()) == cp
    assert decode_checkpoint(Tombstone(2, 3, 40).encode()) == Tombstone(2, 3, 40)
    named = Tombstone(2, 3, 40, ("a", "b"))  # the channels it adopted, for a later adopter
    assert decode_checkpoint(named.encode()) == named
    assert decode_checkpoint(Tombstone(2, 3, 40, ()).encode()).channels == ()
    with pytest.raises(RecordError):
        decode_checkpoint(b'{"node": 2, "adopted_by": 3, "end": 40, "channels": [1]}')
    for bad in (b"", b"[1]", b"{not json", b'{"node": "x"}', b"\xff"):
        with pytest.raises(RecordError):
            Leadership.decode(bad)
    with pytest.raises(RecordError):
        InSync.decode(b'{"isr": [[1]]}')
    with pytest.raises(RecordError):
        decode_checkpoint(b'{"channels": []}')


def test_the_checkpoint_format_is_the_one_nodes_already_wrote() -> None:
    """A node of the previous release wrote these bytes; the record reads and writes them."""
    old = (
        b'{"node":2,"storage":"s2","clean":false,'
        b'"channels":{"a":{"low":1,"end":null,"done":[]}},"handed":9}'
    )
    assert decode_checkpoint(old).encode() == old
    tomb = decode_checkpoint(b'{"node": 2, "adopted_by": 3, "end": 40}')
    assert tomb == Tombstone(2, 3, 40) and tomb.channels is None  # not named: not known
    assert Leadership.decode(b'{"node": 2, "http": "h:1"}') == Leadership(2, "h:1")


def kv(key: str, value: bytes, rev: int = 1, lease: int = 0) -> KeyValue:
    return KeyValue(key, value, rev, rev, 1, lease)


def test_one_unreadable_key_is_reported_and_the_rest_is_read() -> None:
    state = ClusterState.parse(
        KEYS,
        [
            kv(KEYS.node(1), NodeRecord(1, "s1", "a:1").encode()),
            kv(KEYS.node(2), b"garbage", rev=5),
            kv(KEYS.topic("t"), ReplicationSettings(3, 2).encode()),
            kv(KEYS.part("t", 1, "assignment"), Assignment((1, 2, 3)).encode()),
            kv(KEYS.part("t", 1, "leader"), Leadership(1, "a:1").encode(), rev=9, lease=77),
            kv(KEYS.checkpoint("t", 1, 2), Tombstone(2, 1, 5).encode()),
            kv(KEYS.prefix + "/nodes/notanumber", b"{}"),
        ],
    )
    assert sorted(state.nodes) == [1]
    assert [(k, r) for k, r, _ in state.unreadable] == [
        (KEYS.node(2), 5),
        (KEYS.prefix + "/nodes/notanumber", 1),
    ]
    rec = state.parts[("t", 1)]
    assert rec.assignment is not None and rec.assignment.value.replicas == (1, 2, 3)
    assert rec.leader == Stored(KEYS.part("t", 1, "leader"), Leadership(1, "a:1"), 9, 77)
    assert rec.isr is None
    assert state.checkpoints[("t", 1)][2].value == Tombstone(2, 1, 5)
    assert state.live(M1) and not state.live((1, "other-disk")) and not state.live(M2)


# -- single decisions ---------------------------------------------------------------------------


def test_a_leader_whose_key_is_gone_steps_down_before_anything_else() -> None:
    plan = Plan(1)
    out = plan.decide(facts(M1, role="leader", epoch=5), None, 10.0, everyone)
    assert out[:3] == [
        StepDown("its leadership key is gone (lease lapsed)"),
        StopFetch(),
        Leaderless(),
    ]
    assert out[3:] == [Campaign()]  # the origin campaigns at once


def test_in_sync_members_campaign_by_rank_the_origin_first() -> None:
    for me, rank in ((M1, 0), (M2, 2), (M3, 3)):
        plan = Plan(me[0])
        assert Campaign() not in plan.decide(facts(me), None, 100.0, everyone)[:0]
        times = [100.0 + i * 0.05 for i in range(40)]
        first = next(t for t in times if Campaign() in plan.decide(facts(me), None, t, everyone))
        assert first == pytest.approx(100.0 + rank * RANK_DELAY, abs=0.051)


def test_no_unclean_election_and_offline_is_said_once_per_outage() -> None:
    """A copy outside the in-sync set never campaigns, even with every member dead."""
    plan = Plan(3)
    f = facts(M3, isr=(M1, M2))
    first = plan.decide(f, None, 0.0, nobody)
    assert first == [StopFetch(), Leaderless(), Offline((1, 2))]
    for t in range(1, 50):
        assert plan.decide(f, None, float(t), nobody) == [StopFetch(), Leaderless()]
    # A leader comes back: the outage ends; the next one is said again.
    plan.decide(facts(M3, isr=(M1, M2)), leader(1, 9), 60.0, nobody)
    assert Offline((1, 2)) in plan.decide(f, None, 61.0, nobody)
    # While a member lives, the partition is not offline: it waits for that member's campaign.
    assert plan.decide(facts(M3, isr=(M1, M2)), None, 62.0, everyone) == [StopFetch(), Leaderless()]


def test_a_copy_that_lost_records_never_campaigns_and_says_so_when_it_is_alone() -> None:
    """Found by the damaged-file attack (issue 56): node 2, in sync, came back with its newest
    segment cut short while the leader was down, was elected with fewer records than were
    committed, and the other copies cut theirs to its end."""
    damaged = facts(M2, lost="300-599")
    plan = Plan(2)
    for t in range(50):  # other members live: it waits for their campaign, not offline
        assert plan.decide(damaged, None, float(t), everyone) == [StopFetch(), Leaderless()]
    alone = Plan(2).decide(damaged, None, 0.0, lambda m: m == M2)
    assert alone == [StopFetch(), Leaderless(), Offline((1, 2, 3), "300-599")]
    # The origin too, at rank 0; once it holds what it lost, it campaigns at once.
    assert Campaign() not in Plan(1).decide(facts(M1, lost="5-9"), None, 10.0, everyone)
    assert Campaign() in Plan(1).decide(facts(M1), None, 10.0, everyone)
    # It follows whoever leads, and takes nothing back before it holds what it lost.
    by3 = leader(3, 9)
    following = facts(M1, role="follower", epoch=9, caught_up=True, lost="5-9")
    assert Plan(1).decide(following, by3, 0.0, everyone) == [StartFetch()]


def test_a_leader_whose_copy_lost_records_gives_way_to_a_live_in_sync_copy() -> None:
    """Issue 56 item 4: a leader that finds a damaged record in a closed segment when reading
    it (``TopicLog.damaged``) holds less than was committed; it must not go on leading (it
    would serve a gap where a good copy holds the records). It steps down and resigns while
    another in-sync copy is alive; alone, it leads on (no copy holds more)."""
    here = leader(1, 5)
    damaged = facts(M1, role="leader", epoch=5, lost="40-99")
    out = Plan(1).decide(damaged, here, 0.0, everyone)
    assert out == [StepDown("its copy lost offsets 40-99"), Resign(here)]
    assert Plan(1).decide(damaged, here, 0.0, lambda m: m == M1) == [Lead()]
    # A follower in the set is live but out of it now: the rule counts in-sync members only.
    only_me = facts(M1, role="leader", epoch=5, lost="40-99", isr=(M1,))
    assert Plan(1).decide(only_me, here, 0.0, everyone) == [Lead()]


def test_the_leader_adopts_and_resumes_only_once_it_has_joined() -> None:
    plan = Plan(1)
    here = leader(1, 5)
    joining = facts(M1, role="leader", epoch=5, ready=False, checkpoints=True, hand_off_held=True)
    assert plan.decide(joining, here, 0.0, everyone) == [Lead()]
    ready = facts(M1, role="leader", epoch=5, checkpoints=True, hand_off_held=True)
    assert plan.decide(ready, here, 0.0, everyone) == [Lead(), Adopt(), ResumeChannels()]
    # A takeover leader (not the origin) adopts but has no hand-off to resume.
    takeover = Facts(PART, M2, "leader", 5, (M1, M2), False, True, True, True)
    assert plan.decide(takeover, leader(2, 5), 0.0, everyone) == [Lead(), Adopt()]


def test_a_leadership_of_a_previous_registration_is_released_not_led() -> None:
    """Found by kill -9 soaks: a node restarted (or resumed after a pause) found the leader key
    naming it at an epoch it never led in this life, and acted as its leader."""
    plan = Plan(1)
    stale = leader(1, 5)
    assert plan.decide(facts(M1, role="none", epoch=0), stale, 0.0, everyone) == [Resign(stale)]
    assert plan.decide(facts(M1, role="leader", epoch=4), stale, 0.0, everyone) == [Resign(stale)]


def test_a_follower_follows_a_new_epoch_and_restarts_its_fetch_every_tick() -> None:
    plan = Plan(2)
    assert plan.decide(facts(M2), leader(1, 5), 0.0, everyone) == [
        Follow(1, "n1:4151", 5),
        StartFetch(),
    ]
    # Same epoch: only the fetch (a no-op when it runs, started again when it died).
    assert plan.decide(facts(M2, role="follower", epoch=5), leader(1, 5), 0.0, everyone) == [
        StartFetch()
    ]
    assert plan.decide(facts(M2, role="follower", epoch=5), leader(3, 8), 0.0, everyone) == [
        Follow(3, "n3:4151", 8),
        StartFetch(),
    ]


def test_the_origin_takes_back_only_in_sync_and_caught_up() -> None:
    plan = Plan(1)
    by2 = leader(2, 8)
    f = facts(M1, role="follower", epoch=8, caught_up=True)
    assert plan.decide(f, by2, 0.0, everyone) == [StartFetch(), StopFetch(), TakeBack(by2)]
    assert TakeBack(by2) not in plan.decide(facts(M1, role="follower", epoch=8), by2, 0, everyone)
    out_of_sync = facts(M1, role="follower", epoch=8, caught_up=True, isr=(M2, M3))
    assert TakeBack(by2) not in plan.decide(out_of_sync, by2, 0.0, everyone)
    # Not the origin: never takes back, however caught up.
    assert TakeBack(by2) not in Plan(3).decide(
        facts(M3, role="follower", epoch=8, caught_up=True), by2, 0.0, everyone
    )


def test_only_retained_replicated_unplaced_topics_are_placed() -> None:
    state = ClusterState()
    state.nodes = {n: NodeRecord(n, f"s{n}", f"h{n}:1") for n in (1, 2, 3, 4)}
    state.settings = {
        "a": ReplicationSettings(3, 2),
        "b": ReplicationSettings(1, 1),  # not replicated
        "c": ReplicationSettings(3, 2),  # placed already
        "d": ReplicationSettings(3, 2),  # not retained here
        "e": ReplicationSettings(7, 4),  # more copies than nodes
    }
    state.parts[("c", 1)] = ClusterState.parse(KEYS, []).parts.get(("x", 0)) or _placed()
    places = Plan(1).to_place(state, lambda t: t != "d")
    assert [(p.topic, p.short) for p in places] == [("a", False), ("e", True)]
    assert places[0].assignment.replicas == tuple(rendezvous("a", 1, [1, 2, 3, 4], 3))
    assert places[0].assignment.replicas[0] == 1 and len(set(places[1].assignment.replicas)) == 4


def _placed() -> Any:
    from pynsqd.cluster.records import PartRecords

    return PartRecords(Stored("k", Assignment((1, 2, 3)), 1))


def test_rendezvous_moves_few_copies_when_a_node_joins() -> None:
    before = {t: rendezvous(t, 1, range(1, 10), 3) for t in (f"t{i}" for i in range(200))}
    after = {t: rendezvous(t, 1, range(1, 11), 3) for t in before}
    moved = sum(before[t] != after[t] for t in before)
    assert 0 < moved < 100  # about 2/9 of them gain the new node
    assert all(r[0] == 1 and len(set(r)) == 3 for r in after.values())


def test_copies_go_to_the_origins_worker_index_on_other_hosts_first() -> None:
    """Three nodes of two workers (members 10, 11, 20, 21, 30, 31; a host each): a worker's
    partition is copied to the same worker index of the other nodes, so a producer's home
    worker (the same index everywhere) holds the copies of its other homes' partitions."""
    hosts = {m: f"node{m // 10}" for m in (10, 11, 20, 21, 30, 31)}
    lanes = {m: m % 10 for m in hosts}
    for t in (f"t{i}" for i in range(50)):
        for origin in hosts:
            replicas = rendezvous(t, origin, hosts, 3, hosts, lanes)
            assert replicas[0] == origin
            assert {lanes[m] for m in replicas} == {lanes[origin]}
            assert len({hosts[m] for m in replicas}) == 3
    # One lane short of hosts (node 3 runs one worker): the third copy takes another lane.
    del hosts[31], lanes[31]
    replicas = rendezvous("t", 11, hosts, 3, hosts, lanes)
    assert replicas[:2] == [11, 21] and replicas[2] == 30
    # Without lanes (single processes), the placement is the hash's, as before.
    assert rendezvous("t", 1, [1, 2, 3, 4], 3, None, {}) == rendezvous("t", 1, [1, 2, 3, 4], 3)


def _assigned(*replicas: int) -> Any:
    from pynsqd.cluster.records import PartRecords

    return PartRecords(Stored(KEYS.part("t", 1, "assignment"), Assignment(replicas), 5))


def _nodes(*ids: int) -> ClusterState:
    state = ClusterState()
    state.nodes = {n: NodeRecord(n, f"s{n}", f"h{n}:1") for n in ids}
    return state


def test_a_copy_on_a_node_gone_for_replace_after_moves_to_a_live_node() -> None:
    """Found running the real-client suites against a replicated node (issue 43): a node
    killed with kill -9 counts as live until its lease lapses, a topic placed then got two
    dead copies, was never re-placed, and never reached min in-sync: every publish failed."""
    plan = Plan(1, replace_after=10.0)
    settings = ReplicationSettings(3, 2)
    rec = _assigned(1, 2, 3)
    state = _nodes(1, 2, 4, 5)  # node 3 is gone
    assert plan.to_replace(PART, rec, settings, state, now=100.0) is None  # just missing
    assert plan.to_replace(PART, rec, settings, state, now=109.0) is None
    replace = plan.to_replace(PART, rec, settings, state, now=110.0)
    assert replace is not None and replace.gone == (3,)
    best = rendezvous("t", 1, [4, 5], 2)[1]
    assert replace.assignment.replicas == (1, 2, best)  # in place, the others untouched
    # A node that comes back in time keeps its copy (the clock restarts for it).
    plan2 = Plan(1, replace_after=10.0)
    assert plan2.to_replace(PART, rec, settings, state, now=0.0) is None
    assert plan2.to_replace(PART, rec, settings, _nodes(1, 2, 3, 4), now=5.0) is None
    assert plan2.to_replace(PART, rec, settings, state, now=12.0) is None  # missing again: anew


def test_no_live_spare_keeps_the_gone_copy_and_the_origin_is_never_moved() -> None:
    plan = Plan(2, replace_after=10.0)  # node 2 leads node 1's partition (a takeover)
    settings = ReplicationSettings(3, 2)
    rec = _assigned(1, 2, 3)
    state = _nodes(2, 3)  # the origin (1) is gone, and no other node is live
    for now in (0.0, 20.0, 40.0):
        assert plan.to_replace(PART, rec, settings, state, now=now) is None
    with_spare = _nodes(2, 3, 4)
    assert plan.to_replace(PART, rec, settings, with_spare, now=60.0) is None  # origin stays


def test_a_short_placement_grows_as_nodes_join() -> None:
    plan = Plan(1)
    settings = ReplicationSettings(3, 2)
    rec = _assigned(1, 2)  # placed when only two nodes were live
    assert plan.to_replace(PART, rec, settings, _nodes(1, 2), now=0.0) is None
    replace = plan.to_replace(PART, rec, settings, _nodes(1, 2, 3), now=1.0)
    assert replace is not None and replace.gone == ()
    assert replace.assignment.replicas == (1, 2, 3)


def _hosted(hosts: dict[int, str]) -> ClusterState:
    state = ClusterState()
    state.nodes = {n: NodeRecord(n, f"s{n}", f"h{n}:1", host=h) for n, h in hosts.items()}
    return state


def test_copies_go_to_distinct_hosts_first() -> None:
    """Issue 40: several nodes (or workers) on one host; a lost host must not take every copy.
    Nodes 1-3 on host a, 4-5 on b, 6 on c: every partition of node 1 gets a, b and c."""
    state = _hosted({1: "a", 2: "a", 3: "a", 4: "b", 5: "b", 6: "c"})
    state.settings = {f"t{i}": ReplicationSettings(3, 2) for i in range(50)}
    places = Plan(1).to_place(state, lambda t: True)
    for p in places:
        hosts = [state.nodes[n].host for n in p.assignment.replicas]
        assert p.assignment.replicas[0] == 1 and sorted(hosts) == ["a", "b", "c"], p
        assert not p.same_host
    # The hash still chooses among a host's nodes: both of b's are used across topics.
    assert {n for p in places for n in p.assignment.replicas if n in (4, 5)} == {4, 5}


def test_fewer_hosts_than_copies_share_a_host_and_say_so() -> None:
    state = _hosted({1: "a", 2: "a", 3: "b"})
    state.settings = {"t": ReplicationSettings(3, 2)}
    (place,) = Plan(1).to_place(state, lambda t: True)
    assert sorted(place.assignment.replicas) == [1, 2, 3] and place.same_host
    state.settings = {"t": ReplicationSettings(2, 2)}
    (place,) = Plan(1).to_place(state, lambda t: True)
    assert place.assignment.replicas == (1, 3) and not place.same_host


def test_a_gone_copy_is_replaced_on_a_host_that_holds_none() -> None:
    plan = Plan(1, replace_after=10.0)
    rec = _assigned(1, 2, 3)  # hosts a, b, c; node 3 (c) dies
    state = _hosted({1: "a", 2: "b", 4: "a", 5: "b", 6: "b", 7: "d"})
    assert plan.to_replace(PART, rec, ReplicationSettings(3, 2), state, now=0.0) is None
    replace = plan.to_replace(PART, rec, ReplicationSettings(3, 2), state, now=10.0)
    assert replace is not None and replace.assignment.replicas == (1, 2, 7)
    assert not replace.same_host


# -- three nodes over a fake etcd, on a fake clock ---------------------------------------------


class FakeEtcd:
    """etcd's keys, revisions, leases and txn compares, in memory."""

    def __init__(self) -> None:
        self.revision = 1
        self.keys: dict[str, KeyValue] = {}
        self.leases: dict[int, float] = {}
        self._next_lease = 100

    def grant(self, now: float, ttl: float) -> int:
        self._next_lease += 1
        self.leases[self._next_lease] = now + ttl
        return self._next_lease

    def expire(self, now: float) -> None:
        for lease, until in list(self.leases.items()):
            if until <= now:
                self.revoke(lease)

    def revoke(self, lease: int) -> None:
        self.leases.pop(lease, None)
        gone = [k for k, v in self.keys.items() if v.lease == lease]
        if gone:
            self.revision += 1
            for k in gone:
                del self.keys[k]

    def put(self, key: str, value: bytes, lease: int = 0) -> None:
        self.txn([], [put_op(key, value, lease)])

    def range(self, prefix: str) -> list[KeyValue]:
        return [v for k, v in sorted(self.keys.items()) if k.startswith(prefix)]

    def txn(self, compares: list[Compare], ops: list[dict[str, Any]]) -> tuple[bool, int]:
        for c in compares:
            kv = self.keys.get(c.key)
            have = (
                0
                if kv is None
                else (kv.create_revision if c.target == "CREATE" else kv.mod_revision)
            )
            assert c.result == "EQUAL"
            if have != c.value:
                return False, self.revision
        self.revision += 1
        for op in ops:
            if "request_put" in op:
                body = op["request_put"]
                key = base64.b64decode(body["key"]).decode()
                old = self.keys.get(key)
                lease = int(body.get("lease", 0))
                if lease and lease not in self.leases:
                    return False, self.revision
                self.keys[key] = KeyValue(
                    key,
                    base64.b64decode(body["value"]),
                    old.create_revision if old else self.revision,
                    self.revision,
                    (old.version if old else 0) + 1,
                    lease,
                )
            else:
                key = base64.b64decode(op["request_delete_range"]["key"]).decode()
                self.keys.pop(key, None)
        return True, self.revision


@dataclass
class SimNode:
    """One node's part in one partition: the plan, and a shell that carries out its actions
    as ``Replicator._carry_out`` does, against the fake etcd."""

    node_id: int
    etcd: FakeEtcd
    plan: Plan = field(init=False)
    lease: int = 0
    alive: bool = False
    role: str = "none"
    epoch: int = 0
    leader: int = -1
    isr: tuple[tuple[int, str], ...] = ()
    isr_revision: int = 0
    caught_up: bool = False
    campaigns: int = 0
    said_offline: int = 0

    def __post_init__(self) -> None:
        self.plan = Plan(self.node_id)

    @property
    def me(self) -> tuple[int, str]:
        return (self.node_id, f"s{self.node_id}")

    def start(self, now: float) -> None:
        self.alive = True
        self.plan = Plan(self.node_id)
        self.role, self.epoch, self.leader = "none", 0, -1
        self.lease = self.etcd.grant(now, 3.0)
        self.etcd.put(
            KEYS.node(self.node_id), NodeRecord(self.node_id, self.me[1], "h").encode(), self.lease
        )

    def kill(self) -> None:
        self.alive = False  # its lease lapses on its own

    def read(self, now: float) -> list[object]:
        """One read of etcd and the plan's answer (not carried out yet)."""
        if not self.alive:
            return []
        self.etcd.leases[self.lease] = now + 3.0  # keepalive
        state = ClusterState.parse(KEYS, self.etcd.range(KEYS.prefix + "/"))
        rec = state.parts[PART]
        if self.plan.replicas(rec) is None:
            return []
        assert rec.isr is not None
        self.isr, self.isr_revision = rec.isr.value.members, rec.isr.mod_revision
        f = Facts(PART, self.me, self.role, self.epoch, self.isr, self.caught_up)
        return list(self.plan.decide(f, rec.leader, now, state.live))

    def tick(self, now: float) -> None:
        for action in self.read(now):
            if not self.carry_out(action):
                break

    def carry_out(self, action: object) -> bool:
        leader_key, isr_key = KEYS.part("t", 1, "leader"), KEYS.part("t", 1, "isr")
        value = Leadership(self.node_id, "h").encode()
        match action:
            case StepDown() | Leaderless():
                self.role, self.leader = "none", -1
            case Campaign():
                self.campaigns += 1
                ok, rev = self.etcd.txn(
                    [
                        Compare(leader_key, "CREATE", "EQUAL", 0),
                        Compare(isr_key, "MOD", "EQUAL", self.isr_revision),
                    ],
                    [put_op(leader_key, value, self.lease)],
                )
                if ok:
                    self.role, self.epoch, self.leader = "leader", rev, self.node_id
            case Offline():
                self.said_offline += 1
            case Resign(stale):
                self.etcd.txn(
                    [Compare(stale.key, "MOD", "EQUAL", stale.mod_revision)], [delete_op(stale.key)]
                )
            case Follow(node, _, epoch):
                self.role, self.leader, self.epoch = "follower", node, epoch
            case TakeBack(held):
                ok, rev = self.etcd.txn(
                    [
                        Compare(held.key, "MOD", "EQUAL", held.mod_revision),
                        Compare(isr_key, "MOD", "EQUAL", self.isr_revision),
                    ],
                    [put_op(leader_key, value, self.lease)],
                )
                if not ok:
                    self.role = "none"
                    return False
                self.role, self.epoch, self.leader = "leader", rev, self.node_id
        return True


class Sim:
    def __init__(self, isr: tuple[tuple[int, str], ...] = (M1, M2, M3)) -> None:
        self.now = 0.0
        self.etcd = FakeEtcd()
        self.nodes = {n: SimNode(n, self.etcd) for n in (1, 2, 3)}
        for node in self.nodes.values():
            node.start(self.now)
        self.etcd.put(KEYS.part("t", 1, "assignment"), Assignment((1, 2, 3)).encode())
        self.etcd.put(KEYS.part("t", 1, "isr"), InSync(isr).encode())

    def run(self, seconds: float, tick: float = 0.25) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = round(self.now + tick, 6)
            self.etcd.expire(self.now)
            for node in self.nodes.values():
                node.tick(self.now)
            self.check()

    def check(self) -> None:
        """At most one node acts as leader at the epoch etcd names."""
        kv = self.etcd.keys.get(KEYS.part("t", 1, "leader"))
        current = [
            n
            for n in self.nodes.values()
            if n.alive and n.role == "leader" and kv and n.epoch == kv.mod_revision
        ]
        assert len(current) <= 1

    def leader(self) -> tuple[int, int] | None:
        kv = self.etcd.keys.get(KEYS.part("t", 1, "leader"))
        return None if kv is None else (Leadership.decode(kv.value).node, kv.mod_revision)


def test_the_origin_is_elected_first_and_everyone_follows_it() -> None:
    sim = Sim()
    sim.run(0.25)
    assert sim.leader() is not None and sim.leader()[0] == 1  # type: ignore[index]
    sim.run(0.5)
    epoch = sim.leader()[1]  # type: ignore[index]
    assert [(n.role, n.leader, n.epoch) for n in sim.nodes.values()] == [
        ("leader", 1, epoch),
        ("follower", 1, epoch),
        ("follower", 1, epoch),
    ]
    assert sum(n.campaigns for n in sim.nodes.values()) == 1


def test_kill_9_of_the_leader_fails_over_to_the_first_in_sync_member_after_the_lease() -> None:
    sim = Sim()
    sim.run(1.0)
    first = sim.leader()
    sim.nodes[1].kill()
    sim.run(2.75)
    assert sim.leader() == first  # the lease (3 s) has not lapsed: nobody takes over early
    sim.run(0.25)
    assert sim.leader() is None
    sim.run(2 * RANK_DELAY + 0.25)  # node 2's rank is 2 (in-sync order after the origin)
    new = sim.leader()
    assert new is not None and new[0] == 2 and new[1] > first[1]  # type: ignore[index]
    sim.run(1.0)
    assert (sim.nodes[3].role, sim.nodes[3].leader) == ("follower", 2)
    assert sim.nodes[3].campaigns == 0  # its turn (rank 3) never came


def test_the_origin_comes_back_follows_catches_up_and_takes_its_partition_back() -> None:
    sim = Sim()
    sim.run(1.0)
    sim.nodes[1].kill()
    sim.run(5.0)
    takeover = sim.leader()
    assert takeover is not None and takeover[0] == 2
    sim.nodes[1].start(sim.now)
    sim.run(1.0)
    assert (sim.nodes[1].role, sim.nodes[1].leader) == ("follower", 2)  # not caught up yet
    sim.nodes[1].caught_up = True
    sim.run(0.25)
    back = sim.leader()
    assert back is not None and back[0] == 1 and back[1] > takeover[1]
    sim.run(0.5)
    assert [(n.role, n.leader) for n in sim.nodes.values()] == [
        ("leader", 1),
        ("follower", 1),
        ("follower", 1),
    ]


def test_a_take_back_that_loses_a_race_follows_whoever_leads_next_tick() -> None:
    """Found by the soaks: a take-back whose txn failed left the origin with no role and no
    fetch; the next tick must follow again and start the fetch."""
    sim = Sim()
    sim.run(1.0)
    sim.nodes[1].kill()
    sim.run(5.0)
    sim.nodes[1].start(sim.now)
    sim.run(0.5)
    held = sim.leader()
    assert held is not None
    sim.etcd.put(KEYS.part("t", 1, "isr"), InSync((M1, M2, M3)).encode())  # the set moved
    node1 = sim.nodes[1]
    node1.caught_up = True
    node1.isr_revision = 0  # what node 1 read is stale: its txn fails
    assert (
        node1.carry_out(TakeBack(Stored(KEYS.part("t", 1, "leader"), Leadership(2, "h"), held[1])))
        is False
    )
    assert node1.role == "none"
    node1.caught_up = False
    node1.tick(sim.now + 0.25)
    assert (node1.role, node1.leader, node1.epoch) == ("follower", 2, held[1])


def test_with_the_whole_in_sync_set_dead_the_partition_waits_offline() -> None:
    sim = Sim(isr=(M1,))
    sim.run(1.0)
    sim.nodes[1].kill()
    sim.run(10.0)
    assert sim.leader() is None
    assert sim.nodes[2].campaigns == sim.nodes[3].campaigns == 0
    assert sim.nodes[2].said_offline == sim.nodes[3].said_offline == 1
    sim.nodes[1].start(sim.now)
    sim.run(0.25)
    assert sim.leader() is not None and sim.leader()[0] == 1  # type: ignore[index]


def test_a_restarted_leader_releases_its_old_leadership_and_is_elected_again() -> None:
    """A node back before its old lease lapsed (a pause, or a restart whose revoke did not
    reach etcd) finds the key naming it at an epoch it does not hold: it resigns it, then
    campaigns as the origin."""
    sim = Sim()
    sim.run(1.0)
    old = sim.leader()
    node1 = sim.nodes[1]
    node1.role, node1.epoch = "none", 0  # a new life: it knows no epoch
    node1.tick(sim.now)
    assert sim.leader() is None
    sim.run(0.25)
    new = sim.leader()
    assert new is not None and new[0] == 1 and new[1] > old[1]  # type: ignore[index]


def test_a_paused_member_and_a_prompt_one_campaign_together_one_wins() -> None:
    sim = Sim(isr=(M2, M3))
    sim.nodes[1].kill()
    for node in sim.nodes.values():
        node.plan.leaderless_since[PART] = -10.0  # both ranks long passed (a pause)
    sim.now = 0.0
    sim.etcd.expire(5.0)
    both = {n: sim.nodes[n].read(5.0) for n in (2, 3)}  # the same read of etcd
    for n, actions in both.items():
        for action in actions:
            sim.nodes[n].carry_out(action)
    assert sim.nodes[2].campaigns + sim.nodes[3].campaigns == 2
    assert [sim.nodes[n].role for n in (2, 3)].count("leader") == 1
    sim.run(0.5)
    assert {sim.nodes[n].leader for n in (2, 3)} == {sim.leader()[0]}  # type: ignore[index]


def test_json_of_records_is_plain_json() -> None:
    """Operators read these keys with etcdctl: plain JSON objects."""
    for rec in (Assignment((1, 2)), InSync((M1,)), Leadership(1, "h:1"), Tombstone(1, 2, 3)):
        assert isinstance(json.loads(rec.encode()), dict)


def test_copies_are_placed_only_on_nodes_whose_beat_was_seen_lately() -> None:
    """Issue 56: a node killed counts as registered until its lease lapses (3 s); a topic
    created meanwhile had its copies placed on it, and its publishes failed (min in-sync not
    reached) until they were re-placed. A node's registration is re-written every beat (its
    key's revision changes); one whose revision stood still for ``fresh_within`` is not used
    for a new copy, by placement or re-placement."""
    plan = Plan(1, replace_after=10.0)
    state = _nodes(1, 2, 3, 4)
    state.settings = {"t": ReplicationSettings(3, 2)}
    state.beats = {1: 10, 2: 11, 3: 12, 4: 13}
    plan.note_beats(state, now=0.0)
    state.beats = {1: 20, 2: 21, 3: 12, 4: 23}  # node 3 stopped beating at 0.0
    plan.note_beats(state, now=1.0)
    assert plan.placeable(state, now=1.0) == [1, 2, 3, 4]  # not yet: within about a second
    plan.note_beats(state, now=1.6)
    assert plan.placeable(state, now=1.6) == [1, 2, 4]
    (place,) = plan.to_place(state, lambda t: True, now=1.6)
    assert sorted(place.assignment.replicas) == [1, 2, 4]
    # A short placement grows only onto a node that beats.
    rec = _assigned(1, 2)
    grown = plan.to_replace(PART, rec, ReplicationSettings(3, 2), state, now=1.6)
    assert grown is not None and grown.assignment.replicas == (1, 2, 4)
    state.beats = {1: 30, 2: 31, 3: 32, 4: 33}  # node 3 is back: it beats again
    plan.note_beats(state, now=2.0)
    assert plan.placeable(state, now=2.0) == [1, 2, 3, 4]
    # This node always counts; a node first seen counts until it has had time to beat.
    assert Plan(9).placeable(state, now=100.0) == [1, 2, 3, 4]
