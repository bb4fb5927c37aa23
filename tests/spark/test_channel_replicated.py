"""Channel mode on a replicated topic (real Spark local[2], real etcd, three pynsqd nodes behind a
real nsqlookupd): the query reads the channel through nsqlookupd; the node holding a third of
the backlog is killed mid-query; the node that takes its partition over delivers what its channel
had not finished, and the query, never restarted, ends up with every acknowledged message at
least once (channel mode's promise; duplicates are counted, not failed)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..integration.replication_harness import (
    Cluster,
    Etcd,
    checkpoint,
    replicate,
    wait_in_sync,
    wait_leader,
)
from ..waiting import wait_for
from .conftest import LookupdProcess
from .helpers import TOPIC, Collector, publish, read_stream

pytestmark = pytest.mark.timeout(600)


@pytest.fixture
def cluster(tmp_path: Path, lookupd: LookupdProcess) -> Iterator[Cluster]:
    etcd = Etcd(tmp_path)
    try:
        c = Cluster(
            tmp_path,
            etcd,
            3,
            f"--lookupd-tcp-address={lookupd.tcp_address}",
            "--broadcast-address=127.0.0.1",
        )
        try:
            replicate(c, TOPIC)
            for n in c.nodes:
                assert n.http("POST", f"/channel/create?topic={TOPIC}&channel=spark")[0] == 200
            for n in c.nodes:
                wait_for(lambda n=n: "spark" in checkpoint(n, n.node_id), "a checkpoint")
            yield c
        finally:
            c.stop()
    finally:
        etcd.stop()


def test_a_channel_stream_loses_nothing_across_a_leader_kill(
    spark: Any, cluster: Cluster, lookupd: LookupdProcess, tmp_path: Path
) -> None:
    want = publish(cluster, "a", 600)
    sink = Collector()
    df = read_stream(
        spark,
        topic=TOPIC,
        channel="spark",
        nsqlookupdHttpAddresses=lookupd.http_address,
        lookupdPollIntervalMs="1000",
        maxMessagesPerBatch="300",
    )
    query = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )

    def bodies() -> set[bytes]:
        with sink.lock:
            return {r.body for r in sink.rows}

    try:
        wait_for(lambda: len(bodies()) >= 300, "the query under way", 120)
        cluster.node(1).kill()  # with most of its 600 not yet read
        assert wait_leader(cluster, TOPIC, 1)["node"] != 1
        want += publish(cluster, "b", 300)  # to the two live nodes
        wait_for(lambda: set(want) <= bodies(), "every acknowledged message", 120)
        cluster.node(1).start()
        wait_in_sync(cluster, TOPIC, 1)
        want += publish(cluster, "c", 300)
        wait_for(lambda: set(want) <= bodies(), "every message after the node is back", 120)
        assert query.exception() is None
    finally:
        query.stop()
    with sink.lock:
        got = Counter(r.body for r in sink.rows)
    assert not set(got) - set(want)
    print(f"{len(want)} acknowledged, {sum(got.values()) - len(got)} delivered twice")
