"""The rules of a replicated partition without I/O: the high watermark, the in-sync set, the
epoch history (truncation), the settings format, and the checker the fault tests rely on."""

from __future__ import annotations

import logging
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from pynsqd.cluster.partition import Partition, Role
from pynsqd.cluster.settings import ReplicationSettings, SettingsError
from pynsqd.core.message import Message
from pynsqd.storage.epochs import EpochHistory
from pynsqd.storage.topiclog import TopicLog

from ...integration.replication_harness import History, check

if TYPE_CHECKING:
    from pynsqd.cluster.replicator import Replicator

ME = (1, "a")
F2 = (2, "b")
F3 = (3, "c")


def make(tmp_path: Path, **settings: object) -> Partition:
    tlog = TopicLog(
        str(tmp_path / "t.log"), segment_bytes=1 << 20, sync_every=1, logger=logging.getLogger()
    )
    s = ReplicationSettings(**{"replicas": 3, "min_insync": 2, **settings})  # type: ignore[arg-type]
    p = Partition("t", 1, ME, tlog, EpochHistory(tlog.directory), s)
    p.isr = [ME, F2, F3]
    p.replicas = [ME[0], F2[0], F3[0]]
    p.become_leader(7, now=0.0)
    return p


def append(p: Partition, n: int) -> None:
    p.log.append([Message(b"%016d" % i, b"x", 1) for i in range(n)])
    p.log.sync()


def test_the_hw_is_the_lowest_acknowledgement_of_the_in_sync_set(tmp_path: Path) -> None:
    p = make(tmp_path)
    append(p, 10)
    p.advance()
    assert p.hw == 0  # no follower has it yet
    p.fetched(F2, 10, now=1.0)
    p.advance()
    assert p.hw == 0  # F3 is in the set and has nothing: every member must hold it
    p.fetched(F3, 6, now=1.0)
    p.advance()
    assert p.hw == 6
    assert p.log.visible == 6


def test_no_commit_below_min_insync_or_without_the_lease(tmp_path: Path) -> None:
    p = make(tmp_path)
    append(p, 5)
    p.isr = [ME]
    p.advance()
    assert p.hw == 0
    p.isr = [ME, F2]
    p.fetched(F2, 5, now=1.0)
    p.lease_ok = False
    p.advance()
    assert p.hw == 0
    p.lease_ok = True
    p.advance()
    assert p.hw == 5


def test_a_waiting_publish_is_answered_when_the_hw_passes_it(tmp_path: Path) -> None:
    p = make(tmp_path)
    append(p, 3)
    answers: list[str | None] = []
    from pynsqd.cluster.partition import Waiter

    p.waiters.append(Waiter(3, answers.append))
    p.fetched(F2, 2, now=1.0)
    p.fetched(F3, 3, now=1.0)
    p.advance()
    assert answers == []
    p.fetched(F2, 3, now=1.0)
    p.advance()
    assert answers == [None]
    p.waiters.append(Waiter(9, answers.append))
    p.step_down("superseded")
    assert answers == [None, "superseded"]
    assert p.role is Role.NONE


def test_the_in_sync_set_drops_laggards_and_dead_nodes_and_takes_back_the_caught_up(
    tmp_path: Path,
) -> None:
    p = make(tmp_path)
    append(p, 4)
    p.fetched(F2, 4, now=1.0)
    assert p.isr_change(now=2.0, lag_max=5.0, live=lambda m: True) is None
    # F3 never caught up within 5 s; F2's node is gone from etcd.
    new = p.isr_change(now=6.0, lag_max=5.0, live=lambda m: m != F2)
    assert new == [ME]
    p.isr = new
    p.fetched(F3, 4, now=7.0)
    assert p.isr_change(now=7.0, lag_max=5.0, live=lambda m: True) == [ME, F3]
    # Re-placed away from F3 (the assignment no longer names it): it leaves, and a caught-up
    # fetch from a node the assignment does not name never joins.
    p.isr = [ME, F3]
    p.replicas = [ME[0], F2[0], 4]
    p.fetched((5, "e"), 4, now=8.0)
    assert p.isr_change(now=8.0, lag_max=5.0, live=lambda m: True) == [ME]


