"""The connector on a real Spark standalone cluster (a master and two workers with their own
executor JVMs and Python workers, the driver in client mode in a process of its own, all on
127.0.0.1), with real nsqd nodes found through nsqlookupd, under the faults users meet: a worker
and its executor killed mid-stream, an nsqd killed right after Spark planned a range on it, the
driver killed and restarted from its checkpoint. Log mode into a file sink is exactly-once;
channel mode at-least-once with nothing lost; the sink spreads its tasks and loses nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ..waiting import until, wait_for
from .conftest import LookupdProcess, NsqdProcess, java_missing
from .standalone import StandaloneCluster
from .test_client import free_port
from .test_log_mode import storage_id

pytestmark = pytest.mark.timeout(600)

DRIVER = Path(__file__).with_name("cluster_query.py")


class Node:
    """An nsqd on fixed ports (so that it comes back where Spark planned to read it)."""

    def __init__(self, data: Path, lookupd: LookupdProcess) -> None:
        self.data = data
        self.args = (
            "--retention-time=1h",
            f"--tcp-address=127.0.0.1:{free_port()}",
            f"--http-address=127.0.0.1:{free_port()}",
            f"--lookupd-tcp-address={lookupd.tcp_address}",
            "--broadcast-address=127.0.0.1",
        )
        self.proc = NsqdProcess(data, *self.args)

    def kill(self) -> None:
        self.proc.proc.kill()
        self.proc.proc.wait()
        self.proc.stop()

    def start(self) -> None:
        self.proc = NsqdProcess(self.data, *self.args)


class Driver:
    """``cluster_query.py`` against the cluster, in its own process group (kill -9 takes its
    JVM too)."""

    def __init__(self, cluster: StandaloneCluster, log: Path, job: str, *args: str) -> None:
        self.log = log
        env = {**cluster.env}
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(DRIVER), cluster.master_url, job, *args],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=err,
                start_new_session=True,
            )

    def running(self) -> bool:
        if self.proc.poll() is None:
            return True
        raise AssertionError(f"the driver exited {self.proc.returncode}:\n{self.tail()}")

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def finish(self, timeout: float = 300) -> None:
        assert self.proc.wait(timeout) == 0, self.tail()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    reason = java_missing()
    if reason is not None:
        pytest.skip(reason)
    c = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone")).start()
    yield c
    assert c.stop() == []


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LookupdProcess, Node, Node]]:
    base = tmp_path_factory.mktemp("nsq")
    lookupd = LookupdProcess(base / "nsqlookupd.log")
    a = b = None
    try:
        a, b = Node(base / "a", lookupd), Node(base / "b", lookupd)
        yield lookupd, a, b
    finally:
        for n in (a, b):
            if n is not None:
                n.proc.stop()
        lookupd.stop()


def _published(a: Node, b: Node, topic: str, count: int) -> list[bytes]:
    bodies = []
    for name, node in (("a", a), ("b", b)):
        mine = [b"%s-%s-%06d" % (topic.encode(), name.encode(), i) for i in range(count)]
        node.proc.publish(topic, mine)
        bodies += mine
    return sorted(bodies)


def _numbered(directory: Path) -> set[int]:
    return (
        {int(p.name) for p in directory.glob("*") if p.name.isdigit()}
        if directory.is_dir()
        else set()
    )


def test_a_batch_read_on_a_cluster_is_exact(
    spark: Any, cluster: StandaloneCluster, nodes: tuple[LookupdProcess, Node, Node], tmp_path: Path
) -> None:
    lookupd, a, b = nodes
    want = _published(a, b, "batch", 30_000)
    wait_for(lambda: len(lookupd.producers("batch")) == 2, "both nodes registered", 20)
    out = tmp_path / "out"
    # nsqlookupd with a scheme: it read 0 rows without an error in log mode.
    Driver(
        cluster,
        tmp_path / "driver.log",
        "batch",
        f"http://{lookupd.http_address}",
        "batch",
        str(out),
    ).finish()
    rows = spark.read.parquet(str(out)).collect()
    assert sorted(r.body for r in rows) == want
    assert {r.nsqd_address for r in rows} == {a.proc.http_address, b.proc.http_address}


def test_a_log_stream_rides_out_a_worker_a_node_and_the_driver_killed(
    spark: Any, cluster: StandaloneCluster, nodes: tuple[LookupdProcess, Node, Node], tmp_path: Path
) -> None:
    """Exactly-once into a file sink across: a worker and its executor killed mid-stream, an
    nsqd killed right after a batch with a range on it was planned (its task tries the node
    again until it is back: the query died of it), and the driver killed and restarted."""
    lookupd, a, b = nodes
    want = _published(a, b, "flow", 40_000)
    wait_for(lambda: len(lookupd.producers("flow")) == 2, "both nodes registered", 20)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = (lookupd.http_address, "flow", str(out), str(checkpoint))
    driver = Driver(cluster, tmp_path / "first.log", "log", *args)
    commits, offsets = checkpoint / "commits", checkpoint / "offsets"

    def committed_past(n: int) -> Callable[[], bool]:
        return lambda: driver.running() and len(_numbered(commits)) > n

    wait_for(committed_past(1), "two batches", 240)
    cluster.kill_worker(0)
    wait_for(committed_past(len(_numbered(commits))), "a batch on the other worker", 120)
    cluster.start_worker(0)

    # Kill node a as soon as a batch that reads from it is planned (offsets/N written, its
    # tasks not yet done); the task retries it (logged in the executor's stderr) until it is
    # back. A task that won the race and finished first proves nothing: then again.
    key_a = storage_id(a.proc)
    retried = False
    for _ in range(5):
        seen = _numbered(offsets)

        def planned_on_a(seen: set[int] = seen) -> bool:
            driver.running()
            for n in sorted(_numbered(offsets) - seen):
                if n in _numbered(commits):
                    continue
                end = json.loads((offsets / str(n)).read_text().splitlines()[-1])
                before = json.loads((offsets / str(n - 1)).read_text().splitlines()[-1])
                if end.get(key_a, 0) > before.get(key_a, 0):
                    return True
            return False

        wait_for(planned_on_a, "a batch planned with a range on node a", 120)
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

    wait_for(committed_past(len(_numbered(commits))), "a batch after node a came back", 120)
    driver.kill()
    assert len(_numbered(commits)) < 20  # mid-query: 80,000 records are 20 batches
    Driver(cluster, tmp_path / "second.log", "log", *args).finish()
    rows = spark.read.parquet(str(out)).collect()
    got = sorted(r.body for r in rows)
    dupes = [k for k, v in Counter(got).items() if v > 1]
    assert dupes == [] and got == want, f"{len(set(want) - set(got))} lost, {len(dupes)} twice"


def test_a_channel_stream_loses_nothing_across_a_driver_kill(
    spark: Any, cluster: StandaloneCluster, nodes: tuple[LookupdProcess, Node, Node], tmp_path: Path
) -> None:
    lookupd, a, b = nodes
    for n in (a, b):  # the channel first, so that it gets every message
        urlopen_post(n.proc.http_address, "/topic/create?topic=chan")
        urlopen_post(n.proc.http_address, "/channel/create?topic=chan&channel=spark")
    want = _published(a, b, "chan", 20_000)
    wait_for(lambda: len(lookupd.producers("chan")) == 2, "both nodes registered", 20)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = (lookupd.http_address, "chan", str(out), str(checkpoint))
    driver = Driver(cluster, tmp_path / "first.log", "channel", *args)
    wait_for(
        lambda: driver.running() and len(_numbered(checkpoint / "commits")) > 1, "two batches", 240
    )
    driver.kill()
    Driver(cluster, tmp_path / "second.log", "channel", *args).finish()
    got = [r.body for r in spark.read.parquet(str(out)).collect()]
    assert set(want) - set(got) == set(), "acknowledged messages lost"
    assert set(got) <= set(want)


def test_the_sink_spreads_its_tasks_over_the_nodes_and_loses_nothing(
    cluster: StandaloneCluster, nodes: tuple[LookupdProcess, Node, Node], tmp_path: Path
) -> None:
    lookupd, a, b = nodes
    Driver(cluster, tmp_path / "driver.log", "sink", lookupd.http_address, "sunk", "40000").finish()
    counts = [(n.proc.topic_stats("sunk") or {}).get("message_count", 0) for n in (a, b)]
    assert counts == [20_000, 20_000]


def urlopen_post(http: str, path: str) -> None:
    import urllib.request

    req = urllib.request.Request(f"http://{http}{path}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=5):
        pass
