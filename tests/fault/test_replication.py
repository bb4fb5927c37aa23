"""Replicated topics under faults: a real etcd, three real pynsqd processes, kill -9 and SIGSTOP.

Every publish goes to a history; after the faults every partition's committed log is read from
the node that serves it and ``replication_harness.check`` counts lost (acknowledged, not there),
unexpected (there, never published) and inconsistent offsets. Synchronisation is on observable
state (``/topic/replication``), never on time.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pynsqd.client import ClientOptions, NsqError
from pynsqd.client.connection import Connection
from pynsqd.protocol import encode
from pynsqd.protocol.log_record import decode_records

from ..conftest import ServerThread, http_request
from ..disks import fill, tmpfs
from ..integration.replication_harness import (
    Cluster,
    Etcd,
    History,
    Network,
    Node,
    check,
    led_elsewhere,
    partition_digest,
    power_loss,
    producing,
    replicate,
    wait_in_sync,
    wait_leader,
)
from ..processes import NSQD
from ..processes import NsqdProcess as Proc
from ..waiting import until, wait_for

TOPIC = "orders"


@pytest.fixture
def cluster(three_nodes: Cluster) -> Cluster:
    return three_nodes


# -- membership and settings --------------------------------------------------------------------


def test_a_second_node_with_the_same_id_is_refused_with_one_line(
    tmp_path: Path, etcd: Etcd
) -> None:
    c = Cluster(tmp_path, etcd, 1)
    try:
        other = tmp_path / "other"
        other.mkdir()
        run = subprocess.run(
            [
                NSQD,
                "--tcp-address=127.0.0.1:0",
                "--http-address=127.0.0.1:0",
                f"--data-path={other}",
                *c.flags(1),
            ],
            capture_output=True,
            timeout=60,
        )
        assert run.returncode == 1
        errors = [ln for ln in run.stderr.decode().splitlines() if "FATAL" in ln or "already" in ln]
        assert len(errors) == 1, run.stderr.decode()
        assert "--node-id=1 is already in cluster 'test'" in errors[0]
        assert "Traceback" not in run.stderr.decode()
        # Nothing but the start and its FATAL line (issue 41: closing lines came first, and
        # aiohttp's "Unclosed connector" after).
        lines = run.stderr.decode().splitlines()
        assert len(lines) == 3 and "nsqd v" in lines[0] and "FATAL" in lines[2], lines
        assert c.node(1).alive
    finally:
        c.stop()


def test_replicated_nodes_on_one_host_get_their_own_default_ids(tmp_path: Path, etcd: Etcd) -> None:
    """Found by a new user (issue 41): without --node-id a node takes the hostname's hash, so
    two on one host collided. A replicated node's default id is its data directory's."""
    from pynsqd.options import node_id_for_storage

    from ..processes import NsqdProcess

    flags = [
        *(f"--etcd-endpoints={u}" for u in etcd.urls),
        "--cluster-name=t",
        "--retention-time=1h",
    ]
    procs = []
    try:
        for name in ("a", "b"):
            data = tmp_path / name
            data.mkdir()
            procs.append(NsqdProcess(data, tmp_path / f"{name}.log", *flags))
        ids = []
        for name, proc in zip(("a", "b"), procs, strict=True):
            assert "joined" in proc.output(), proc.output()
            storage = (tmp_path / name / "cluster.id").read_text().split()[0]
            assert f"ID: {node_id_for_storage(storage)} (from the data directory" in proc.output()
            status, body = proc.http("GET", "/info")
            assert status == 200, body
            ids.append(json.loads(body)["node_id"])
        assert ids[0] != ids[1]
    finally:
        for proc in procs:
            proc.stop()


def test_replication_needs_etcd_and_retention(
    tmp_path: Path, etcd: Etcd, nsqd: ServerThread
) -> None:
    status, body = http_request(nsqd, "POST", "/topic/create?topic=t")
    status, body = http_request(nsqd, "POST", "/topic/replication?topic=t&replicas=3")
    assert status == 400 and b"REPLICATION_NEEDS_ETCD" in body
    c = Cluster(tmp_path, etcd, 1)
    c.extra = ()
    try:
        n = c.node(1)
        n.kill(signal.SIGTERM)
        n.proc = None
        # The node again, without retention.
        from ..processes import NsqdProcess as Proc

        n.proc = Proc(
            n.data,
            n.log,
            f"--node-id={n.node_id}",
            f"--etcd-endpoints={etcd.url}",
            "--cluster-name=test",
        )
        assert n.http("POST", "/topic/create?topic=t")[0] == 200
        status, body = n.http("POST", "/topic/replication?topic=t&replicas=3")
        assert status == 400 and b"REPLICATION_NEEDS_RETENTION" in body
        status, body = n.http("POST", "/topic/replication?topic=t&replicas=9")
        assert status == 400
    finally:
        c.stop()


def test_the_first_documented_command_works_on_a_missing_topic(cluster: Cluster) -> None:
    """Found by a new user (issue 41): ``POST /topic/replication`` on a topic not yet created
    answered 404 TOPIC_NOT_FOUND (the docs never said to create it first), a GET for a topic
    that exists nowhere answered 200 with empty partitions, and replicas above the live nodes
    was taken silently."""
    n = cluster.node(1)
    assert n.http("GET", "/topic/replication?topic=nope")[0] == 404
    status, body = n.http("POST", "/topic/replication?topic=fresh&replicas=3&min_insync=9")
    assert status == 400 and b"INVALID_ARG_MIN_INSYNC" in body
    assert n.http("GET", "/topic/replication?topic=fresh")[0] == 404  # bad settings: nothing made
    status, body = n.http("POST", "/topic/replication?topic=fresh&replicas=3")
    assert status == 200, body
    assert "warning" not in json.loads(body)
    wait_in_sync(cluster, "fresh", 1)
    assert n.http("POST", "/pub?topic=fresh", b"x") == (200, b"OK")
    # Another node holds a copy of node 1's partition without having the topic itself.
    assert cluster.node(2).json("GET", "/topic/replication?topic=fresh")["replicas"] == 3
    status, body = n.http("POST", "/topic/replication?topic=wide&replicas=5")
    assert status == 200, body
    assert "replicas=5 but 3 nodes are live" in json.loads(body)["warning"]


def test_settings_are_checked_and_shown(cluster: Cluster) -> None:
    n = cluster.node(1)
    n.http("POST", "/topic/create?topic=t")
    status, body = n.http("POST", "/topic/replication?topic=t&replicas=3&min_insync=4")
    assert status == 400 and b"INVALID_ARG_MIN_INSYNC" in body
    status, body = n.http("POST", "/topic/replication?topic=t&replicas=3&acks=some")
    assert status == 400 and b"INVALID_ARG_ACKS" in body
    replicate(cluster, "t", durability="fsync")
    doc = cluster.node(2).json("GET", "/topic/replication?topic=t")
    assert (doc["replicas"], doc["min_insync"], doc["acks"]) == (3, 2, "all")
    stats = n.json("GET", "/stats?format=json&topic=t")
    repl = stats["topics"][0]["replication"]
    assert repl["replicas"] == 3
    mine = next(p for p in repl["partitions"] if p["partition"] == 1)
    assert mine["role"] == "leader" and sorted(mine["isr"]) == [1, 2, 3]
    assert n.http("POST", "/pub?topic=t", b"x") == (200, b"OK")
    # The same in the text /stats, /metrics and /info.
    status, text = n.http("GET", "/stats?topic=t")
    assert b"replication: replicas 3 min_insync 2 acks all durability fsync" in text
    assert b"partition 1: leader leader 1" in text
    status, metrics = n.http("GET", "/metrics")
    assert b'nsq_partition_committed_offset{partition="1",role="leader",topic="t"} 1.0' in metrics
    assert b'nsq_partition_in_sync{partition="1",role="leader",topic="t"} 3.0' in metrics
    assert b'nsq_partition_follower_lag{follower="2",partition="1",topic="t"}' in metrics
    info = n.json("GET", "/info")
    assert info["node_id"] == 1 and info["cluster"]["name"] == "test"
    assert "replicated-topics" in info["features"] and info["cluster"]["nodes"] == [1, 2, 3]
    # Its partitions are placed: their number of copies is fixed (turning replication off, or
    # moving copies, is not built): refused with the reason, the settings as they were.
    for replicas in (1, 2):
        status, body = n.http("POST", f"/topic/replication?topic=t&replicas={replicas}")
        assert status == 400 and b"REPLICAS_FIXED" in body and b"from 3" in body, body
    doc = n.json("GET", "/topic/replication?topic=t")
    assert (doc["replicas"], doc["min_insync"]) == (3, 2)
    assert n.http("POST", "/topic/replication?topic=t&replicas=3&min_insync=3")[0] == 200


def test_nsqadmin_shows_each_partition_with_its_leader_and_lag(cluster: Cluster) -> None:
    from ..integration.servers import AdminThread

    replicate(cluster)
    assert cluster.node(2).http("POST", f"/pub?topic={TOPIC}", b"x") == (200, b"OK")
    addresses = [f"127.0.0.1:{n.proc.http_port}" for n in cluster.nodes]  # type: ignore[union-attr]
    admin = AdminThread(nsqd_http_addresses=addresses)
    try:
        # (Each partition led by its origin with three in sync, as nsqadmin sees it: a busy
        # machine can lapse a 2-s lease after replicate() saw it so, and a leader that took
        # its partition back shows the set it read until its next tick adds itself.)
        def settled() -> bool:
            doc = admin.request("GET", f"/api/topics/{TOPIC}")[1]
            return all(
                p["leader"] == p["partition"] and len(p["isr"]) == 3 for p in doc["partitions"]
            )

        wait_for(settled, "every partition led by its origin, three in sync, in nsqadmin")
        status, doc = admin.request("GET", f"/api/topics/{TOPIC}")
        assert status == 200, doc
        parts = doc["partitions"]
        assert [p["partition"] for p in parts] == [1, 2, 3]
        for p in parts:
            assert p["leader"] == p["partition"] and p["node"] == addresses[p["partition"] - 1]
            assert sorted(p["isr"]) == [1, 2, 3] and set(p["follower_lag"]) == {
                str(n) for n in (1, 2, 3) if n != p["partition"]
            }
        assert parts[1]["committed"] == 1
        # A channel's checkpoint (issue 28) shows with its partition.
        assert cluster.node(2).http("POST", f"/channel/create?topic={TOPIC}&channel=ch")[0] == 200

        def checkpointed() -> bool:
            parts = admin.request("GET", f"/api/topics/{TOPIC}")[1]["partitions"]
            return parts[1]["checkpoints"].get("2", {}).get("ch", {}).get("low") == 0

        wait_for(checkpointed, "node 2's channel checkpoint in nsqadmin")
    finally:
        admin.stop()


def test_nsqadmin_counts_what_was_published_across_a_failover(tmp_path: Path, etcd: Etcd) -> None:
    """Issue 54: after a node's death nsqadmin showed 1,376 of 1,501 messages published (the
    dead node's count went with it). A replicated topic's count is its partitions' committed
    offsets, whoever leads them now."""
    from ..integration.servers import AdminThread

    # A 5-s lease, not the harness's 2 s: under the suite's load a node's lease lapsed before
    # its first publish (503 "lease expired"); the failover waits 3 s longer for it.
    cluster = Cluster(tmp_path, etcd, 3, "--etcd-lease-ttl=5s")
    admin = None
    try:
        replicate(cluster)
        for n, count in ((1, 3), (2, 2), (3, 1)):
            for _ in range(count):
                assert cluster.node(n).http("POST", f"/pub?topic={TOPIC}", b"x") == (200, b"OK")
        addresses = [f"127.0.0.1:{n.proc.http_port}" for n in cluster.nodes]  # type: ignore[union-attr]
        admin = AdminThread(nsqd_http_addresses=addresses)
        assert admin.request("GET", f"/api/topics/{TOPIC}")[1]["message_count"] == 6
        cluster.node(1).kill()

        def taken_over() -> bool:
            doc = admin.request("GET", f"/api/topics/{TOPIC}")[1]
            return any(p["partition"] == 1 for p in doc.get("partitions") or [])

        wait_for(taken_over, "a live node to lead node 1's partition", 60)
        # The new leader's commit point may trail the dead one's by a round: it catches up.
        wait_for(
            lambda: admin.request("GET", f"/api/topics/{TOPIC}")[1]["message_count"] == 6,
            "the count of what was published, 6",
            60,
        )
    finally:
        if admin is not None:
            admin.stop()
        cluster.stop()


# -- the data path ------------------------------------------------------------------------------


def test_an_ok_means_every_in_sync_replica_has_it(cluster: Cluster) -> None:
    replicate(cluster)
    conn = Connection(f"127.0.0.1:{cluster.node(1).proc.port}").connect()  # type: ignore[union-attr]
    bodies = [b"m%d" % i for i in range(300)]
    for b in bodies[:100]:
        conn.pub(TOPIC, b)
    conn.mpub(TOPIC, bodies[100:])
    conn.close()
    n1 = cluster.node(1)
    # One connection: one member's partition (node 1's own; with --workers, its worker's).
    assert cluster.committed_own(TOPIC, n1) == 300
    (origin,) = [m for m in n1.member_ids if (cluster.partition(TOPIC, m) or {})["committed"]]

    # Every replica holds the same records, byte for byte, up to the committed offset (the
    # followers learn that offset with their next fetch).
    def learned() -> bool:
        docs = [n.json("GET", f"/topic/replication?topic={TOPIC}") for n in cluster.nodes]
        return all(
            q["committed"] == 300 for d in docs for q in d["partitions"] if q["partition"] == origin
        )

    wait_for(learned, "the followers to learn the committed offset")
    reads = {n.node_id: cluster.read_partition(TOPIC, origin, n) for n in cluster.nodes}
    assert [r[2] for r in reads[1]] == bodies
    assert reads[1] == reads[2] == reads[3]


def test_the_fetch_stream_answers_hostile_input_with_one_clear_refusal(cluster: Cluster) -> None:
    """``GET /topic/replicate`` (the followers' websocket): without an upgrade, with a bad
    partition, with a malformed fetch, at another epoch: an nsqd-style refusal each, never a
    traceback; a well-formed fetch at the leader's epoch gets the records verbatim. A fetch
    that claims a later epoch does not unseat the leader (it did: only etcd says who leads)."""
    import aiohttp

    from pynsqd.cluster.fetch import FetchAnswer, FetchRequest

    replicate(cluster)
    n1 = cluster.node(1)
    conn = Connection(f"127.0.0.1:{n1.proc.port}").connect()  # type: ignore[union-attr]
    conn.mpub(TOPIC, [b"a", b"b", b"c"])
    conn.close()
    epoch = wait_leader(cluster, TOPIC, 1)["epoch"]
    assert n1.http("GET", f"/topic/replicate?topic={TOPIC}&partition=1") == (
        400,
        b'{"message":"WEBSOCKET_REQUIRED"}',
    )
    status, body = n1.http("GET", f"/topic/replicate?topic={TOPIC}&partition=x")
    assert (status, b"INVALID_ARG_PARTITION" in body) == (400, True)

    async def talk() -> list[FetchAnswer | str]:
        url = f"http://{n1.host}:{n1.proc.http_port}/topic/replicate"  # type: ignore[union-attr]
        got: list[FetchAnswer | str] = []
        async with aiohttp.ClientSession() as session:
            query = {"topic": TOPIC, "partition": "1"}
            async with session.ws_connect(url, params=query) as ws:
                for epoch_asked, replica in ((epoch + 1000, 99), (epoch, 99), (epoch, 2)):
                    req = FetchRequest(0, epoch_asked, 0, replica, "test", 0, 1 << 20)
                    await ws.send_bytes(req.encode())
                    got.append(FetchAnswer.decode((await ws.receive()).data))
                await ws.send_bytes(b"not a fetch")
                got.append(FetchAnswer.decode((await ws.receive()).data))
                got.append((await ws.receive()).type.name)
        return got

    import asyncio

    stale, stranger, ok, bad, closed = asyncio.run(talk())
    assert isinstance(stale, FetchAnswer) and (stale.status, stale.message) == (
        409,
        "EPOCH_MISMATCH",
    )
    # Node 99 holds no copy of the partition (the assignment does not name it).
    assert isinstance(stranger, FetchAnswer) and (stranger.status, stranger.message) == (
        409,
        "NOT_REPLICA",
    )
    assert isinstance(ok, FetchAnswer) and ok.status == 200
    assert [r.body for r in decode_records(ok.records)] == [b"a", b"b", b"c"]
    assert isinstance(bad, FetchAnswer) and (bad.status, bad.message) == (400, "INVALID_ARG_FETCH")
    assert closed in ("CLOSE", "CLOSED", "CLOSING")
    # A fetch from another storage than the member's is not an acknowledgement the HW counts
    # on: the partition still leads at the same epoch, with its in-sync set unchanged.
    p = wait_leader(cluster, TOPIC, 1)
    assert p["epoch"] == epoch and sorted(p["isr"]) == [1, 2, 3]
    assert "Traceback" not in n1.log.read_text()


def test_a_fetch_stream_dropped_while_it_opens_is_no_error(cluster: Cluster) -> None:
    """Found in fault runs (issue 41): a follower whose connection reset while its replica
    stream opened made the leader log a traceback and a 500. Twenty upgrades reset at once:
    nothing logged as an error, the partition goes on."""
    import base64
    import os

    replicate(cluster)
    n1 = cluster.node(1)
    assert n1.proc is not None
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", n1.proc.http_port))
        key = base64.b64encode(os.urandom(16)).decode()
        s.sendall(
            f"GET /topic/replicate?topic={TOPIC}&partition=1 HTTP/1.1\r\nHost: x\r\n"
            f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # a reset, not a close
    assert n1.http("POST", f"/pub?topic={TOPIC}", b"after")[0] == 200  # it still commits
    text = n1.log.read_text()
    assert "Traceback" not in text and " 500 GET /topic/replicate" not in text


def test_settings_changed_under_load_answer_and_lose_nothing(cluster: Cluster) -> None:
    """``POST /topic/replication`` raced against publishes on every node: acks, durability and
    min_insync flipped 24 times; each change is answered 200, publishing goes on under every
    setting, nothing acknowledged is lost, no node logs a traceback."""
    replicate(cluster)
    history = History()
    changes = [
        "acks=leader",
        "durability=pagecache",
        "min_insync=3",
        "acks=all",
        "min_insync=1",
        "durability=fsync",
        "min_insync=2",
    ]
    rng = random.Random(7)
    with producing(cluster, history):
        for i in range(24):
            node = cluster.node(i % 3 + 1)
            status, body = node.http(
                "POST", f"/topic/replication?topic={TOPIC}&{rng.choice(changes)}"
            )
            assert status == 200, body
            want = len(history.ok) + 10
            wait_for(lambda want=want: len(history.ok) > want, "publishes under the new setting")
    status, body = cluster.node(1).http(
        "POST", f"/topic/replication?topic={TOPIC}&acks=all&durability=fsync&min_insync=2"
    )
    assert status == 200, body
    verify(cluster, history)
    for node in cluster.nodes:
        text = node.log.read_text()
        assert "Traceback" not in text
        # No topic was deleted: a read of the cluster older than one made meanwhile (the
        # POST's own read raced the tick's) took a partition for deleted and dropped it.
        assert "deleted on its origin node" not in text, node.node_id


@pytest.mark.timeout(360)  # 30 topics, 90 publishes: 10 s alone, 64-95 s in a loaded suite
def test_topics_replicated_while_the_cluster_is_read_keep_their_partitions(
    tmp_path: Path, etcd: Etcd
) -> None:
    """Found in a suite run's logs: ``POST /topic/replication`` reads the cluster itself while
    the tick may be reading it too; a read older than a placement made meanwhile took the
    new partition for one whose topic was deleted, and dropped it ("deleted on its origin
    node": its leader stepped down, a follower's copy was removed) until the next tick
    placed it again. Thirty topics replicated one after another, each with a publish on
    every node answered OK in the end, and no node logs a drop (every drop is logged: the
    race's publishes were refused ``PARTITION_ELSEWHERE`` meanwhile). (The harness's 2-s
    lease: its beats wake the reads often, which this race needs.)"""
    cluster = Cluster(tmp_path, etcd, 3)
    try:
        _replicate_topics_in_a_row(cluster, 30)
    finally:
        cluster.stop()


def _replicate_topics_in_a_row(cluster: Cluster, count: int) -> None:
    for i in range(count):
        topic = f"t{i}"
        for n in cluster.nodes:
            assert n.http("POST", f"/topic/create?topic={topic}")[0] == 200
        status, body = cluster.node(1).http("POST", f"/topic/replication?topic={topic}&replicas=3")
        assert status == 200, body
        for n in cluster.nodes:

            def published(n: Node = n, topic: str = topic) -> bool:
                return n.http("POST", f"/pub?topic={topic}", b"m") == (200, b"OK")

            # (A refusal is asked again: on a starved machine a 2-s lease lapses and the
            # partition is served elsewhere for a while, which is not this test's fault.)
            wait_for(published, f"a publish to {topic} on node {n.node_id} answered OK", 60)
    for n in cluster.nodes:
        assert "deleted on its origin node" not in n.log.read_text(), n.node_id


def test_a_record_larger_than_a_fetch_is_replicated(tmp_path: Path, etcd: Etcd) -> None:
    """A fetch answers at least one whole record: with ``--max-msg-size`` above a fetch's
    4 MiB, a 6 MB message still reaches the followers (the follower's stream refused the
    answer as too large, and the publish failed after the timeout). A lease of 10 s, not the
    harness's 2 s: on a saturated 2-core machine the 6 MB record's append, fsyncs and two
    streams took 8 s once, and the leader's 2-s lease lapsed meanwhile (its publish failed
    "lease expired", as it should then); this test is about the record, not the lease."""
    cluster = Cluster(tmp_path, etcd, 3, f"--max-msg-size={8 << 20}", "--etcd-lease-ttl=10s")
    try:
        replicate(cluster)
        body = bytes(range(256)) * (6_000_000 // 256)
        conn = Connection(f"127.0.0.1:{cluster.node(1).proc.port}").connect()  # type: ignore[union-attr]
        conn.pub(TOPIC, body)  # raises on E_PUB_FAILED
        conn.close()
        n2 = cluster.node(2)

        def learned() -> bool:  # a follower learns the committed offset with its next fetch
            doc = n2.json("GET", f"/topic/replication?topic={TOPIC}")
            return any(q["partition"] == 1 and q["committed"] == 1 for q in doc["partitions"])

        wait_for(learned, "node 2 to learn the committed offset")
        assert [r[2] for r in cluster.read_partition(TOPIC, 1, n2)] == [body]
    finally:
        cluster.stop()


def test_a_real_client_publishes_and_consumes_a_replicated_topic(cluster: Cluster) -> None:
    """gnsq (from PyPI) over TCP: its PUB and MPUB are answered once committed, its consumer
    gets them through a channel, and a follower holds the same records."""
    gevent = pytest.importorskip("gevent")
    import gnsq

    from ..real_clients import gnsq_running, gnsq_wait

    replicate(cluster)
    n1 = cluster.node(1)
    assert n1.proc is not None
    addr = f"127.0.0.1:{n1.proc.port}"
    bodies = [b"g%02d" % i for i in range(10)]
    got: list[bytes] = []
    producer = gnsq.Producer([addr])
    consumer = gnsq.Consumer(TOPIC, "c", nsqd_tcp_addresses=[addr], max_in_flight=5)

    @consumer.on_message.connect
    def handler(consumer: Any, message: Any) -> None:
        got.append(message.body)  # gnsq FINs on return

    with gnsq_running(gevent, producer, consumer):
        producer.start()
        assert producer.publish(TOPIC, bodies[0]) == b"OK"
        assert producer.multipublish(TOPIC, bodies[1:]) == b"OK"
        consumer.start(block=False)
        gnsq_wait(gevent, lambda: len(got), 10, "messages")
    assert sorted(got) == bodies
    wait_for(
        lambda: [r[2] for r in cluster.read_partition(TOPIC, 1, cluster.node(2))] == bodies,
        "the follower's committed copy",
    )


def test_a_follower_never_shows_what_is_not_committed(cluster: Cluster) -> None:
    """With both followers stopped (SIGSTOP), a publish cannot commit: it fails after
    --replication-timeout, and no node shows it to readers until it commits."""
    replicate(cluster)
    n1 = cluster.node(1)
    assert n1.http("POST", f"/channel/create?topic={TOPIC}&channel=c")[0] == 200

    def channel_messages() -> int:
        stats = n1.json("GET", f"/stats?format=json&topic={TOPIC}&channel=c")
        return int(stats["topics"][0]["channels"][0]["message_count"])

    assert n1.http("POST", f"/pub?topic={TOPIC}", b"first")[0] == 200
    wait_for(lambda: channel_messages() == 1, "the committed message in the channel")
    for n in (cluster.node(2), cluster.node(3)):
        n.pause()
    try:
        status, body = n1.http("POST", f"/pub?topic={TOPIC}", b"second")
        assert status == 503 and b"replication timeout" in body
        # Neither the log's readers nor the channel see it.
        assert [r[2] for r in cluster.read_own(TOPIC, n1)] == [b"first"]
        assert channel_messages() == 1
    finally:
        for n in (cluster.node(2), cluster.node(3)):
            n.resume()
    # Once the followers are back the record commits (an E_PUB_FAILED may still commit), and
    # only then goes to the channel.
    wait_for(lambda: len(cluster.read_own(TOPIC, n1)) == 2, "the second record")
    wait_for(lambda: channel_messages() == 2, "the channel to get it once committed")


@pytest.mark.timeout(900)  # many cycles of real faults; scaled by PYNSQD_FAULT_SCALE
def test_a_follower_offline_for_a_million_messages_catches_up_and_rejoins(
    cluster: Cluster,
) -> None:
    replicate(cluster)
    cluster.node(3).kill()
    wait_in_sync(cluster, TOPIC, 1, size=2)  # node 3 left the in-sync set: commits go on
    n1 = cluster.node(1)
    assert n1.proc is not None
    conn = Connection(f"127.0.0.1:{n1.proc.port}").connect()
    total, batch = round(1_000_000 * SCALE), 2000
    for i in range(0, total, batch):
        conn.mpub(TOPIC, [b"catch-up %09d" % j for j in range(i, i + batch)])
    conn.close()
    cluster.node(3).start()
    wait_in_sync(cluster, TOPIC, 1, size=3)
    # Every replica's records are the same, offset by offset, up to the committed end.
    leader = cluster.partition(TOPIC, 1)
    assert leader is not None and leader["committed"] == total
    wait_for(
        lambda: all(
            q["latest"] == total and q["committed"] == total
            for n in cluster.nodes
            for q in n.json("GET", f"/topic/replication?topic={TOPIC}")["partitions"]
            if q["partition"] == 1
        ),
        "every replica at the committed end",
    )
    digests = {partition_digest(cluster, TOPIC, 1, n) for n in cluster.nodes}
    assert len(digests) == 1 and digests.pop()[0] == total


# -- faults ---------------------------------------------------------------------------------------


def test_the_etcd_leader_killed_stalls_commits_briefly_and_loses_nothing(tmp_path: Path) -> None:
    """A three-member etcd loses its leader (kill -9) under load: the others elect one, the
    nodes move to a live endpoint, commits go on; nothing acknowledged is lost."""
    etcd = Etcd(tmp_path, members=3)
    cluster = Cluster(tmp_path, etcd, 3)
    history = History()
    try:
        replicate(cluster)
        with producing(cluster, history):
            wait_for(lambda: len(history.ok) > 50, "acknowledged publishes")
            leader = etcd.leader()
            assert leader is not None
            etcd.kill(leader)
            before = len(history.ok)
            wait_for(lambda: etcd.leader() not in (None, leader), "a new etcd leader", 20)
            wait_for(lambda: len(history.ok) > before + 100, "commits to go on", 20)
        verify(cluster, history)
    finally:
        cluster.stop()
        etcd.stop()


def test_etcd_down_stalls_commits_then_they_resume(tmp_path: Path, etcd: Etcd) -> None:
    """Without etcd no leader can know its lease lives: commits stop (publishes fail with the
    reason) and unreplicated topics go on; etcd back (its leases survive a restart), commits
    resume, and nothing acknowledged is lost."""
    cluster = Cluster(tmp_path, etcd, 3, "--replication-timeout=1s")
    try:
        replicate(cluster)
        n1 = cluster.node(1)
        acked: list[bytes] = []
        seq = iter(range(1_000_000))

        def publish() -> int:
            body = b"e%d" % next(seq)
            status, answer = n1.http("POST", f"/pub?topic={TOPIC}", body)
            if status == 200:
                acked.append(body)
            else:
                assert status == 503 and b"PUB_FAILED" in answer, answer
            return status

        assert publish() == 200
        etcd.stop(signal.SIGKILL)
        assert n1.http("POST", "/pub?topic=plain", b"unaffected") == (200, b"OK")
        wait_for(lambda: publish() == 503, "commits to stall without etcd")
        assert n1.http("POST", "/pub?topic=plain", b"unaffected") == (200, b"OK")
        # The refusal names etcd (issue 41 found a bare "replication timeout"), and the outage
        # is one line in the log, not six a second.
        status, answer = n1.http("POST", f"/pub?topic={TOPIC}", b"named")
        assert status == 503 and b"etcd unreachable for" in answer, answer
        outage = n1.log.read_text().rpartition("INFO: nsqd v")[2]
        # (one line a member: --workers N, each worker's)
        assert outage.count("CLUSTER: etcd unreachable") == cluster.workers, outage[-3000:]
        assert "failed to read the cluster" not in outage and "keepalive failed" not in outage
        etcd.start()
        wait_for(lambda: publish() == 200, "commits to resume with etcd back")
        assert "etcd answers again after" in n1.log.read_text()
        for member in n1.member_ids:
            wait_in_sync(cluster, TOPIC, member)
        have = {r[2] for r in cluster.read_own(TOPIC, n1)}
        assert set(acked) <= have
    finally:
        cluster.stop()


def read_all(cluster: Cluster) -> dict[tuple[int, str], list[tuple[int, bytes, bytes]]]:
    """Every partition's committed records from every live node holding a copy."""
    reads = {}
    for origin in cluster.origins:
        for n in cluster.live():
            status, _ = n.http("GET", f"/topic/offsets?topic={TOPIC}&partition={origin}")
            if status == 200:
                reads[(origin, str(n.node_id))] = cluster.read_partition(TOPIC, origin, n)
    return reads


def verify(cluster: Cluster, history: History) -> None:
    """After the faults: every node back in sync, then the checker over every copy."""
    settle(cluster)
    verdict = check(history, read_all(cluster))
    assert verdict.lost == [], f"{len(verdict.lost)} acknowledged lost: {verdict.lost[:10]}"
    assert verdict.unexpected == []
    assert verdict.inconsistent == []


def settle(cluster: Cluster) -> None:
    """Every node back, leading its own partition with all three in sync, and every follower
    at the leader's committed end."""
    for origin in cluster.origins:
        wait_in_sync(cluster, TOPIC, origin)

    def caught_up() -> bool:
        for origin in cluster.origins:
            p = cluster.partition(TOPIC, origin)
            if p is None or p["committed"] != p["latest"]:
                return False
            for n in cluster.nodes:
                doc = n.json("GET", f"/topic/replication?topic={TOPIC}")
                mine = [q for q in doc["partitions"] if q["partition"] == origin]
                if not mine or mine[0]["latest"] != p["latest"]:
                    return False
        return True

    wait_for(caught_up, "every replica at its leader's end", 30)


def run_faults(cluster: Cluster, cycles: int, fault: str) -> None:
    history = History()
    replicate(cluster)
    rng = random.Random(fault)
    with producing(cluster, history):
        for cycle in range(cycles):
            victim: Node = rng.choice(cluster.nodes)
            want = 20 * (cycle + 1)
            wait_for(lambda want=want: len(history.ok) > want, "acknowledged publishes")
            acked = history.acknowledged_so_far()
            victim.kill() if fault == "kill" else victim.pause()
            # A live in-sync follower takes the partition over (each of the victim's members'
            # partitions) and serves everything that was acknowledged before the fault.
            for member in victim.member_ids:
                p = wait_leader(cluster, TOPIC, member)
                assert p["node"] != victim.node_id
            if not until(lambda acked=acked: acked <= _committed(cluster), 20):
                missing = sorted(acked - _committed(cluster))
                pytest.fail(
                    f"cycle {cycle}: {len(missing)} acknowledged records not readable after the "
                    f"takeover of node {victim.node_id}'s partition: {missing[:5]} "
                    f"acked by {[history.acked_by.get(b) for b in missing[:5]]}; "
                    f"partitions {[cluster.partition(TOPIC, o) for o in cluster.origins]}"
                )
            victim.start() if fault == "kill" else victim.resume()
            for member in victim.member_ids:
                wait_in_sync(cluster, TOPIC, member)
    verify(cluster, history)
    assert len(history.ok) > 20 * cycles


def _committed(cluster: Cluster) -> set[bytes]:
    """The bodies of every partition's committed records, as their leaders serve them."""
    have: set[bytes] = set()
    for origin in cluster.origins:
        q = cluster.partition(TOPIC, origin)
        if q is not None:
            node = cluster.node(q["node"])
            have.update(r[2] for r in cluster.read_partition(TOPIC, origin, node))
    return have


#: ``scripts/replication-faults`` runs these with ten times the cycles (or any scale).
SCALE = float(os.environ.get("PYNSQD_FAULT_SCALE", "1"))


class Racer(threading.Thread):
    """Connects to a port that is not open yet, again and again without waiting, and publishes
    one body the instant the port accepts: a TCP PUB, or an HTTP ``/pub``."""

    def __init__(self, port: int, kind: str, body: bytes, history: History) -> None:
        super().__init__(daemon=True)
        self.port, self.kind, self.body, self.history = port, kind, body, history
        self.answer = ""

    def run(self) -> None:
        self.history.invoked.add(self.body)
        deadline = time.monotonic() + 120
        while True:
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=30)
                if sock.getsockname() == sock.getpeername():
                    # TCP's simultaneous open: connecting again and again to a closed port in
                    # the ephemeral range once drew that port as its own source, connected to
                    # itself and held the port the node was to bind (CI: address in use).
                    sock.close()
                    raise ConnectionRefusedError
                break
            except ConnectionRefusedError:
                if time.monotonic() > deadline:
                    self.answer = "never accepted"
                    return
                time.sleep(0.0002)  # (the gap this looks for was a millisecond wide)
        try:
            if self.kind == "tcp":
                sock.sendall(
                    b"  V2PUB "
                    + TOPIC.encode()
                    + b"\n"
                    + struct.pack(">I", len(self.body))
                    + self.body
                )
                reader = sock.makefile("rb")
                size, _ = struct.unpack(">Ii", reader.read(8))
                self.answer = reader.read(size - 4).decode(errors="replace")
                ok = self.answer == "OK"
            else:
                sock.sendall(
                    b"POST /pub?topic=%s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n"
                    b"Connection: close\r\n\r\n%s" % (TOPIC.encode(), len(self.body), self.body)
                )
                chunks = []
                while chunk := sock.recv(65536):
                    chunks.append(chunk)
                self.answer = b"".join(chunks).decode(errors="replace")
                ok = self.answer.startswith("HTTP/1.1 200")
        except OSError as err:
            self.answer = f"{type(err).__name__}: {err}"
            ok = False
        finally:
            sock.close()
        (self.history.ok if ok else self.history.failed).add(self.body)