def test_an_in_sync_follower_asking_below_the_hw_is_not_counted_until_it_caught_up(
    tmp_path: Path,
) -> None:
    """It acknowledged the HW, so asking below it means its log lost records (damaged while
    its node was down): it leaves the in-sync set at once, and the others commit without it."""
    p = make(tmp_path)
    append(p, 10)
    p.fetched(F2, 10, now=1.0)
    p.fetched(F3, 10, now=1.0)
    p.advance()
    assert p.hw == 10
    p.fetched(F2, 4, now=2.0)
    assert p.isr_change(now=2.0, lag_max=5.0, live=lambda m: True) == [ME, F3]
    p.isr = [ME, F3]
    append(p, 2)
    p.fetched(F3, 12, now=3.0)
    p.advance()
    assert p.hw == 12
    p.fetched(F2, 12, now=3.0)  # it fetched everything again: back in
    assert p.isr_change(now=3.0, lag_max=5.0, live=lambda m: True) == [ME, F3, F2]


def test_a_follower_that_stops_asking_leaves_the_in_sync_set_after_the_stall_limit(
    tmp_path: Path,
) -> None:
    """Answered and silent since (killed, paused, cut off): it leaves once ``stall_max`` has
    passed, long before ``lag_max`` (the HW is the smallest acknowledgement in the set: while
    it stays, no publish commits). Asking again clears it; a closed stream counts at once."""
    p = make(tmp_path)
    append(p, 4)
    for f in (F2, F3):
        p.fetched(f, 4, now=1.0)
        p.answered(f, now=1.0)
    assert p.isr_change(now=1.9, lag_max=5.0, live=lambda m: True, stall_max=1.0) is None
    p.fetched(F3, 4, now=1.9)  # F3 asks again (a long-poll: no answer yet); F2 is silent
    assert p.isr_change(now=2.1, lag_max=5.0, live=lambda m: True, stall_max=1.0) == [ME, F3]
    p.isr = [ME, F3]
    append(p, 2)
    p.advance()
    assert p.hw == 4  # F3 has not acknowledged 6 yet
    p.answered(F3, now=2.2)
    p.fetched(F3, 6, now=2.3)
    p.advance()
    assert p.hw == 6  # committed without the silent F2
    # A caught-up fetch brings F2 back; its stream closing takes it out at the next tick.
    p.fetched(F2, 6, now=3.0)
    assert p.isr_change(now=3.0, lag_max=5.0, live=lambda m: True, stall_max=1.0) == [ME, F3, F2]
    p.isr = [ME, F3, F2]
    p.stream_closed(F2)
    assert p.isr_change(now=3.1, lag_max=5.0, live=lambda m: True, stall_max=1.0) == [ME, F3]
    # A silent follower does not join again, caught up or not.
    p.isr = [ME, F3]
    assert p.isr_change(now=3.2, lag_max=5.0, live=lambda m: True, stall_max=1.0) is None


def test_the_epoch_history_says_where_a_follower_must_cut(tmp_path: Path) -> None:
    """KIP-101's case: epoch 1 wrote 0..99; a takeover at 2 ended at 90; the origin came back
    at 3 from 90. A replica still holding epoch 1's 90..99 must cut at 90."""
    h = EpochHistory(str(tmp_path))
    h.begin(1, 0)
    h.begin(2, 90)
    h.begin(3, 90)
    assert h.end_for(1, latest=150) == 90
    assert h.end_for(3, latest=150) == 150
    assert h.end_for(0, latest=150) == 0
    again = EpochHistory(str(tmp_path))  # kept across restarts
    assert again.entries == [(1, 0), (2, 90), (3, 90)]
    again.copy_from([(1, 0), (2, 90), (3, 90)], end=50)
    assert again.entries == [(1, 0)]


