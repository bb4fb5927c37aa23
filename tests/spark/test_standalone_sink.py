"""The nsq sink's exactly-once writes on a real Spark standalone cluster (``test_standalone.py``'s
set-up: a master, two workers with their own executor JVMs, the driver in a process of its own,
nsqd nodes found through nsqlookupd), in that file's lane (``tests/conftest.py``), after it, with
a cluster of its own: a log-mode stream into the sink across a worker killed, a task that fails
after it published part of its rows, and the driver killed and restarted."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from ..waiting import wait_for
from .conftest import LookupdProcess
from .helpers import Driver, Node, _numbered, _published, cluster, nodes, start_driver
from .standalone import StandaloneCluster

pytestmark = pytest.mark.timeout(900)

__all__ = ["cluster", "nodes", "start_driver"]  # the fixtures, one cluster for this module


def test_log_to_nsq_is_exactly_once_across_a_worker_a_failed_task_and_the_driver_killed(
    cluster: StandaloneCluster,
    nodes: tuple[LookupdProcess, Node, Node],
    tmp_path: Path,
    start_driver: Callable[..., Driver],
) -> None:
    """A stream from one topic (log mode) into another through the nsq sink: a worker and its
    executor killed mid-stream, a task failing once after the sink published part of its rows,
    the driver killed and restarted from its checkpoint. The output holds each row once."""
    lookupd, a, b = nodes
    want = _published(a, b, "relayin", 20_000)
    wait_for(lambda: len(lookupd.producers("relayin")) == 2, "both nodes registered", 20)
    checkpoint, marker = tmp_path / "checkpoint", tmp_path / "failed-once"
    fail_on = "relayin-b-005555"  # in the middle of node b's second batch
    args = (lookupd.http_address, "relayin", "relayout", str(checkpoint), fail_on, str(marker))
    driver = start_driver(tmp_path / "first.log", "relay", *args, cluster=cluster)
    commits = checkpoint / "commits"
    # The first batch waits on the driver's JVM, the executors' and their Python workers: the
    # longest start of the test on a loaded machine (a guard, not a synchronisation).
    done = driver.wait_committed(checkpoint, 0, "a batch", timeout=480)
    cluster.kill_worker(0)
    driver.wait_committed(checkpoint, done, "a batch on the other worker")
    cluster.start_worker(0)
    wait_for(lambda: driver.running() and marker.exists(), "the task that fails once", 240)
    driver.wait_committed(checkpoint, len(_numbered(commits)), "a batch after the failed task")
    driver.kill()
    # Mid-query: 40,000 records are 10 batches (with 5, a loaded machine's last poll came
    # after the query had finished).
    assert len(_numbered(commits)) < 10
    start_driver(tmp_path / "second.log", "relay", *args, cluster=cluster).finish()
    got: list[bytes] = []
    dropped = 0
    for n in (a, b):
        got += [r.body for r in n.proc.log_records("relayout")]
        dropped += ((n.proc.topic_stats("relayout") or {}).get("log") or {})["duplicate_count"]
    dupes = [k for k, v in Counter(got).items() if v > 1]
    assert dupes == [] and sorted(got) == want, (
        f"{len(set(want) - set(got))} lost, {len(dupes)} twice"
    )
    # The retries did send rows that were already written: recognised, not written again.
    assert dropped > 0