@pytest.mark.timeout(600)
def test_a_publish_the_instant_a_restarted_node_accepts_is_kept(tmp_path: Path, etcd: Etcd) -> None:
    """Found by the real-client suites against a replicated node (issue 43): a node restarted
    after a peer took its partition over opened its TCP port before it had read etcd; a PUB in
    that millisecond was answered OK as unreplicated, then truncated away when the node learnt
    who led its partition ("truncated to offset N (1 records dropped)"). Now a replicated node
    binds its ports but takes no connection until it has joined, and a publish that comes
    while it takes its partition back waits for it (it was refused before, with a reason no
    plain nsqd gives): a publish the instant it accepts, over TCP and HTTP, is answered OK and
    kept."""
    cluster = Cluster(tmp_path, etcd, 3)
    history = History()
    answers: list[str] = []
    try:
        replicate(cluster)
        victim = cluster.node(1)
        assert victim.proc is not None
        tcp, web = victim.proc.port, victim.proc.http_port
        for cycle in range(round(4 * SCALE)):
            body = b"before-%d" % cycle
            history.invoked.add(body)
            assert victim.http("POST", f"/pub?topic={TOPIC}", body)[0] == 200
            history.ok.add(body)
            victim.kill()
            wait_for(lambda: led_elsewhere(cluster, victim), "a peer to take the partition over")
            racers = [
                Racer(tcp, "tcp", b"tcp-%d" % cycle, history),
                Racer(web, "http", b"http-%d" % cycle, history),
            ]
            for r in racers:
                r.start()
            victim.proc = Proc(
                victim.data,
                victim.log,
                *cluster.flags(1),
                f"--tcp-address=127.0.0.1:{tcp}",
                f"--http-address=127.0.0.1:{web}",
            )
            for r in racers:
                r.join(150)
                answers.append(r.answer)
            wait_in_sync(cluster, TOPIC, 1)
        # Every racer is answered OK: one that comes while the node takes its partition back
        # waits for it (a slow OK, as from a node that commits slowly), and is kept.
        assert all(a == "OK" or a.startswith("HTTP/1.1 200") for a in answers), answers
        # ... and the racers did come during a take-back (the port opens before it): the node
        # counts the publishes that waited for it.
        waited = re.findall(r"(\d+) publish\(es\) waited", victim.log.read_text())
        assert sum(map(int, waited)) >= 1, answers
        assert "records dropped" not in victim.log.read_text(), answers
        verify(cluster, history)
    finally:
        cluster.stop()