def test_a_damaged_epochs_file_is_set_aside_and_the_copy_counts_as_lost_until_refetched(
    tmp_path: Path,
) -> None:
    """Issue 56: a flipped byte in ``epochs`` stopped the node at every start, with no way
    forward named. Every bit of it flipped is caught (its CRC, or it no longer parses): the file
    goes aside, the history starts empty, and the copy may not lead (``Partition.lost``) until
    it has copied a leader's history (after the truncation that an empty history brings)."""
    h = EpochHistory(str(tmp_path))
    h.begin(5, 0)
    h.begin(9, 40)
    path = tmp_path / "epochs"
    good = path.read_bytes()
    for index in range(len(good)):
        for bit in range(8):
            raw = bytearray(good)
            raw[index] ^= 1 << bit
            path.write_bytes(bytes(raw))
            again = EpochHistory(str(tmp_path))
            assert again.damaged and again.entries == [] and not path.exists(), (index, bit)
            assert (tmp_path / "epochs.damaged").read_bytes() == bytes(raw)
    path.write_bytes(b"[[5, 0], [9, 40]]")  # written before the CRC: read as it is
    assert EpochHistory(str(tmp_path)).entries == [(5, 0), (9, 40)]
    path.write_bytes(b"{")
    tlog = TopicLog(
        str(tmp_path / "t"), segment_bytes=1 << 20, sync_every=1, logger=logging.getLogger()
    )
    tlog.append([Message(b"%016d" % i, b"x", 1) for i in range(50)])
    tlog.sync()
    p = Partition("t", 2, ME, tlog, EpochHistory(str(tmp_path)), ReplicationSettings(3, 2))
    assert p.history.damaged and p.lost() == "0-49"
    assert p.history.last_epoch == 0  # following, it asks from epoch 0: cut to the leader's
    p.history.copy_from([(5, 0), (9, 40)], end=50)
    assert p.lost() == "" and EpochHistory(str(tmp_path)).entries == [(5, 0), (9, 40)]


def test_truncate_is_a_prefix_and_appends_go_on_from_it(tmp_path: Path) -> None:
    tlog = TopicLog(
        str(tmp_path / "l"), segment_bytes=200, sync_every=1, logger=logging.getLogger()
    )
    for i in range(30):
        tlog.append([Message(b"%016d" % i, b"body%d" % i, 1)])
    assert tlog.segment_count > 3
    tlog.truncate(12)
    assert tlog.latest == 12
    tlog.append([Message(b"%016d" % 99, b"new", 1)])
    tlog.close()
    reopened = TopicLog(
        str(tmp_path / "l"), segment_bytes=200, sync_every=1, logger=logging.getLogger()
    )
    got = []
    offset = 0
    while offset < reopened.latest:
        batch, offset = reopened.read_messages(offset, 100)
        got.extend(batch)
    assert [m.body for m in got] == [b"body%d" % i for i in range(12)] + [b"new"]
    offsets: list[int] = []
    reopened.read_messages(0, 100, out=offsets)
    assert offsets[0] == 0


def test_append_raw_refuses_a_damaged_or_misplaced_batch(tmp_path: Path) -> None:
    src = TopicLog(
        str(tmp_path / "a"), segment_bytes=1 << 20, sync_every=1, logger=logging.getLogger()
    )
    dst = TopicLog(
        str(tmp_path / "b"), segment_bytes=1 << 20, sync_every=1, logger=logging.getLogger()
    )
    src.append([Message(b"%016d" % i, b"m%d" % i, 1) for i in range(5)])
    rng = src.read_range(0, 10, 1 << 20)
    assert rng is not None
    data = Path(rng.path).read_bytes()[rng.start : rng.end]
    with pytest.raises(ValueError):
        dst.append_raw(data[:-1])  # torn
    damaged = bytearray(data)
    damaged[-1] ^= 1
    with pytest.raises(ValueError):
        dst.append_raw(bytes(damaged))
    assert dst.latest == 0
    assert dst.append_raw(data) == 5
    with pytest.raises(ValueError):
        dst.append_raw(data)  # offsets 0.. again where 5 is next
    assert Path(dst.segments[-1].path).read_bytes() == data


def test_settings_format_and_checks() -> None:
    s = ReplicationSettings.parse({"replicas": "3"}.get, ReplicationSettings())
    assert (s.replicas, s.min_insync, s.acks, s.durability) == (3, 2, "all", "fsync")
    assert ReplicationSettings.decode(s.encode()) == s
    with pytest.raises(SettingsError) as err:
        ReplicationSettings.parse({"replicas": "2", "min_insync": "3"}.get, ReplicationSettings())
    assert err.value.code == "INVALID_ARG_MIN_INSYNC"
    with pytest.raises(SettingsError):
        ReplicationSettings.parse({"durability": "maybe"}.get, ReplicationSettings())


