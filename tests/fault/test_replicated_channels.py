"""Channels of a replicated topic across a failover (issue 28), with real NSQ consumers.

Three pynsqd nodes on a real etcd, registered with a real nsqlookupd; consumers are unmodified
pynsq and gnsq readers in processes of their own, given only the lookupd's address
(``nsq_consumer.py``: each body is written to a file before it is FIN'd). Producers publish
unique bodies to the live nodes (``replication_harness.Producer``). A node is killed -9; another
takes its partition over and, from the dead node's last channel checkpoint, delivers what its
channels had not finished; the node comes back, takes its partition back, and the cluster goes
on. The checker: every acknowledged body reaches the consumers (lost: none), no consumer is
restarted, and duplicates stay within the bound ``docs/replication.md`` gives.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pynsqd.client.connection import Connection
from pynsqd.client.options import ClientOptions
from pynsqd.core.offsets import decode_offset_id

from ..integration.lookupd_helpers import http
from ..integration.replication_harness import (
    TOPIC,
    Cluster,
    Etcd,
    History,
    Network,
    Node,
    checkpoint,
    led_elsewhere,
    power_loss,
    producing,
    replicate,
    wait_leader,
    wait_node_in_sync,
)
from ..processes import ServerProcess
from ..waiting import until, wait_for

CONSUMER = Path(__file__).parents[1] / "integration" / "nsq_consumer.py"
CHANNEL = "ch"
MAX_IN_FLIGHT = 20


@pytest.fixture
def lookupd(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "nsqlookupd",
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        "--broadcast-address=127.0.0.1",
        log=tmp_path / "nsqlookupd.log",
    )
    yield proc
    proc.stop()


@pytest.fixture
def cluster(tmp_path: Path, etcd: Etcd, lookupd: ServerProcess) -> Iterator[Cluster]:
    c = Cluster(
        tmp_path,
        etcd,
        3,
        f"--lookupd-tcp-address=127.0.0.1:{lookupd.port_of('TCP')}",
        "--broadcast-address=127.0.0.1",
    )
    yield c
    c.stop()


class Consumer:
    """A real NSQ client reading ``TOPIC``/``CHANNEL`` through nsqlookupd, in its own process."""

    def __init__(self, client: str, lookupd_http: str, out: Path) -> None:
        self.out = out
        self.client = client
        self.log = out.with_suffix(".log").open("wb")
        self.p = subprocess.Popen(
            [
                sys.executable,
                str(CONSUMER),
                f"--client={client}",
                f"--lookupd=http://{lookupd_http}",
                f"--topic={TOPIC}",
                f"--channel={CHANNEL}",
                f"--out={out}",
                f"--max-in-flight={MAX_IN_FLIGHT}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def received(self) -> list[bytes]:
        if not self.out.exists():
            return []
        return self.out.read_bytes().splitlines()

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=10)
        self.log.close()


@contextlib.contextmanager
def consuming(tmp_path: Path, lookupd: ServerProcess) -> Iterator[list[Consumer]]:
    """A pynsq and a gnsq consumer of ``TOPIC``/``CHANNEL``, given only ``lookupd``'s address."""
    address = lookupd.addresses["HTTP"]
    group = [
        Consumer("pynsq", address, tmp_path / "pynsq.txt"),
        Consumer("gnsq", address, tmp_path / "gnsq.txt"),
    ]
    try:
        yield group
    finally:
        for c in group:
            c.stop()


def received(group: list[Consumer]) -> Counter[bytes]:
    seen: Counter[bytes] = Counter()
    for c in group:
        seen.update(c.received())
    return seen


def prepare(cluster: Cluster) -> None:
    """The topic replicated, with the consumers' channel on every node, checkpointed."""
    replicate(cluster)
    for n in cluster.nodes:
        status, body = n.http("POST", f"/channel/create?topic={TOPIC}&channel={CHANNEL}")
        assert status == 200, body
    for n in cluster.nodes:
        for m in n.member_ids:  # each member checkpoints its own partition's channel
            wait_for(lambda n=n, m=m: CHANNEL in checkpoint(n, m, m), "a checkpoint of the channel")


#: ``scripts/replication-faults`` runs these with more cycles.
SCALE = float(os.environ.get("PYNSQD_FAULT_SCALE", "1"))