def test_replica_fetches_need_no_client_secret_when_nodes_use_auth(
    tmp_path: Path, etcd: Etcd
) -> None:
    """Found running the real-client suites against a replicated node (issue 43): with
    --auth-http-address the leader answered its followers' fetches 401 (they have no client's
    secret), the in-sync set stayed at the leader alone and every publish timed out. The
    nodes' fetches carry the cluster's secret (made in etcd by the first node to join); a
    fetch stream without it still needs a client's secret."""
    from ..integration.secure_client import AuthServer

    authd = AuthServer()
    cluster = Cluster(tmp_path, etcd, 3, f"--auth-http-address={authd.address}")
    try:
        replicate(cluster)  # every partition led by its origin with three in sync
        for n in cluster.nodes:
            status, body = n.http("POST", f"/pub?topic={TOPIC}", b"m%d" % n.node_id)
            assert status == 200, body
        p = cluster.partition(TOPIC, 1)
        assert p is not None and p["committed"] == 1 and len(p["isr"]) == 3
        status, body = cluster.node(1).http("GET", f"/topic/replicate?topic={TOPIC}&partition=1")
        assert status == 401, (status, body)
    finally:
        cluster.stop()
        authd.close()


def test_a_partition_placed_on_a_dead_node_is_re_placed(tmp_path: Path, etcd: Etcd) -> None:
    """Found running the real-client suites against a replicated node (issue 43): a node
    killed with kill -9 counts as live until its lease lapses, a topic placed in that time got
    a dead copy, was never re-placed, and with two dead copies never reached min in-sync.
    Now the leader moves a copy whose node has been gone for ``--replica-replace-after`` (1 s
    here) to a live node, and the partition commits with all its copies again (min_insync=3:
    it could not before). Here the copy's node dies after the placement and never comes
    back."""
    from pynsqd.cluster.plan import rendezvous

    cluster = Cluster(tmp_path, etcd, 4, "--replica-replace-after=1s")
    try:
        # A topic whose rendezvous placement from node 1 over nodes 1-4 includes node 3.
        topic = next(
            f"fresh{i}" for i in range(100) if 3 in rendezvous(f"fresh{i}", 1, [1, 2, 3, 4], 3)
        )
        for n in cluster.nodes:
            assert n.http("POST", f"/topic/create?topic={topic}")[0] == 200
        status, body = cluster.node(1).http(
            "POST", f"/topic/replication?topic={topic}&replicas=3&min_insync=3"
        )
        assert status == 200, body
        wait_for(
            lambda: (p := cluster.partition(topic, 1)) is not None and len(p["isr"]) == 3,
            "three in sync",
            60,
        )
        assert sorted(cluster.partition(topic, 1)["isr"]) == [1, 2, 3]  # type: ignore[index]
        cluster.node(3).kill()  # and it never comes back

        def placed_on_three_live() -> bool:
            p = cluster.partition(topic, 1)
            return p is not None and sorted(m for m in p["isr"]) == [1, 2, 4]

        wait_for(placed_on_three_live, f"partition {topic}/1 re-placed on nodes 1, 2, 4", 60)
        status, body = cluster.node(1).http("POST", f"/pub?topic={topic}", b"after")
        assert status == 200, body
        assert "gone for" in cluster.node(1).log.read_text()
    finally:
        cluster.stop()