def test_the_history_is_read_while_producers_write_it() -> None:
    """The producers are threads. A fault test that walked ``acked_by`` while they wrote it
    failed in CI with "dictionary changed size during iteration"; every writer and every reader
    that iterates now holds the history's one lock."""
    h = History()
    h.sent([b"a", b"b"])
    h.phase = 2
    h.sent([b"c"])
    h.acknowledged([b"a", b"c"], node_id=3)
    h.acknowledged([b"b"], node_id=1)
    assert h.acked_in(3, 2) == [b"c"]  # sent and answered in phase 2 by node 3
    assert h.acked_in(1, 2) == []  # b was sent in phase 0
    assert h.ok == {b"a", b"b", b"c"} and h.invoked == {b"a", b"b", b"c"}
    h.not_acknowledged([b"d"])
    assert h.failed == {b"d"}

    # A bounded amount of work on each side (an unbounded writer made each read slower than the
    # last: the first version of this test ran past its timeout beside the whole suite).
    def write() -> None:
        for i in range(0, 20_000, 10):
            batch = [f"w{i + j}".encode() for j in range(10)]
            h.sent(batch)
            h.acknowledged(batch, node_id=3)

    writer = threading.Thread(target=write)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # hand the GIL over as often as it can be
    writer.start()
    try:
        for _ in range(300):
            assert b"c" in h.acked_in(3, 2)
            assert b"c" in h.acknowledged_so_far()
            if not writer.is_alive():
                break
    finally:
        writer.join()
        sys.setswitchinterval(switch)
    assert len(h.acked_in(3, 2)) == 20_001


def test_the_checker_finds_lost_unexpected_and_inconsistent() -> None:
    h = History(ok={b"a", b"b"}, failed={b"c"}, invoked={b"a", b"b", b"c"})
    reads = {
        (1, "n1"): [(0, b"i0", b"a"), (1, b"i9", b"z")],
        (1, "n2"): [(0, b"i0", b"a"), (1, b"i1", b"c")],
    }
    v = check(h, reads)
    assert v.lost == [b"b"]
    assert v.unexpected == [b"z"]
    assert v.inconsistent == [(1, 1)]
    assert v.recovered == 1


def test_a_publish_waiting_when_another_node_takes_over_fails(tmp_path: Path) -> None:
    """Found by the pause test: the origin, leaderless after its lease lapsed, took a publish at
    offset N; a takeover leader made it follow and truncate N away; once it led again new
    records filled N and the old waiter was answered OK for a record no node had."""
    from pynsqd.cluster.partition import Waiter

    p = make(tmp_path)
    p.step_down("lease lapsed")
    assert p.writable  # a leaderless origin takes publishes (they commit if it wins again)
    append(p, 2)
    answers: list[str | None] = []
    p.waiters.append(Waiter(2, answers.append))
    p.follow(2, "127.0.0.1:1", epoch=9)
    assert answers == ["node 2 leads the partition now"]
    assert not p.writable


def test_restart_at_empties_the_log_and_goes_on_from_the_offset(tmp_path: Path) -> None:
    log = logging.getLogger()
    tlog = TopicLog(str(tmp_path / "l"), segment_bytes=200, sync_every=1, logger=log)
    for i in range(20):
        tlog.append([Message(b"%016d" % i, b"old%d" % i, 1)])
    tlog.restart_at(500)
    assert (tlog.earliest, tlog.latest) == (500, 500)
    src = TopicLog(str(tmp_path / "src"), segment_bytes=1 << 20, sync_every=1, logger=log)
    src.restart_at(500)
    src.append([Message(b"%016d" % 1, b"new", 1)])
    rng = src.read_range(500, 10, 1 << 20)
    assert rng is not None
    tlog.append_raw(Path(rng.path).read_bytes()[rng.start : rng.end])
    tlog.close()
    again = TopicLog(str(tmp_path / "l"), segment_bytes=200, sync_every=1, logger=log)
    assert (again.earliest, again.latest) == (500, 501)
    assert [m.body for m in again.read_messages(500, 10)[0]] == [b"new"]