def cycles(
    cluster: Cluster,
    history: History,
    group: list[Consumer],
    count: int,
    fault: str,
    network: Network | None = None,
) -> int:
    """``count`` faults of a node, each: every body acknowledged before it reaches the
    consumers (through the takeover), then the node returns and takes its partition back.
    Returns what a takeover that replayed each victim's whole partition would repeat: the
    bodies acknowledged by the victim before each of its faults, summed; for a cut from etcd
    only, those of every partition the victim held windows of (an adopter cut off later goes
    on delivering what it adopted while that partition's leader adopts it again).
    ``kill``: kill -9 of a random node; ``pause``: SIGSTOP of a random node past its lease;
    ``restart``: a rolling restart (SIGTERM, each node in turn); ``cut-etcd`` and
    ``cut-everything``: each node in turn cut off (``network``) from etcd only, or from etcd,
    its peers, nsqlookupd, the consumers and the producers, then healed."""
    rng = random.Random(fault)
    in_turn = fault == "restart" or fault.startswith("cut")
    replay_all = 0
    for cycle in range(count):
        want = len(history.ok) + 100
        wait_for(lambda want=want: len(history.ok) > want, "acknowledged publishes")
        victim: Node = (
            cluster.nodes[cycle % len(cluster.nodes)] if in_turn else rng.choice(cluster.nodes)
        )
        acked = history.acknowledged_so_far()
        # The partitions whose windows the victim holds: its own, and (cut off from etcd only,
        # where it goes on delivering them) those it adopted at an earlier cut.
        held = {victim.node_id}
        if fault == "cut-etcd":
            held |= {
                n.node_id
                for n in cluster.nodes
                for m in n.member_ids
                if any(CHANNEL in checkpoint(n, h, m) for h in victim.member_ids)
            }
        replay_all += sum(1 for b in acked if history.acked_by.get(b, (0, 0))[0] in held)
        if fault == "pause":
            victim.pause()
        elif network is not None and fault.startswith("cut"):
            peers = [n.host for n in cluster.nodes if n is not victim]
            everything = [*peers, network.etcd, network.harness]
            network.cut(victim, [network.etcd] if fault == "cut-etcd" else everything)
        else:
            victim.kill(signal.SIGTERM if fault == "restart" else signal.SIGKILL)
        # The victim is not asked (a cut-off node would not answer).
        wait_for(
            lambda victim=victim: led_elsewhere(cluster, victim),
            f"a takeover of node {victim.node_id}'s partition",
            20,
        )
        if not until(lambda acked=acked: acked <= set(received(group)), 60):
            missing = sorted(acked - set(received(group)))
            pytest.fail(
                f"{fault} {cycle}: {len(missing)} acknowledged messages not delivered after node "
                f"{victim.node_id} went: {missing[:5]}, acked by "
                f"{[history.acked_by.get(b) for b in missing[:5]]}"
            )
        if fault == "pause":
            victim.resume()
        elif network is not None and fault.startswith("cut"):
            network.heal(victim)
        else:
            victim.start()
        wait_node_in_sync(cluster, TOPIC, victim)
        for c in group:
            assert c.p.poll() is None, f"the {c.client} consumer exited"
    return replay_all


def delivered_within_bound(
    history: History, group: list[Consumer], what: str, replay_all: int, *, both: bool = False
) -> None:
    """Every acknowledged body reaches the consumers, none that no one published, and the
    duplicates stay within the bound.

    Duplicates come from what a node finished since its last checkpoint and what was in flight
    (docs/replication.md): a few hundred per fault here, whatever the run's length. A takeover
    that replayed from anywhere but the checkpoint (the partition's whole log, say) would
    repeat every earlier message of the victim's partition at each fault: ``replay_all``,
    which grows with the square of the faults. The bound is 30% of what was acknowledged or
    half of ``replay_all``, whichever is larger: a run whose faults came quickly (few
    publishes between them) measured 31% against the first (1,363 duplicates over 6 pauses,
    as many as a run with three times the publishes), so the first alone measured how fast
    the cycles went, not the takeover.

    ``both``: a node cut off from etcd only, the documented weak case: it keeps delivering its
    backlog while the adopter delivers the same backlog, until the cut heals, so up to one more
    copy of what each victim held (``replay_all``) on top (37.5% measured once, 8.6% and 18.2%
    in other runs)."""
    acked = history.acknowledged_so_far()
    if not until(lambda: acked <= set(received(group)), 60):
        missing = sorted(acked - set(received(group)))
        pytest.fail(f"{len(missing)} of {len(acked)} acknowledged never delivered")
    seen = received(group)
    assert not set(seen) - history.invoked, "a body no one published"
    duplicates = sum(n - 1 for n in seen.values() if n > 1)
    print(
        f"{what}: acknowledged {len(acked)}, delivered {len(seen)} distinct, {duplicates} "
        f"duplicates ({duplicates / max(len(acked), 1):.1%})"
    )
    print(f"{what}: replaying each victim's whole partition would repeat {replay_all}")
    if both:
        assert duplicates <= len(acked) * 0.3 + replay_all
    else:
        assert duplicates <= max(len(acked) * 0.3, replay_all / 2)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize(
    ("fault", "count"),
    [
        # ("kill", 6) was marked xfail (issue 43) while acknowledged messages of a node
        # killed again right after it took its partition back went undelivered; fixed in
        # cluster/checkpoints.py (_adopt_after_take_back), reproduced by
        # test_a_node_killed_again_right_after_it_took_its_partition_back_loses_nothing.
        ("kill", 6),
        ("pause", 6),
        ("restart", 6),
    ],
)
def test_consumers_through_lookupd_lose_nothing_across_failovers(
    tmp_path: Path, cluster: Cluster, lookupd: ServerProcess, fault: str, count: int
) -> None:
    """6 kill -9 of a random node (with the node's return and take-back after each), 6 pauses
    past the lease, and a rolling restart of every node twice, under load from two producers,
    with a pynsq and a gnsq consumer that are never restarted: every acknowledged message is
    delivered, and duplicates stay within the bound."""
    prepare(cluster)
    history = History()
    faults = round(count * SCALE)
    with consuming(tmp_path, lookupd) as group:
        with producing(cluster, history):
            replay_all = cycles(cluster, history, group, faults, fault)
        delivered_within_bound(history, group, f"{fault} over {faults} faults", replay_all)