def test_deleting_a_replicated_topic_removes_its_partition_everywhere(cluster: Cluster) -> None:
    """Found running the real-client suites against a replicated node (issue 43): deleting a
    replicated topic left its partition: the followers kept fetching, and the node answered
    each fetch 500 after "reading for a follower failed - No such file or directory". Now its
    partition's keys go from etcd, every copy is dropped (its files too), and the topic's
    other partitions go on."""
    replicate(cluster)
    for n in cluster.nodes:
        assert n.http("POST", f"/pub?topic={TOPIC}", b"m%d" % n.node_id)[0] == 200
    copies = [cluster.node(i).store / "replicas" / "1" / TOPIC for i in (2, 3)]
    assert all(c.is_dir() for c in copies)
    status, body = cluster.node(1).http("POST", f"/topic/delete?topic={TOPIC}")
    assert status == 200, body

    def gone_everywhere() -> bool:
        held = [
            q["partition"]
            for n in cluster.nodes
            for q in n.json("GET", f"/topic/replication?topic={TOPIC}")["partitions"]
        ]
        return 1 not in held and not any(c.exists() for c in copies)

    wait_for(gone_everywhere, "partition 1 dropped by every node, its copies' files removed", 30)
    for origin in (2, 3):  # the other nodes' partitions of the topic go on, all in sync
        wait_in_sync(cluster, TOPIC, origin)
        node = cluster.node(origin)
        assert node.http("POST", f"/pub?topic={TOPIC}", b"after")[0] == 200
    assert "reading for a follower failed" not in cluster.node(1).log.read_text()
    # Created and replicated again, the topic gets a new partition on node 1.
    assert cluster.node(1).http("POST", f"/topic/create?topic={TOPIC}")[0] == 200
    wait_in_sync(cluster, TOPIC, 1)
    assert cluster.node(1).http("POST", f"/pub?topic={TOPIC}", b"again")[0] == 200


