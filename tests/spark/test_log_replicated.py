"""Log mode on a replicated topic (real Spark local[2], real etcd, three pynsqd nodes): offsets
keyed by partition, not by node; each range read from any in-sync copy; a leader killed
mid-query changes nothing the query writes (exactly-once into a file sink)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pynsqd_spark.log_source import fetch
from pynsqd_spark.options import LogOptions

from ..integration.replication_harness import Cluster, Etcd, replicate, wait_in_sync, wait_leader
from ..waiting import wait_for
from .helpers import TOPIC, Driver, log_stream, publish, start_driver, to_parquet

#: Queries across kills of leaders and the driver, on a loaded machine: minutes, not seconds.
pytestmark = pytest.mark.timeout(450)

__all__ = ["start_driver"]  # the fixture


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    etcd = Etcd(tmp_path)
    try:
        c = Cluster(tmp_path, etcd, 3)
        try:
            replicate(c, TOPIC)
            yield c
        finally:
            c.stop()
    finally:
        etcd.stop()


def http_addresses(cluster: Cluster) -> str:
    return ",".join(f"127.0.0.1:{n.proc.http_port}" for n in cluster.live() if n.proc)


def test_partitions_are_read_once_from_any_copy(spark: Any, cluster: Cluster) -> None:
    """Three nodes each hold all three partitions: given one node, a batch read finds the
    others through it and reads each partition once (keyed ``test/<origin>``), its tasks
    spread over the copies."""
    want = publish(cluster, "a", 1000)
    one = cluster.node(2)
    assert one.proc is not None
    df = (
        spark.read.format("nsq")
        .option("mode", "log")
        .option("topic", TOPIC)
        .option("nsqdHttpAddresses", f"127.0.0.1:{one.proc.http_port}")
        .option("minPartitions", "9")
        .load()
    )
    rows = df.select("body", "nsqd_address").collect()
    assert sorted(r.body for r in rows) == sorted(want)
    assert len({r.nsqd_address for r in rows}) == 3  # reads spread over the copies


def test_nodes_of_two_workers_are_read_once_member_by_member(spark: Any, tmp_path: Path) -> None:
    """Issue 52 item 2: three nodes of ``--workers 2``, every worker a member with its own
    partition (six: 10, 11, 20, 21, 30, 31). Publishes over connections open at once land on
    both workers of each node; given one node, a batch read finds every member's partition
    through the node's answer (each copy named by its member) and reads each record once."""
    from pynsqd.client.connection import Connection

    etcd = Etcd(tmp_path)
    try:
        c = Cluster(tmp_path, etcd, 3, "--workers=2")
        try:
            replicate(c, TOPIC)
            want: list[bytes] = []
            for n in c.nodes:
                assert n.proc is not None
                conns = [Connection(f"127.0.0.1:{n.proc.port}").connect() for _ in range(4)]
                try:  # open at once: they spread over the node's two workers
                    for i, conn in enumerate(conns):
                        bodies = [b"w-%d-%d-%04d" % (n.node_id, i, j) for j in range(100)]
                        conn.mpub(TOPIC, bodies)
                        want += bodies
                finally:
                    for conn in conns:
                        conn.close()
            one = c.node(2)
            assert one.proc is not None
            held = one.json("GET", f"/topic/offsets?topic={TOPIC}")["partitions"]
            assert sorted(q["partition"] for q in held) == c.origins

            def every_member_took_some() -> bool:  # (a follower learns its HW as it fetches)
                held = one.json("GET", f"/topic/offsets?topic={TOPIC}")["partitions"]
                return all(q["committed"] > 0 for q in held)

            wait_for(every_member_took_some, "every member's partition committed on node 2", 60)
            df = (
                spark.read.format("nsq")
                .option("mode", "log")
                .option("topic", TOPIC)
                .option("nsqdHttpAddresses", f"127.0.0.1:{one.proc.http_port}")
                .load()
            )
            rows = df.select("body").collect()
            assert sorted(r.body for r in rows) == sorted(want)  # each once
        finally:
            c.stop()
    finally:
        etcd.stop()