@pytest.mark.timeout(900)
def test_consumers_of_nodes_of_two_workers_lose_nothing_across_kills(
    tmp_path: Path, etcd: Etcd, lookupd: ServerProcess
) -> None:
    """The kill -9 loop above with every node at ``--workers 2`` (six members, each its own
    partition and checkpoints of its channels): a random node killed 3 times under load and
    back, with a pynsq and a gnsq consumer through nsqlookupd that are never restarted; every
    acknowledged message is delivered, and duplicates stay within the bound.
    (``PYNSQD_TEST_NODE_WORKERS=2`` runs every test of this file so.)"""
    cluster = Cluster(
        tmp_path,
        etcd,
        3,
        f"--lookupd-tcp-address=127.0.0.1:{lookupd.port_of('TCP')}",
        "--broadcast-address=127.0.0.1",
        "--workers=2",
    )
    try:
        prepare(cluster)
        history = History()
        faults = max(1, round(3 * SCALE))
        with consuming(tmp_path, lookupd) as group:
            with producing(cluster, history):
                replay_all = cycles(cluster, history, group, faults, "kill")
            delivered_within_bound(history, group, f"kill over {faults} faults", replay_all)
    finally:
        cluster.stop()


@pytest.mark.timeout(300)
def test_a_node_killed_and_restarted_redelivers_what_was_in_flight_and_deferred(
    tmp_path: Path, cluster: Cluster, lookupd: ServerProcess
) -> None:
    """nsqd loses a crashed channel's in-flight and deferred messages (they were only in its
    memory). A replicated channel is rebuilt from its checkpoint and the log: nothing lost,
    and the deferred message keeps its due time."""
    prepare(cluster)
    n1 = cluster.node(1)
    assert n1.proc is not None
    bodies = [f"m{i}".encode() for i in range(200)]
    assert n1.http("POST", f"/mpub?topic={TOPIC}", b"\n".join(bodies))[0] == 200
    assert n1.http("POST", f"/pub?topic={TOPIC}&defer=600000", b"deferred")[0] == 200
    # A consumer that takes 50 messages and never answers: in flight when node 1 dies.
    taken: list[bytes] = []
    conn = Connection(f"127.0.0.1:{n1.proc.port}", ClientOptions(timeout=10)).connect()
    conn.subscribe(TOPIC, CHANNEL, lambda _c, _ts, _att, ids, _b: taken.extend(ids), rdy=50)
    wait_for(lambda: len(taken) == 50, "50 messages in flight")
    n1.kill()
    conn.close()
    n1.start()
    with consuming(tmp_path, lookupd) as group:
        wait_for(lambda: set(bodies) <= set(received(group)), "every message, after the crash", 60)
        assert b"deferred" not in received(group)
    deferred = 0
    for n in cluster.nodes:
        doc = n.json("GET", f"/stats?format=json&topic={TOPIC}&channel={CHANNEL}")
        for t in doc["topics"]:
            deferred += sum(ch["deferred_count"] for ch in t["channels"])
    assert deferred == 1
    assert "rebuilt after a crash" in n1.log.read_text() or "took over node 1" in "".join(
        n.log.read_text() for n in cluster.nodes
    )