def test_a_node_back_with_an_empty_disk_is_a_new_member_and_loses_nothing(
    tmp_path: Path, etcd: Etcd
) -> None:
    """The lost disk: a node killed under load comes back at once with an empty data
    directory. Its old registration is its own (same host and data path), so it replaces it
    instead of being refused as a duplicate until the lease lapses; it is a new member (a new
    storage id), not the one that was in sync: an in-sync follower takes its partition over,
    it copies every partition it holds, joins their in-sync sets, takes its own partition back,
    and nothing acknowledged is lost anywhere. (A 20 s lease: the restart surely finds the old
    registration, however loaded the machine; the replacement revokes it at once.)"""
    history = History()
    cluster = Cluster(tmp_path, etcd, 3, "--etcd-lease-ttl=20s")
    try:
        _empty_disk_return(cluster, history)
    finally:
        cluster.stop()


def _empty_disk_return(cluster: Cluster, history: History) -> None:
    replicate(cluster)
    victim = cluster.node(2)
    with producing(cluster, history):
        wait_for(lambda: len(history.ok) > 100, "acknowledged publishes")
        old_storage = victim.json("GET", "/info")["cluster"]["storage_id"]
        old_epoch = wait_leader(cluster, TOPIC, 2)["epoch"]
        victim.kill()
        acked = history.acknowledged_so_far()
        shutil.rmtree(victim.data)
        victim.data.mkdir()
        victim.start()
        wait_for(lambda: "joined" in victim.log.read_text().rpartition("INFO: nsqd v")[2], "join")
        assert "new data directory" in victim.log.read_text().rpartition("INFO: nsqd v")[2]
        assert victim.json("GET", "/info")["cluster"]["storage_id"] != old_storage
        # Its partition changed hands: an in-sync follower took it over (and, once the new
        # member caught up, it may already have taken it back: a publish to it creates the
        # topic there, and the watch makes each step at once).
        assert wait_leader(cluster, TOPIC, 2)["epoch"] > old_epoch
        assert until(lambda: acked <= _committed(cluster), 20), "acknowledged, not readable"
        # Its topics went with the disk: the operator (or the first publish) creates it again.
        assert victim.http("POST", f"/topic/create?topic={TOPIC}")[0] == 200
        wait_in_sync(cluster, TOPIC, 2)
        want = len(history.ok) + 50
        wait_for(lambda: len(history.ok) > want, "publishes after the node is back")
    verify(cluster, history)