def test_a_range_is_read_from_another_copy_when_the_leader_is_gone(cluster: Cluster) -> None:
    want = publish(cluster, "b", 700)
    leader = cluster.node(1)
    assert leader.proc is not None
    first = f"127.0.0.1:{leader.proc.http_port}"
    copies = tuple(f"127.0.0.1:{n.proc.http_port}" for n in cluster.nodes if n.proc)
    leader.kill()
    opts = LogOptions.parse({"topic": TOPIC, "nsqdHttpAddresses": first})
    got = [r[4] for r in fetch(first, opts, 0, 700, "test/1", copies, 1)]
    assert got == [b for b in want if b.startswith(b"b-1-")]


def test_a_stream_goes_on_across_a_leader_kill_exactly_once(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    want = publish(cluster, "c", 900)
    addresses = http_addresses(cluster)  # node 1 comes back elsewhere: its copies are found
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    df = log_stream(spark, addresses, TOPIC, maxOffsetsPerTrigger="600")
    query = to_parquet(df, out, checkpoint)
    try:
        query.processAllAvailable()
        ends = json.loads(query.lastProgress["sources"][0]["endOffset"])
        assert sorted(ends) == ["test/1", "test/2", "test/3"]  # keyed by partition
        want += publish(cluster, "d", 500)
        cluster.node(1).kill()  # the leader of partition 1, with 500 records not yet read
        assert wait_leader(cluster, TOPIC, 1)["node"] != 1
        query.processAllAvailable()
        assert query.exception() is None
        cluster.node(1).start()
        wait_in_sync(cluster, TOPIC, 1)
        want += publish(cluster, "e", 300)
        query.processAllAvailable()
        # Issue 55 item 4: the nodes show the query as a reader of every partition, caught up
        # (each copy it reported its commits to: the partition's leader when it was planned).
        wait_for(lambda: _reader_lags(cluster) == {1: 0, 2: 0, 3: 0}, "the query's lag", 60)
    finally:
        query.stop()
    got = [r.body for r in spark.read.parquet(str(out)).collect()]
    twice = [b for b, k in Counter(got).items() if k > 1]
    assert twice == [] and sorted(got) == sorted(want), f"{len(set(want) - set(got))} missing"


def _reader_lags(cluster: Cluster) -> dict[int, int]:
    """The query's lag on each partition, as the nodes' /stats show it (the freshest report
    of each partition, wherever it went)."""
    latest: dict[int, tuple[float, int]] = {}
    for n in cluster.live():
        status, body = n.http("GET", f"/stats?format=json&topic={TOPIC}")
        if status != 200:
            continue
        for t in json.loads(body).get("topics") or []:
            for p in (t.get("replication") or {}).get("partitions") or []:
                for r in p.get("readers") or []:
                    if r["reader"].startswith(f"spark-{TOPIC}-"):
                        at, _ = latest.get(p["partition"], (-1.0, 0))
                        if r["updated"] > at:
                            latest[p["partition"]] = (r["updated"], r["lag"])
    return {k: lag for k, (_, lag) in sorted(latest.items())}


@pytest.mark.timeout(900)
def test_two_leaders_and_the_driver_killed_mid_query_exactly_once(
    spark: Any, cluster: Cluster, start_driver: Callable[..., Driver], tmp_path: Path
) -> None:
    """The leader of partition 1 killed mid-query, then the driver (kill -9 of its process
    group), then the leader of partition 2 before the query is started again: every record
    once in the file sink."""
    want = publish(cluster, "k", 2000)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = ("nodes", http_addresses(cluster), TOPIC, str(out), str(checkpoint))
    first = start_driver(tmp_path / "first.log", *args)
    done = first.wait_committed(checkpoint, 1, "two batches")
    cluster.node(1).kill()
    assert wait_leader(cluster, TOPIC, 1)["node"] != 1
    done = first.wait_committed(checkpoint, done + 1, "two more batches")
    first.kill()
    assert done < 12  # killed mid-query (6000 records, 500 a batch)
    cluster.node(2).kill()
    assert wait_leader(cluster, TOPIC, 2)["node"] == 3
    start_driver(tmp_path / "second.log", *args).finish()
    got = Counter(r.body for r in spark.read.parquet(str(out)).select("body").collect())
    assert [b for b, k in got.items() if k > 1] == []
    assert sorted(got) == sorted(want)