@pytest.mark.timeout(300)
def test_a_message_keeps_its_id_timestamp_attempts_and_due_time_across_a_takeover(
    cluster: Cluster,
) -> None:
    """The node that takes a partition over delivers the same message: the same ID (an offset
    ID names the partition and offset), the same timestamp (so --msg-ttl keeps counting from the
    publish), its attempts so far (so --max-attempts dead-letters it on the new node), a DPUB's
    due time, and a REQ's delay."""
    prepare(cluster)
    for n in cluster.nodes:
        status, body = n.http(
            "POST",
            f"/channel/config?topic={TOPIC}&channel={CHANNEL}&max_attempts=3&dead_letter=dead",
        )
        assert status == 200, body
    n1 = cluster.node(1)
    assert n1.proc is not None
    # One connection: its publishes go to one partition (--workers: its worker's member's).
    with Connection(f"127.0.0.1:{n1.proc.port}", ClientOptions(timeout=10)).connect() as producer:
        producer.pub(TOPIC, b"poison")
        producer.dpub(TOPIC, 600_000, b"later")
        producer.pub(TOPIC, b"held")
    before: list[tuple[bytes, int, int, bytes]] = []
    held: list[bytes] = []

    def on_n1(c: Connection, ts: list[int], att: list[int], ids: list[bytes], bodies: list[bytes]):
        for m in zip(ids, ts, att, bodies, strict=True):
            if m[3] == b"held":  # REQ'd for ten minutes: still deferred after the takeover
                held.append(m[0])
                c.req(m[0], 600_000)
                continue
            before.append(m)
            # Delivered twice here: REQ'd at once, then for 5 s (due on the new node, which
            # delivers it a third time once it is due). A third delivery here goes unanswered.
            if len(before) <= 2:
                c.req(m[0], 0 if len(before) == 1 else 5_000)

    conn = Connection(f"127.0.0.1:{n1.proc.port}", ClientOptions(timeout=10)).connect()
    conn.subscribe(TOPIC, CHANNEL, on_n1, rdy=10)
    wait_for(lambda: len(before) >= 2 and held, "two deliveries of the message on node 1")
    decoded = decode_offset_id(before[0][0])
    assert decoded is not None and decoded[0] in n1.member_ids, before
    part = decoded[0]  # node 1's partition (--workers: the member's the PUBs went to)
    wait_for(
        lambda: (
            checkpoint(n1, part, part).get(CHANNEL, {}).get("attempts_max") == 2
            and checkpoint(n1, part, part).get(CHANNEL, {}).get("deferred_kept") == 2
        ),
        "its attempts and the REQs' due times in node 1's checkpoint",
    )
    n1.kill()
    conn.close()
    leader = cluster.node(wait_leader(cluster, TOPIC, part)["node"])
    assert leader.proc is not None
    after: list[tuple[bytes, int, int, bytes]] = []

    def on_leader(c: Connection, ts: list[int], att: list[int], ids: list[bytes], bodies: list):
        for m in zip(ids, ts, att, bodies, strict=True):
            after.append(m)
            c.req(m[0], 0) if m[3] == b"poison" else c.fin(m[0])

    def channel() -> dict[str, Any]:
        doc = leader.json("GET", f"/stats?format=json&topic={TOPIC}&channel={CHANNEL}")
        found: dict[str, Any] = doc["topics"][0]["channels"][0]
        return found

    conn = Connection(f"127.0.0.1:{leader.proc.port}", ClientOptions(timeout=10)).connect()
    try:
        conn.subscribe(TOPIC, CHANNEL, on_leader, rdy=10)
        dead = lambda: leader.json("GET", "/stats?format=json&topic=dead")["topics"]  # noqa: E731
        wait_for(lambda: dead() and dead()[0]["message_count"] == 1, "the dead-lettered message")
        # The DPUB and the REQ'd message came over deferred (due in ten minutes), not due at
        # once.
        wait_for(
            lambda: channel()["deferred_count"] == 2,
            "the DPUB and the REQ deferred on the new node",
        )
    finally:
        conn.close()
    poison = [m for m in after if m[3] == b"poison"]
    assert len(poison) == 1, "max_attempts=3: the third delivery was the last"
    assert poison[0][:2] == before[0][:2], "the same ID and timestamp"
    assert poison[0][2] == 3, "attempts go on from the two on node 1"
    assert [m for m in after if m[3] == b"later"] == [], "a DPUB is not delivered before it is due"
    assert [m for m in after if m[3] == b"held"] == [], "nor a REQ'd message before its delay"
    # /stats shows the channel's window of the partition it took over: offset 0 (dead-lettered)
    # done, offsets 1 (the DPUB) and 2 (the REQ'd message) pending.
    windows = channel()["replicated"]["windows"]
    assert (windows[str(part)]["low"], windows[str(part)]["end"]) == (1, 3)


def test_peek_on_a_replicated_node_is_its_channel_before_and_after_a_takeover(
    cluster: Cluster,
) -> None:
    """``/channel/peek`` on a replicated node lists what its consumers are offered: node 1's
    queued messages (with their headers) and a deferred REQ; after node 1's kill -9 the node
    that took its partition over lists the same messages (same IDs, the REQ still deferred),
    and looking consumed nothing: its consumer then gets each queued message once."""
    prepare(cluster)
    n1 = cluster.node(1)
    assert n1.proc is not None
    # One connection: its publishes go to one partition (--workers: its worker's member's).
    opts = ClientOptions(timeout=10, headers=True)
    with Connection(f"127.0.0.1:{n1.proc.port}", opts).connect() as producer:
        for body in (b"a", b"b", b"c"):
            producer.pub(TOPIC, body, headers=[("tenant", b"acme")])
    with Connection(f"127.0.0.1:{n1.proc.port}", ClientOptions(timeout=10)).connect() as conn:
        got: list[bytes] = []

        def defer_first(
            c: Connection, ts: list[int], att: list[int], ids: list[bytes], _: list
        ) -> None:
            c.rdy(0)  # no more for this consumer: the rest stays queued
            c.req(ids[0], 600_000)  # deferred for ten minutes
            got.extend(ids)

        conn.subscribe(TOPIC, CHANNEL, defer_first, rdy=1)
        wait_for(lambda: got, "a delivery on node 1")
        query = f"/channel/peek?topic={TOPIC}&channel={CHANNEL}"

        def listed(node: Node) -> tuple[list[tuple[str, str]], list[str]]:
            doc = node.json("GET", query)
            return [(r["id"], r["body"]) for r in doc["queued"]], [r["id"] for r in doc["deferred"]]

        wait_for(lambda: listed(n1)[1] == [got[0].decode()], "the REQ deferred on node 1")
        queued, deferred = listed(n1)
        assert [body for _, body in queued] == ["b", "c"]
        for row in n1.json("GET", query)["queued"]:
            assert [(h["name"], h["body"]) for h in row["headers"]] == [("tenant", "acme")]
        assert listed(cluster.node(2)) == ([], [])  # node 2's channel: its own partition's
        decoded = decode_offset_id(got[0])
        assert decoded is not None and decoded[0] in n1.member_ids, got
        part = decoded[0]  # node 1's partition (--workers: the member's the PUBs went to)
        wait_for(
            lambda: checkpoint(n1, part, part).get(CHANNEL, {}).get("deferred_kept") == 1,
            "the REQ's due time in node 1's checkpoint",
        )
    n1.kill()
    leader = cluster.node(wait_leader(cluster, TOPIC, part)["node"])
    assert leader.proc is not None
    wait_for(lambda: listed(leader) == (queued, deferred), "the takeover's peek: node 1's list")
    assert listed(leader) == (queued, deferred)  # peeking again changes nothing
    # The headers came over with the copy: the leader's rows carry node 1's.
    for row in leader.json("GET", query)["queued"]:
        assert [(h["name"], h["body"]) for h in row["headers"]] == [("tenant", "acme")]
    with Connection(f"127.0.0.1:{leader.proc.port}", ClientOptions(timeout=10)).connect() as conn:
        after: list[tuple[bytes, bytes]] = []

        def on_message(
            c: Connection, ts: list[int], att: list[int], ids: list[bytes], bodies: list
        ) -> None:
            for msg_id, body in zip(ids, bodies, strict=True):
                after.append((msg_id, body))
                c.fin(msg_id)

        conn.subscribe(TOPIC, CHANNEL, on_message, rdy=10)
        wait_for(lambda: len(after) >= 2, "the two queued messages on the new leader")
    assert sorted((i.decode(), b.decode()) for i, b in after) == sorted(queued)