@pytest.mark.timeout(900)  # many cycles of real faults; scaled by PYNSQD_FAULT_SCALE
def test_kill_9_of_a_leader_under_load_loses_nothing_acknowledged(cluster: Cluster) -> None:
    run_faults(cluster, round(6 * SCALE), "kill")


@pytest.mark.timeout(900)  # many cycles of real faults; scaled by PYNSQD_FAULT_SCALE
def test_a_paused_leader_loses_nothing_acknowledged(cluster: Cluster) -> None:
    """Found a defect at 4 cycles (one run in three): a publish the origin took while
    leaderless was answered OK after a takeover had truncated it away."""
    run_faults(cluster, round(8 * SCALE), "pause")


@pytest.mark.timeout(900)  # many cycles of real faults; scaled by PYNSQD_FAULT_SCALE
@pytest.mark.parametrize("durability", ["fsync", "pagecache"])
def test_power_loss_of_every_node(
    tmp_path: Path, etcd: Etcd, monkeypatch: pytest.MonkeyPatch, durability: str
) -> None:
    """Every node loses power at once (kill -9, then each segment zeroed after what its last
    fsync covered). With durability=fsync nothing acknowledged is lost; with pagecache the harness
    shows it losing acknowledged messages, which is what that setting documents (and proves the
    fault bites)."""
    ledger = tmp_path / "fsync.ledger"
    monkeypatch.setenv("PYNSQD_FSYNC_LEDGER", str(ledger))
    # pagecache: no background fsync within the test (every 2,500 messages or 2 s by
    # default), so what it acknowledges is in no file's synced part when the power goes: with
    # the defaults a loaded run once had every acknowledged message fsynced by then, and the
    # check that the fault bites failed by chance.
    lazy = ["--sync-every=1000000", "--sync-timeout=1h"] if durability == "pagecache" else []
    cluster = Cluster(tmp_path, etcd, 3, *lazy)
    try:
        replicate(cluster, durability=durability)
        history = History()
        cycles = round((3 if durability == "fsync" else 1) * SCALE)
        cut = 0
        for cycle in range(cycles):
            with producing(cluster, history, f"p{cycle}."):
                want = len(history.ok) + 300
                wait_for(lambda want=want: len(history.ok) > want, "acknowledged publishes")
                cut += power_loss(cluster, ledger)
            for n in cluster.nodes:
                n.start()
            settle(cluster)
        verdict = check(history, read_all(cluster))
        assert verdict.unexpected == []
        assert verdict.inconsistent == []
        if durability == "fsync":
            assert verdict.lost == [], f"{len(verdict.lost)} lost of {len(history.ok)}"
        else:
            assert cut > 0
            assert verdict.lost, "pagecache durability survived a power loss of every node"
    finally:
        cluster.stop()