def test_no_retained_publish_is_taken_before_the_cluster_state_is_read(tmp_path: Path) -> None:
    """Found by the kill -9 test: a restarted origin listened before it had read etcd, took a
    publish to its replicated topic as unreplicated, answered OK, and then truncated it away
    when it learnt that another node led its partition. nsqd now takes no connection before it
    has joined (test_replication's restart race); the gate stays as a guard."""
    from pynsqd.cluster.gate import PublishRefused
    from pynsqd.cluster.replicator import Replicator
    from pynsqd.options import Options

    class Host:
        opts = Options(etcd_endpoints=["127.0.0.1:1"], data_path=str(tmp_path))
        topics: dict[str, object] = {}
        data_path = str(tmp_path)
        http_address = "127.0.0.1:4151"
        tcp_address = "127.0.0.1:4150"
        worker_index = 0

        class retention:
            @staticmethod
            def get(name: str) -> object | None:
                return object() if name == "retained" else None

            @staticmethod
            def open_replica(topic: str, origin: int) -> TopicLog:
                raise AssertionError("not used")

    replicator = Replicator(Host())  # type: ignore[arg-type]
    with pytest.raises(PublishRefused, match="not joined") as refused:
        replicator.publishing.gate("retained")
    assert refused.value.code == "NOT_JOINED"
    assert replicator.publishing.gate("plain") is False  # never replicated: no retention
    replicator.view.ready = True
    assert replicator.publishing.gate("retained") is False  # the state says: not replicated


def node_one(tmp_path: Path, logs: dict[str, TopicLog]) -> Replicator:
    """Node 1's replicator, joined, over a host that retains ``logs`` (and no replica)."""
    from pynsqd.cluster.replicator import Replicator
    from pynsqd.options import Options

    class Host:
        opts = Options(etcd_endpoints=["127.0.0.1:1"], data_path=str(tmp_path), node_id=1)
        topics: dict[str, object] = {}
        data_path = str(tmp_path)
        http_address = "127.0.0.1:4151"
        tcp_address = "127.0.0.1:4150"
        worker_index = 0

        class retention:
            @staticmethod
            def get(name: str) -> TopicLog | None:
                return logs.get(name)

            @staticmethod
            def open_replica(topic: str, origin: int) -> TopicLog:
                raise AssertionError("not used")

    replicator = Replicator(Host())  # type: ignore[arg-type]
    replicator.view.ready = True
    return replicator


def test_a_publish_before_the_partition_is_placed_is_not_visible_or_is_refused(
    tmp_path: Path,
) -> None:
    """A replicated topic's first publishes come before its partition is placed (they wait
    for it): they were handed to channels at once, uncommitted. And a node back with an empty
    disk re-creates the topic while its partition lives on elsewhere: its publishes went into
    a log about to be truncated to the leader's."""
    from pynsqd.cluster.gate import PublishRefused
    from pynsqd.cluster.records import Assignment, PartRecords, Stored
    from pynsqd.cluster.settings import ReplicationSettings

    tlog = TopicLog(
        str(tmp_path / "l"), segment_bytes=1 << 20, sync_every=1, logger=logging.getLogger()
    )
    tlog.append([Message(b"%016d" % 1, b"before replication", 1)])
    replicator = node_one(tmp_path, {"t": tlog})
    replicator.view.state.settings["t"] = ReplicationSettings(3, 2, "all", "fsync")
    assert tlog.visible == 1
    assert replicator.publishing.gate("t") is True  # waits for its placement, then for its commit
    tlog.append([Message(b"%016d" % 2, b"first replicated", 1)])
    assert tlog.visible == 1  # not handed to channels before it commits
    replicator.view.state.parts[("t", 1)] = PartRecords(Stored("k", Assignment((1, 2, 3)), 1))
    with pytest.raises(PublishRefused, match="elsewhere"):
        replicator.publishing.gate("t")


def test_a_new_topics_placement_is_read_with_its_copy_so_a_publish_waits_not_fails(
    tmp_path: Path,
) -> None:
    """Found by CI (test_failover): the tick read a new topic's placement, then awaited a
    campaign for another partition before it made this node's copy; a publish in between
    found the partition in the state but no copy here and was refused as held elsewhere. The
    state and the copies it places here are now taken in one step: the publish appends to the
    copy and waits for its commit."""
    from pynsqd.cluster.records import Assignment, ClusterState, PartRecords, Stored
    from pynsqd.cluster.settings import ReplicationSettings

    tlog = TopicLog(
        str(tmp_path / "l"), segment_bytes=1 << 20, sync_every=1, logger=logging.getLogger()
    )
    replicator = node_one(tmp_path, {"t": tlog})
    state = ClusterState()
    state.settings["t"] = ReplicationSettings(2, 2, "all", "fsync")
    state.parts[("t", 1)] = PartRecords(Stored("k", Assignment((1, 2)), 1))
    held = replicator._take(state)
    assert set(held) == {("t", 1)} and held[("t", 1)] is replicator.partitions[("t", 1)]
    # Not "held elsewhere": appended, and answered once the partition commits it.
    assert replicator.publishing.gate("t") is True