@pytest.mark.timeout(300)
def test_rewind_and_create_at_an_offset_work_on_a_replicated_topic(cluster: Cluster) -> None:
    """A rewound channel is responsible again for what it got back (its window reopens), so
    the copies are delivered, not dropped as done; likewise a channel created at an offset."""
    prepare(cluster)
    n1 = cluster.node(1)
    assert n1.proc is not None
    bodies = [b"r%d" % i for i in range(20)]
    assert n1.http("POST", f"/mpub?topic={TOPIC}", b"\n".join(bodies))[0] == 200
    got: list[bytes] = []
    got_ids: list[bytes] = []

    def fin_into(out: list[bytes], out_ids: list[bytes] | None = None) -> Any:
        def on(c: Connection, _ts: list[int], _a: list[int], ids: list[bytes], b: list[bytes]):
            out.extend(b)
            if out_ids is not None:
                out_ids.extend(ids)
            c.fin_many(ids)

        return on

    conn = Connection(f"127.0.0.1:{n1.proc.port}", ClientOptions(timeout=10)).connect()
    try:
        conn.subscribe(TOPIC, CHANNEL, fin_into(got, got_ids), rdy=100)
        wait_for(lambda: sorted(got) == sorted(bodies), "the first delivery")
        # An offset names one partition: the one the MPUB went to (--workers: one of node 1's
        # members'; its message IDs name it), given as partition= where a node has several.
        decoded = [decode_offset_id(i) for i in got_ids]
        assert all(d is not None for d in decoded), got_ids
        origin = {d[0] for d in decoded if d is not None}
        assert len(origin) == 1, decoded
        assert {d[1] for d in decoded if d is not None} == set(range(20)), decoded
        at = "" if cluster.workers == 1 else f"&partition={origin.pop()}"
        status, body = n1.http(
            "POST", f"/channel/rewind?topic={TOPIC}&channel={CHANNEL}&offset=5{at}"
        )
        assert status == 200, body
        wait_for(lambda: len(got) == 35, "offsets 5-19 again")
        assert sorted(got[20:]) == sorted(bodies[5:])
    finally:
        conn.close()
    status, body = n1.http("POST", f"/channel/create?topic={TOPIC}&channel=late&offset=10{at}")
    assert status == 200, body
    late: list[bytes] = []
    conn = Connection(f"127.0.0.1:{n1.proc.port}", ClientOptions(timeout=10)).connect()
    try:
        conn.subscribe(TOPIC, "late", fin_into(late), rdy=100)
        wait_for(lambda: sorted(late) == sorted(bodies[10:]), "offsets 10-19 on the new channel")
    finally:
        conn.close()