@pytest.mark.timeout(900)  # many cycles of real faults; scaled by PYNSQD_FAULT_SCALE
@pytest.mark.parametrize("cut", ["followers", "etcd", "both"])
def test_a_partitioned_leader_loses_nothing_acknowledged(
    tmp_path: Path, network: Network, cut: str
) -> None:
    """Each node in turn is cut off (iptables DROP inside its namespace) from its followers,
    from etcd, or from both, under load; then healed. Cut from its followers a leader keeps its
    lease but can commit nothing (they leave its in-sync set, fewer than min_insync remain); cut
    from etcd its lease lapses, a follower takes over, and it commits nothing more."""
    etcd = Etcd(tmp_path, host=network.etcd)
    try:
        cluster = Cluster(
            tmp_path,
            etcd,
            3,
            "--replication-timeout=2s",
            "--replica-lag-max=2s",
            network=network,
        )
        # The bridge kept its own address as the nodes joined (an address that changes strands
        # a node's cached ARP entry for etcd: the partitions would not be the test's own).
        assert network.bridge_address() == network.address
        try:
            _cut_each_node_in_turn(cluster, network, cut)
        finally:
            cluster.stop()
    finally:
        etcd.stop()


def _cut_each_node_in_turn(cluster: Cluster, network: Network, cut: str) -> None:
    history = History()
    replicate(cluster)
    with producing(cluster, history):
        for cycle in range(round(3 * SCALE)):
            victim = cluster.node(cycle % 3 + 1)
            want = len(history.ok) + 30
            wait_for(lambda want=want: len(history.ok) > want, "acknowledged publishes")
            acked = history.acknowledged_so_far()
            peers = [n.host for n in cluster.nodes if n is not victim]
            cut_off = {"followers": peers, "etcd": [network.etcd]}.get(cut)
            network.cut(victim, cut_off or [*peers, network.etcd])
            if cut == "followers":
                # No takeover (its lease lives); its followers leave its in-sync set.
                for member in victim.member_ids:
                    wait_in_sync(cluster, TOPIC, member, size=1)
            else:
                wait_for(
                    lambda victim=victim: led_elsewhere(cluster, victim),
                    f"a takeover of node {victim.node_id}'s partition",
                    20,
                )
            # From here until the heal the victim is superseded (or below min_insync): a
            # publish sent to it in this phase may be appended there, never answered OK in it
            # (the history tags each publish and each OK with the phase it happened in).
            cut_phase = history.phase = cycle + 1
            if not until(lambda acked=acked: acked <= _committed(cluster), 20):
                missing = acked - _committed(cluster)
                pytest.fail(f"cycle {cycle}: {len(missing)} acknowledged records unreadable")
            history.phase = 0
            network.heal(victim)
            stale = history.acked_in(victim.node_id, cut_phase)
            assert stale == [], f"cycle {cycle}: node {victim.node_id} answered OK while cut off"
            for member in victim.member_ids:
                wait_in_sync(cluster, TOPIC, member)
    verify(cluster, history)


def test_a_follower_on_a_full_disk_leaves_the_in_sync_set_and_rejoins(tmp_path: Path) -> None:
    """Node 3's disk fills: its appends of partition 1 fail, it leaves partition 1's in-sync
    set, which goes on committing on nodes 1 and 2 (min_insync 2); it says so in one line per
    outage, not a line per fetch, and no traceback. With space back it catches up and rejoins,
    byte-identical, and nothing acknowledged is lost."""
    etcd = Etcd(tmp_path)
    try:
        with tmpfs(tmp_path / "node3", "size=24m") as disk:
            cluster = Cluster(tmp_path, etcd, 3, "--replica-lag-max=2s")
            try:
                replicate(cluster, min_insync=2)
                leader = cluster.node(1)
                assert leader.proc is not None
                conn = Connection(f"127.0.0.1:{leader.proc.port}").connect()
                acked: list[bytes] = []

                def publish(n: int) -> None:
                    for _ in range(n):
                        batch = [b"f%06d" % (len(acked) + i) + b"x" * 500 for i in range(100)]
                        conn.mpub(TOPIC, batch)
                        acked.extend(batch)

                publish(20)
                filler = fill(disk)
                publish(100)  # acknowledged while node 3 cannot append them
                wait_in_sync(cluster, TOPIC, 1, size=2)
                publish(20)
                third = cluster.node(3).log.read_text()
                assert "Traceback" not in third
                assert third.count("appending at offset") == 1, "one line, not one per fetch"
                assert "fetch from" not in third, "the stream was torn down and opened again"
                filler.unlink()
                wait_in_sync(cluster, TOPIC, 1)
                assert "appending again" in cluster.node(3).log.read_text()
                publish(20)
                conn.close()
                p = cluster.partition(TOPIC, 1)
                assert p is not None and p["committed"] == len(acked)
                wait_for(
                    lambda: (
                        len({partition_digest(cluster, TOPIC, 1, n) for n in cluster.nodes}) == 1
                    ),
                    "every copy of partition 1 byte-identical",
                )
                assert [r[2] for r in cluster.read_partition(TOPIC, 1, cluster.node(3))] == acked
            finally:
                cluster.stop()
    finally:
        etcd.stop()


