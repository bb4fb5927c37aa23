"""The connector on a real Spark standalone cluster (a master and two workers with their own
executor JVMs and Python workers, the driver in client mode in a process of its own, all on
127.0.0.1), with real nsqd nodes found through nsqlookupd, under the faults users meet: a worker
and its executor killed mid-stream, an nsqd killed right after Spark planned a range on it, the
driver killed and restarted from its checkpoint. Log mode into a file sink is exactly-once;
channel mode at-least-once with nothing lost; the sink spreads its tasks and loses nothing."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ..waiting import until, wait_for
from .conftest import LookupdProcess
from .helpers import (
    Driver,
    Node,
    _numbered,
    _published,
    cluster,
    nodes,
    start_driver,
    storage_id,
    urlopen_post,
)
from .standalone import StandaloneCluster

pytestmark = pytest.mark.timeout(600)

__all__ = ["cluster", "nodes", "start_driver"]  # the fixtures, one cluster for this module


def test_a_batch_read_on_a_cluster_is_exact(
    spark: Any,
    cluster: StandaloneCluster,
    nodes: tuple[LookupdProcess, Node, Node],
    tmp_path: Path,
    start_driver: Callable[..., Driver],
) -> None:
    lookupd, a, b = nodes
    want = _published(a, b, "batch", 30_000)
    wait_for(lambda: len(lookupd.producers("batch")) == 2, "both nodes registered", 20)
    out = tmp_path / "out"
    # nsqlookupd with a scheme: it read 0 rows without an error in log mode.
    start_driver(
        tmp_path / "driver.log",
        "batch",
        f"http://{lookupd.http_address}",
        "batch",
        str(out),
        cluster=cluster,
    ).finish()
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.body for r in rows) == want
    assert {r.nsqd_address for r in rows} == {a.proc.http_address, b.proc.http_address}


def test_a_log_stream_rides_out_a_worker_a_node_and_the_driver_killed(
    spark: Any,
    cluster: StandaloneCluster,
    nodes: tuple[LookupdProcess, Node, Node],
    tmp_path: Path,
    start_driver: Callable[..., Driver],
) -> None:
    """Exactly-once into a file sink across: a worker and its executor killed mid-stream, an
    nsqd killed right after a batch with a range on it was planned (its task tries the node
    again until it is back: the query died of it), and the driver killed and restarted."""
    lookupd, a, b = nodes
    want = _published(a, b, "flow", 40_000)
    wait_for(lambda: len(lookupd.producers("flow")) == 2, "both nodes registered", 20)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = (lookupd.http_address, "flow", str(out), str(checkpoint))
    driver = start_driver(tmp_path / "first.log", "log", *args, cluster=cluster)
    commits, offsets = checkpoint / "commits", checkpoint / "offsets"
    done = driver.wait_committed(checkpoint, 1, "two batches")
    cluster.kill_worker(0)
    driver.wait_committed(checkpoint, done, "a batch on the other worker")
    cluster.start_worker(0)

    # Kill node a as soon as a batch that reads from it is planned (offsets/N written, its
    # tasks not yet done); the task retries it (logged in the executor's stderr) until it is
    # back. A task that won the race and finished first proves nothing: then again.
    key_a = storage_id(a.proc)
    retried = False
    for attempt in range(8):
        if driver.proc.poll() is not None:
            # Every batch ran before a kill landed on a task reading node a (a loaded
            # machine: each time the task finished first): more records, and the query again
            # from its checkpoint (availableNow reads to the end it finds at its start).
            driver.finish()
            for name, node in (("a", a), ("b", b)):
                more = [b"flow-%s-more%d-%06d" % (name.encode(), attempt, i) for i in range(12_000)]
                node.proc.publish("flow", more)
                want += more
            driver = start_driver(tmp_path / f"again{attempt}.log", "log", *args, cluster=cluster)
        seen = _numbered(offsets)

        def planned_on_a(seen: set[int] = seen, driver: Driver = driver) -> bool:
            if driver.proc.poll() is not None:
                return True  # it ran out of records first: topped up at the next turn
            for n in sorted(_numbered(offsets) - seen):
                if n in _numbered(commits):
                    continue
                end = json.loads((offsets / str(n)).read_text().splitlines()[-1])
                before = json.loads((offsets / str(n - 1)).read_text().splitlines()[-1])
                if end.get(key_a, 0) > before.get(key_a, 0):
                    return True
            return False

        wait_for(planned_on_a, "a batch planned with a range on node a", 120)
        if driver.proc.poll() is not None:
            continue
        a.kill()
        retrying = f"nsqd {a.proc.http_address} topic flow"
        retried = until(
            lambda retrying=retrying: any(
                retrying in line and "retrying" in line
                for line in cluster.executor_logs().splitlines()
            ),
            20,
        )
        a.start()
        if retried:
            break
    assert retried, "no task was reading node a when it was killed"

    driver.wait_committed(checkpoint, len(_numbered(commits)), "a batch after node a came back")
    driver.kill()
    assert len(_numbered(commits)) < len(want) // 4000  # mid-query (4,000 records a batch)
    start_driver(tmp_path / "second.log", "log", *args, cluster=cluster).finish()
    rows = spark.read.parquet(str(out)).collect()
    got = sorted(r.body for r in rows)
    dupes = [k for k, v in Counter(got).items() if v > 1]
    lost = len(set(want) - set(got))
    assert dupes == [] and got == sorted(want), f"{lost} lost, {len(dupes)} twice"


def test_a_channel_stream_loses_nothing_across_a_driver_kill(
    spark: Any,
    cluster: StandaloneCluster,
    nodes: tuple[LookupdProcess, Node, Node],
    tmp_path: Path,
    start_driver: Callable[..., Driver],
) -> None:
    lookupd, a, b = nodes
    for n in (a, b):  # the channel first, so that it gets every message
        urlopen_post(n.proc.http_address, "/topic/create?topic=chan")
        urlopen_post(n.proc.http_address, "/channel/create?topic=chan&channel=spark")
    want = _published(a, b, "chan", 20_000)
    wait_for(lambda: len(lookupd.producers("chan")) == 2, "both nodes registered", 20)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = (lookupd.http_address, "chan", str(out), str(checkpoint))
    driver = start_driver(tmp_path / "first.log", "channel", *args, cluster=cluster)
    driver.wait_committed(checkpoint, 1, "two batches")
    driver.kill()
    start_driver(tmp_path / "second.log", "channel", *args, cluster=cluster).finish()
    got = [r.body for r in spark.read.parquet(str(out)).collect()]
    assert set(want) - set(got) == set(), "acknowledged messages lost"
    assert set(got) <= set(want)


def test_the_sink_spreads_its_tasks_over_the_nodes_and_loses_nothing(
    cluster: StandaloneCluster,
    nodes: tuple[LookupdProcess, Node, Node],
    tmp_path: Path,
    start_driver: Callable[..., Driver],
) -> None:
    lookupd, a, b = nodes
    start_driver(
        tmp_path / "driver.log", "sink", lookupd.http_address, "sunk", "40000", cluster=cluster
    ).finish()
    counts = [(n.proc.topic_stats("sunk") or {}).get("message_count", 0) for n in (a, b)]
    assert counts == [20_000, 20_000]