@pytest.mark.timeout(600)
def test_power_loss_of_every_node_loses_no_acknowledged_message_to_consumers(
    tmp_path: Path, etcd: Etcd, lookupd: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every node loses power at once under load (kill -9, then each log segment zeroed after
    what its last fsync covered), twice: with durability=fsync every acknowledged message still
    reaches the consumers, which were never restarted: each channel is rebuilt from its
    checkpoint in etcd and the fsynced log."""
    ledger = tmp_path / "fsync.ledger"
    monkeypatch.setenv("PYNSQD_FSYNC_LEDGER", str(ledger))
    cluster = Cluster(
        tmp_path,
        etcd,
        3,
        f"--lookupd-tcp-address=127.0.0.1:{lookupd.port_of('TCP')}",
        "--broadcast-address=127.0.0.1",
    )
    try:
        prepare(cluster)
        history = History()
        with consuming(tmp_path, lookupd) as group:
            for cycle in range(max(1, round(2 * SCALE))):
                with producing(cluster, history, f"p{cycle}."):
                    want = len(history.ok) + 500
                    wait_for(lambda want=want: len(history.ok) > want, "acknowledged publishes")
                    power_loss(cluster, ledger)
                for n in cluster.nodes:
                    n.start()
                for n in cluster.nodes:
                    wait_node_in_sync(cluster, TOPIC, n)
            acked = history.acknowledged_so_far()
            if not until(lambda: acked <= set(received(group)), 90):
                missing = sorted(acked - set(received(group)))
                pytest.fail(f"{len(missing)} of {len(acked)} acknowledged never delivered")
            for c in group:
                assert c.p.poll() is None, f"the {c.client} consumer exited"
    finally:
        cluster.stop()


@pytest.mark.timeout(300)
def test_nodes_holding_only_copies_do_not_register_the_topic(
    cluster: Cluster, lookupd: ServerProcess
) -> None:
    """A node that only holds a copy of a partition (a follower) has no topic and registers
    nothing with nsqlookupd, so it never adds an idle connection that a consumer with a small
    max_in_flight (go-nsq's default is 1) would wait on; the node that takes the partition
    over creates the topic, and so registers it."""
    n1 = cluster.node(1)
    assert n1.http("POST", f"/topic/create?topic={TOPIC}")[0] == 200
    assert n1.http("POST", f"/channel/create?topic={TOPIC}&channel={CHANNEL}")[0] == 200
    assert n1.http("POST", f"/topic/replication?topic={TOPIC}&replicas=3")[0] == 200
    wait_node_in_sync(cluster, TOPIC, n1)
    assert n1.http("POST", f"/pub?topic={TOPIC}", b"hello")[0] == 200
    for m in n1.member_ids:
        wait_for(lambda m=m: CHANNEL in checkpoint(n1, m, m), "a checkpoint of the channel")

    def producers() -> list[int]:
        status, body, _ = http(f"http://127.0.0.1:{lookupd.port_of('HTTP')}/lookup?topic={TOPIC}")
        if status != 200:
            return []
        return sorted(p["tcp_port"] for p in json.loads(body)["producers"])

    assert n1.proc is not None
    wait_for(lambda: producers() == [n1.proc.port], "node 1 registered")
    assert producers() == [n1.proc.port]  # the followers hold copies, not the topic
    n1.kill()
    # The nodes that took node 1's partitions over (--workers: one per member, maybe two).
    leaders = {cluster.node(wait_leader(cluster, TOPIC, m)["node"]) for m in n1.member_ids}
    ports = sorted({n.proc.port for n in leaders if n.proc is not None})
    wait_for(lambda: producers() == ports, "the takeover nodes registered")


@pytest.mark.timeout(300)
def test_etcd_down_channels_keep_delivering_and_checkpoints_resume(
    tmp_path: Path, etcd: Etcd, cluster: Cluster, lookupd: ServerProcess
) -> None:
    """etcd killed under load: publishes to the replicated topic stall (as the log's test
    shows), but consumers go on getting what was acknowledged (the outage is one warning line
    per node, whatever fails meanwhile: checkpoints, reads, keepalives; no traceback); etcd
    back, checkpoints and publishes resume, and every acknowledged message is delivered."""
    prepare(cluster)
    history = History()
    n1 = cluster.node(1)
    with consuming(tmp_path, lookupd) as group:
        with producing(cluster, history):
            wait_for(lambda: len(history.ok) > 300, "acknowledged publishes")
            etcd.stop(signal.SIGKILL)
            # The last ones etcd took (--workers: of each member's partition).
            before = {m: checkpoint(n1, m, m)[CHANNEL]["low"] for m in n1.member_ids}
            acked = history.acknowledged_so_far()
            wait_for(lambda: acked <= set(received(group)), "deliveries without etcd", 60)
            wait_for(
                lambda: all(
                    "CLUSTER: etcd unreachable" in n.log.read_text() for n in cluster.nodes
                ),
                "every node to say etcd is unreachable",
            )
            for n in cluster.nodes:
                outage = n.log.read_text().rpartition("CLUSTER: etcd unreachable")[2]
                assert "failed to checkpoint" not in outage, outage[-2000:]
            etcd.start()
            want = len(history.ok) + 300
            wait_for(lambda: len(history.ok) > want, "publishes with etcd back", 60)
        acked = history.acknowledged_so_far()
        if not until(lambda: acked <= set(received(group)), 60):
            missing = sorted(acked - set(received(group)))
            pytest.fail(f"{len(missing)} of {len(acked)} acknowledged never delivered")
    wait_for(
        lambda: any(checkpoint(n1, m, m)[CHANNEL]["low"] > before[m] for m in n1.member_ids),
        "checkpoints moving again",
    )
    assert "Traceback" not in "".join(n.log.read_text() for n in cluster.nodes)


@pytest.mark.timeout(900)  # scaled by PYNSQD_FAULT_SCALE
@pytest.mark.parametrize("cut", ["etcd", "everything"])
def test_consumers_lose_nothing_when_a_node_is_cut_off(
    tmp_path: Path, network: Network, cut: str
) -> None:
    """Each node in turn is cut off under load (iptables DROP inside its network namespace),
    with a pynsq and a gnsq consumer reading through nsqlookupd: from etcd only (its consumers,
    producers and peers still reach it while another node takes its partition over), or from
    everything (etcd, its peers, nsqlookupd, the consumers and the producers). Every message
    acknowledged before the cut reaches the consumers before the heal; after it the node
    rejoins and leads its partition again; no consumer is restarted; duplicates stay within
    the bound."""
    etcd = Etcd(tmp_path, host=network.etcd)
    lookupd = ServerProcess(
        "nsqlookupd",
        f"--tcp-address={network.harness}:0",
        f"--http-address={network.harness}:0",
        f"--broadcast-address={network.harness}",
        log=tmp_path / "nsqlookupd.log",
    )
    cluster: Cluster | None = None
    try:
        cluster = Cluster(
            tmp_path,
            etcd,
            3,
            f"--lookupd-tcp-address={network.harness}:{lookupd.port_of('TCP')}",
            network=network,
        )
        prepare(cluster)
        history = History()
        faults = round(3 * SCALE)
        with consuming(tmp_path, lookupd) as group:
            with producing(cluster, history):
                replay_all = cycles(cluster, history, group, faults, f"cut-{cut}", network)
            what = f"cut from {cut}, {faults} times"
            delivered_within_bound(history, group, what, replay_all, both=cut == "etcd")
    finally:
        if cluster is not None:
            cluster.stop()
        lookupd.stop()
        etcd.stop()


@pytest.mark.timeout(600)
def test_channel_admin_calls_race_load_and_a_takeover(
    tmp_path: Path, cluster: Cluster, lookupd: ServerProcess
) -> None:
    """Channel admin calls on every node from four threads at once (rewind of the consumers'
    channel and of scratch channels, create at an offset, empty, pause and unpause, config,
    delete, /stats, /topic/replication) while two producers publish, a pynsq and a gnsq consumer
    read, and a node is killed -9, taken over, and comes back: every answer is a 200 or a
    refusal that names its reason, never a 500; no node logs a traceback; every acknowledged
    message reaches the consumers and nothing else does."""
    prepare(cluster)
    history = History()
    answers: Counter[tuple[str, int]] = Counter()
    refused: list[tuple[str, int, bytes]] = []
    stop = threading.Event()

    def call(rng: random.Random, node: Node) -> tuple[str, str]:
        scratch = f"s{rng.randrange(3)}"
        recent = int(time.time() * 1000) - 200  # the last 0.2 s of the log
        # An offset names one partition: with --workers, one of the node's members'.
        at = "" if cluster.workers == 1 else f"&partition={rng.choice(node.member_ids)}"
        return rng.choice(
            [
                ("POST", f"/channel/rewind?topic={TOPIC}&channel={CHANNEL}&timestamp={recent}"),
                ("POST", f"/channel/create?topic={TOPIC}&channel={scratch}&offset=0{at}"),
                ("POST", f"/channel/rewind?topic={TOPIC}&channel={scratch}&offset=0{at}"),
                ("POST", f"/channel/empty?topic={TOPIC}&channel={scratch}"),
                ("POST", f"/channel/delete?topic={TOPIC}&channel={scratch}"),
                ("POST", f"/channel/config?topic={TOPIC}&channel={scratch}&max_attempts=5"),
                ("POST", f"/channel/pause?topic={TOPIC}&channel={CHANNEL}"),
                ("POST", f"/channel/unpause?topic={TOPIC}&channel={CHANNEL}"),
                ("GET", f"/stats?format=json&topic={TOPIC}"),
                ("GET", f"/topic/replication?topic={TOPIC}"),
            ]
        )

    def hammer(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            node = rng.choice(cluster.nodes)
            method, path = call(rng, node)
            try:
                status, body = node.http(method, path)
            except (OSError, AssertionError):  # the killed node, or one being started
                continue
            name = path.split("?")[0]
            answers[(name, status)] += 1
            if status != 200:
                refused.append((name, status, body))

    threads = [threading.Thread(target=hammer, args=(i,), daemon=True) for i in range(4)]
    with consuming(tmp_path, lookupd) as group:
        with producing(cluster, history):
            for t in threads:
                t.start()
            try:
                for _ in range(2):
                    want = len(history.ok) + 300
                    wait_for(lambda want=want: len(history.ok) > want, "acknowledged publishes")
                victim = cluster.node(2)
                acked = history.acknowledged_so_far()
                victim.kill()
                before = sum(answers.values())
                wait_for(
                    lambda: led_elsewhere(cluster, victim), "a takeover of node 2's partition", 20
                )
                wait_for(
                    lambda: sum(answers.values()) > before + 200, "admin calls during the takeover"
                )
                victim.start()
                wait_node_in_sync(cluster, TOPIC, victim)
                want = len(history.ok) + 300
                wait_for(lambda: len(history.ok) > want, "publishes after the return")
            finally:
                stop.set()
                for t in threads:
                    t.join(30)
        for n in cluster.nodes:  # a pause may have been the last call on a node
            assert n.http("POST", f"/channel/unpause?topic={TOPIC}&channel={CHANNEL}")[0] == 200
        acked = history.acknowledged_so_far()
        if not until(lambda: acked <= set(received(group)), 60):
            missing = sorted(acked - set(received(group)))
            pytest.fail(f"{len(missing)} of {len(acked)} acknowledged never delivered")
        assert not set(received(group)) - history.invoked, "a body no one published"
        for c in group:
            assert c.p.poll() is None, f"the {c.client} consumer exited"
    print(sorted(answers.items()))
    assert answers[("/channel/rewind", 200)] and answers[("/channel/create", 200)]
    for name, status, body in refused:
        assert status in (404, 409), (name, status, body)
        assert json.loads(body).get("message"), (name, status, body)
    for n in cluster.nodes:
        assert "Traceback" not in n.log.read_text()


def take_back_and_publish(node: Node) -> list[bytes]:
    """``node`` started again, once it has taken its partition back: 50 messages published to
    it, acknowledged."""
    node.start()
    took_back = "its channels here go on from offset"
    wait_for(lambda: took_back in node.log.read_text(), f"node {node.node_id} to take back")
    bodies = [b"after-take-back-%03d" % i for i in range(50)]
    status, body = node.http("POST", f"/mpub?topic={TOPIC}", b"\n".join(bodies))
    assert status == 200, body
    return bodies


def test_a_node_killed_again_right_after_it_took_its_partition_back_loses_nothing(
    tmp_path: Path, cluster: Cluster, lookupd: ServerProcess
) -> None:
    """Issue 43's `[kill-6]` defect, reproduced: node 1 is killed, a peer adopts its channels
    (node 1's checkpoint key becomes a tombstone); node 1 comes back, takes its partition back
    and takes publishes, and is killed again before it writes a checkpoint of its own (they are
    written every second). The adopter found only the old tombstone and adopted nothing, so
    what node 1's channels had not delivered was never delivered (seen in fresh-clone runs:
    "acknowledged messages not delivered after node 1 went")."""
    prepare(cluster)
    n1 = cluster.node(1)
    with consuming(tmp_path, lookupd) as group:
        n1.kill()
        wait_for(lambda: led_elsewhere(cluster, n1), "a takeover of node 1's partition", 20)
        bodies = take_back_and_publish(n1)
        n1.kill()  # before its checkpoint replaced the tombstone (most times: within 1 s)
        wait_for(lambda: led_elsewhere(cluster, n1), "a second takeover", 20)
        wait_for(
            lambda: set(bodies) <= set(received(group)),
            "every acknowledged message delivered by the node that took over",
            60,
        )


def test_an_adopter_that_never_held_the_partitions_windows_adopts_after_a_take_back(
    tmp_path: Path, cluster: Cluster, lookupd: ServerProcess
) -> None:
    """As above, but the second takeover is made by the node that did not adopt the first
    time, so its channels hold no window of node 1's partition: it took the channels to adopt
    from its own windows of the partition, found none, and adopted nothing (the power-loss
    test lost 674 of 6,103 acknowledged messages so, in loops under load). The tombstone now
    names the channels it adopted, and the next adopter takes those.

    The first adopter must stay a live member meanwhile (else its own windows, adopted too,
    would give the second adopter the channel): nodes 2 and 3 run with a 20 s lease, and the
    first adopter is paused (SIGSTOP) while node 1 dies again and the other node takes over."""
    prepare(cluster)
    n1 = cluster.node(1)
    short = cluster.extra
    cluster.extra = (*short, "--etcd-lease-ttl=20s")
    for n in cluster.nodes[1:]:
        n.kill(signal.SIGTERM)
        n.start()
        wait_for(lambda n=n: n.joined, f"node {n.node_id} to join again")
        wait_node_in_sync(cluster, TOPIC, n)
    cluster.extra = short
    wait_node_in_sync(cluster, TOPIC, n1)
    # --workers: node 1's first member's partition (its MPUB may go to either member's).
    o = n1.base_id
    adopted = f"partition orders/{o}: took over node {o}'s channels of it (ch)"
    with consuming(tmp_path, lookupd) as group:
        n1.kill()
        wait_for(lambda: led_elsewhere(cluster, n1), "a takeover of node 1's partition", 20)
        wait_for(
            lambda: any(adopted in n.log.read_text() for n in cluster.nodes if n is not n1),
            "node 1's channels adopted",
        )
        first = next(n for n in cluster.nodes if n is not n1 and adopted in n.log.read_text())
        other = next(n for n in cluster.nodes if n is not n1 and n is not first)
        bodies = take_back_and_publish(n1)
        first.pause()
        n1.kill()
        wait_for(
            lambda: any(
                q["partition"] == o and q["role"] == "leader"
                for q in other.json("GET", f"/topic/replication?topic={TOPIC}")["partitions"]
            ),
            f"node {other.node_id} to take node 1's partition over",
            20,
        )
        first.resume()
        wait_for(
            lambda: set(bodies) <= set(received(group)),
            f"every acknowledged message delivered by node {other.node_id}",
            60,
        )