def test_etcd_history_is_compacted_to_what_the_previous_round_saw() -> None:
    """Every COMPACT_EVERY seconds the plan compacts to the revision it saw a round before
    (history a round deep is kept; the first round only looks)."""
    from pynsqd.cluster.replicator import Compaction

    clock = [0.0]
    c = Compaction(lambda: clock[0], every=300.0)
    assert c.due(100) is None
    clock[0] = 299.0
    assert c.due(150) is None
    clock[0] = 300.0
    assert c.due(200) is None  # nothing seen yet: nothing to compact
    clock[0] = 450.0
    assert c.due(300) is None
    clock[0] = 600.0
    assert c.due(400) == 200
    clock[0] = 900.0
    assert c.due(500) == 400


def test_an_in_sync_change_of_storage_alone_is_logged_as_one() -> None:
    """Found in a node's log (issue 43): "in sync [2, 3, 1] -> [2, 3, 1]", a change the log
    did not show: node 1 came back with a new data directory (a new member)."""
    from pynsqd.cluster.leader import _members

    old, new = [(2, "b"), (1, "a")], [(2, "b"), (1, "z")]
    assert _members(old, new) == [2, "1 (storage a)"]
    assert _members(new, old) == [2, "1 (storage z)"]
    assert _members([(2, "b")], [(2, "b"), (3, "c")]) == [2]


def test_a_copy_is_settled_once_caught_up_with_a_live_leader_in_its_epoch(
    tmp_path: Path,
) -> None:
    """Idempotent publishing asks whether a copy of another node's partition holds what that
    partition held when its leader last changed (``core/topic.py``'s check across partitions)."""
    tlog = TopicLog(
        str(tmp_path / "c.log"), segment_bytes=1 << 20, sync_every=1, logger=logging.getLogger()
    )
    s = ReplicationSettings(replicas=3, min_insync=2)
    p = Partition("t", 2, ME, tlog, EpochHistory(tlog.directory), s)  # node 2's, a copy here
    assert not p.settled  # no leader known
    p.follow(2, "127.0.0.1:1", epoch=5)
    p.streaming = True
    assert not p.settled  # not yet caught up in epoch 5
    p.log.append([Message(b"%016d" % i, b"x", 1) for i in range(3)])
    p.leader_answered(latest=4, hw=3)
    assert not p.settled  # behind: the leader had 4
    p.log.append([Message(b"%016d" % 3, b"x", 1)])
    p.leader_answered(latest=6, hw=4)
    assert not p.settled  # behind again, never caught up yet
    p.leader_answered(latest=4, hw=4)
    assert p.settled  # caught up once in epoch 5
    p.leader_answered(latest=9, hw=4)
    assert p.settled  # briefly behind a live leader: still settled
    p.streaming = False  # the leader died: its stream closed
    assert not p.settled
    p.follow(3, "127.0.0.1:2", epoch=6)  # a takeover
    p.streaming = True
    assert not p.settled  # until caught up with the new leader
    p.leader_answered(latest=4, hw=4)
    assert p.settled


def test_replicas_of_a_placed_topic_cannot_change_the_rest_can() -> None:
    """``POST /topic/replication``'s rule (``settings.check_change``): copies are placed when a
    partition is made, so a placed replicated topic keeps its replica count; min_insync, acks
    and durability may change, and an unplaced topic may take any count."""
    from pynsqd.cluster.settings import check_change

    three = ReplicationSettings(replicas=3, min_insync=2)
    check_change("t", three, ReplicationSettings(replicas=3, min_insync=3), placed=True)
    check_change("t", three, ReplicationSettings(replicas=5), placed=False)
    check_change("t", ReplicationSettings(), ReplicationSettings(replicas=3), placed=True)
    with pytest.raises(SettingsError) as err:
        check_change("t", three, ReplicationSettings(replicas=1), placed=True)
    assert err.value.code == "REPLICAS_FIXED"
    assert "from 3 to 1" in str(err.value)