def test_every_in_sync_member_down_keeps_the_partition_offline_until_one_returns(
    cluster: Cluster,
) -> None:
    """min_insync=1: with nodes 2 and 3 down, node 1 commits alone (its in-sync set is {1}),
    then dies too. Nodes 2 and 3 come back without what node 1 acknowledged: they must not
    lead partition 1 (an unclean election would lose those records); it stays offline, saying
    so, until node 1 returns, and then every acknowledged record is there."""
    replicate(cluster, min_insync=1)
    one, two, three = cluster.nodes
    two.kill()
    three.kill()
    wait_for(
        lambda: (cluster.partition(TOPIC, 1) or {}).get("isr") == [1], "partition 1 in sync {1}"
    )
    assert one.proc is not None
    with Connection(f"127.0.0.1:{one.proc.port}").connect() as conn:
        alone = [b"alone%d" % i for i in range(200)]
        conn.mpub(TOPIC, alone)  # acknowledged: committed on the in-sync set, node 1 alone
    one.kill()
    two.start()
    three.start()
    wait_for(lambda: "partition orders/1: offline" in two.log.read_text(), "node 2 says so")
    assert cluster.partition(TOPIC, 1) is None  # nobody leads it
    one.start()
    p = wait_leader(cluster, TOPIC, 1)
    assert p["node"] == 1
    assert [r[2] for r in cluster.read_partition(TOPIC, 1, one)] == alone
    wait_in_sync(cluster, TOPIC, 1)
    wait_for(
        lambda: [r[2] for r in cluster.read_partition(TOPIC, 1, two)] == alone,
        "node 2's copy",
    )


def test_etcd_history_compaction_is_real_and_idempotent(etcd: Etcd) -> None:
    """The checkpoints write a key a second: without compaction etcd's history would fill its
    quota in days. ``EtcdClient.compact`` drops history before a revision (reading there is
    refused by etcd itself), and compacting there again is not an error."""
    import asyncio

    from pynsqd.cluster.etcd import EtcdClient, EtcdError

    async def main() -> None:
        client = EtcdClient([etcd.url])
        try:
            first = await client.put("/compact-test", b"1")
            await client.put("/compact-test", b"2")
            latest = await client.put("/compact-test", b"3")
            await client.compact(latest)
            await client.compact(first)  # older than what is compacted: fine
            with pytest.raises(EtcdError, match="compacted"):
                await client.call("kv/range", {"key": "L2NvbXBhY3QtdGVzdA==", "revision": first})
            kv = await client.get("/compact-test")
            assert kv is not None and kv.value == b"3"
        finally:
            await client.close()

    asyncio.run(main())


def _idempotent_mpub(node: Node, bodies: list[bytes], first: int, *, answer: bool = True) -> bool:
    """An MPUB with the identity ("retrier", first) to ``node``: True once answered OK; with
    ``answer=False`` it is sent and the connection left open (its outcome unknown)."""
    assert node.proc is not None
    try:
        conn = Connection(
            f"{node.host}:{node.proc.port}", ClientOptions(connect_timeout=2, timeout=10)
        ).connect()
    except (OSError, ConnectionError):
        return False
    try:
        if not answer:
            conn.send(encode.mpub(TOPIC, bodies, ("retrier", first)))
            return False
        conn.mpub(TOPIC, bodies, identity=("retrier", first))
        return True
    except (OSError, ConnectionError, NsqError) as err:
        REFUSALS.append(str(err))
        return False
    finally:
        conn.close()


REFUSALS: list[str] = []


def test_a_publish_retried_on_the_next_node_after_its_node_died_is_written_once(
    cluster: Cluster,
) -> None:
    """Idempotent publishing across a failover (issue 42): a producer's MPUB is sent to node 1,
    which is killed with kill -9 before it answers; the producer retries it on node 2 until it
    is answered OK (refused while node 1's partition is taken over and its copy on node 2 is
    not settled), then goes on there. Node 1 comes back and takes its partition back. Every
    message is committed exactly once over the three partitions."""
    _retried_on_the_next_node(cluster)


def test_a_retry_on_the_next_node_is_written_once_with_every_worker_a_member(
    tmp_path: Path, etcd: Etcd
) -> None:
    """Issue 52 item 3 across nodes: the same with three nodes of two workers (six members).
    The producer's publishes go to its home worker on each node (the same index everywhere),
    whose member holds the copies of the other nodes' same-index partitions (placement by
    worker index), so the retry on node 2 meets node 1's records there."""
    cluster = Cluster(tmp_path, etcd, 3, "--workers=2")
    try:
        # (The retry passes a hop to its home worker there, and may reach the copy's member
        # before its stream from the killed leader has closed: then it is judged on that
        # copy, which was settled, rather than refused; either way it is written once.)
        _retried_on_the_next_node(cluster, refused=False)
    finally:
        cluster.stop()


def _retried_on_the_next_node(cluster: Cluster, *, refused: bool = True) -> None:
    replicate(cluster)
    REFUSALS.clear()
    bodies = [b"r%04d" % i for i in range(120)]
    n1, n2 = cluster.node(1), cluster.node(2)
    for first in range(0, 60, 10):
        assert _idempotent_mpub(n1, bodies[first : first + 10], first)
    _idempotent_mpub(n1, bodies[60:70], 60, answer=False)

    def committed_on_n1() -> bool:
        doc = n1.json("GET", f"/topic/offsets?topic={TOPIC}")
        own = [q for q in doc["partitions"] if q["partition"] in n1.member_ids]
        return sum(q["committed"] for q in own) >= 70

    # Committed before the kill, its answer never read: the retry must find it in a copy
    # (the producer's home there holds one), not write it a second time.
    wait_for(committed_on_n1, "the unanswered MPUB committed on node 1")
    n1.kill()
    wait_for(lambda: _idempotent_mpub(n2, bodies[60:70], 60), "the retry on node 2 answered OK")
    # Refused (with the reason) while node 1's partition was being taken over.
    assert not refused or any("is being taken over" in r for r in REFUSALS), REFUSALS
    # The next publishes, each sent again while refused, as the refusal asks ("publish again":
    # with --workers another of node 1's partitions may still be being taken over; a loaded
    # run met that at the third): each answered OK in the end, and every body written once.
    for first in range(70, 120, 10):
        wait_for(
            lambda first=first: _idempotent_mpub(n2, bodies[first : first + 10], first),
            f"the MPUB from {first} answered OK on node 2 (the refusals: REFUSALS)",
        )
    n1.start()
    wait_for(lambda: n1.joined, "node 1 to join again", 60)
    for member in n1.member_ids:
        wait_in_sync(cluster, TOPIC, member)
    got = Counter(
        body
        for origin in cluster.origins
        for _, _, body in cluster.read_partition(TOPIC, origin, cluster.owner(origin))
    )
    assert sorted(got) == bodies and max(got.values()) == 1, [b for b, n in got.items() if n > 1]


def test_idempotent_publishes_to_every_node_at_once_are_never_refused_while_nothing_fails(
    cluster: Cluster,
) -> None:
    """Each node checks the copies it holds of the others' partitions for an identified
    publish; copies briefly behind their live leaders under load must not refuse it."""
    replicate(cluster)
    refusals: list[str] = []

    def publish(node: Node) -> None:
        assert node.proc is not None
        producer = f"writer-{node.node_id}"
        with Connection(f"{node.host}:{node.proc.port}").connect() as conn:
            for first in range(0, 1000, 20):
                bodies = [b"%s-%04d" % (producer.encode(), first + i) for i in range(20)]
                try:
                    conn.mpub(TOPIC, bodies, identity=(producer, first))
                except NsqError as err:
                    refusals.append(str(err))
                    return

    threads = [threading.Thread(target=publish, args=(n,)) for n in cluster.nodes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert refusals == []
    got = Counter(
        body
        for origin in (1, 2, 3)
        for _, _, body in cluster.read_partition(TOPIC, origin, cluster.node(origin))
    )
    assert len(got) == 3000 and max(got.values()) == 1
