"""Helpers shared by the Spark tests (a test module imports no other test module): ports,
nodes and consumers, log-mode queries and their sinks, the standalone cluster's nodes and driver,
and its module-scoped fixtures (``cluster``, ``nodes``: a module that uses them imports them)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pynsqd.client.connection import Connection

from ..integration.replication_harness import Cluster
from ..processes import free_port
from ..waiting import wait_for
from .conftest import LookupdProcess, NsqdProcess, java_missing
from .standalone import StandaloneCluster


def consume_all(nsqd: NsqdProcess, topic: str, n: int) -> list[bytes]:
    got: list[bytes] = []
    lock = threading.Lock()

    def on_messages(
        c: Connection, ts: Any, att: Any, ids: list[bytes], bodies: list[bytes]
    ) -> None:
        with lock:
            got.extend(bodies)
        c.fin_many(ids)

    with Connection(nsqd.tcp_address).connect() as conn:
        conn.subscribe(topic, "check", on_messages, rdy=2500)
        wait_for(lambda: len(got) >= n, f"{n} messages on {topic}", 30)
    return got


def storage_id(node: NsqdProcess) -> str:
    with urllib.request.urlopen(f"http://{node.http_address}/info", timeout=5) as r:
        return str(json.loads(r.read())["storage_id"])


def retained(start_nsqd: Callable[..., NsqdProcess], *args: str) -> NsqdProcess:
    return start_nsqd("--retention-time=1h", *args)


def to_parquet(df: Any, out: Path, checkpoint: Path) -> Any:
    """A log-mode stream's offsets and bodies into Parquet at ``out`` (the exactly-once file
    sink the tests read back), started."""
    return (
        df.select("offset", "body")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .start()
    )


def log_stream(spark: Any, addresses: str, topic: str = "t", **options: str) -> Any:
    """``readStream`` in log mode over ``addresses`` (nsqd HTTP), loaded."""
    reader = (
        spark.readStream.format("nsq")
        .option("mode", "log")
        .option("topic", topic)
        .option("nsqdHttpAddresses", addresses)
    )
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


TOPIC = "orders"


def publish(cluster: Cluster, prefix: str, count: int) -> list[bytes]:
    """``count`` bodies to each live node (its own partition), each MPUB acknowledged (acks=all:
    on every in-sync copy)."""
    out = []
    for n in cluster.live():
        assert n.proc is not None
        bodies = [b"%s-%d-%05d" % (prefix.encode(), n.node_id, i) for i in range(count)]
        with Connection(f"127.0.0.1:{n.proc.port}").connect() as c:
            for i in range(0, count, 500):
                c.mpub(TOPIC, bodies[i : i + 500])
        out += bodies
    return out


#: A guard against a hang for a streaming query's progress (not a timing): beside two busy
#: loops a query took over 150 s to deliver 1,000 rows in batches of 100 (2026-11-30).
QUERY_TIMEOUT = 240


def run_available_now(df: Any, sink: Callable[[Any, int], None], checkpoint: Path) -> Any:
    """A streaming query into ``sink`` (foreachBatch) with trigger availableNow, to its end."""
    q = (
        df.writeStream.foreachBatch(sink)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(checkpoint))
        .start()
    )
    try:
        assert q.awaitTermination(QUERY_TIMEOUT), "query did not end"
    finally:
        q.stop()
    assert q.exception() is None, q.exception()
    return q


class Collector:
    """A foreachBatch sink: keeps the rows of every batch that returned normally."""

    def __init__(self, fail_on_batch: int | None = None) -> None:
        self.rows: list[Any] = []
        #: (batch id, rows, partitions, distinct nsqd nodes)
        self.batches: list[tuple[int, int, int, int]] = []
        self.fail_on_batch = fail_on_batch
        self.lock = threading.Lock()

    def __call__(self, df: Any, batch_id: int) -> None:
        rows = df.collect()
        parts = df.rdd.getNumPartitions()
        data_batches = sum(1 for b in self.batches if b[1])
        if rows and self.fail_on_batch is not None and data_batches + 1 == self.fail_on_batch:
            raise RuntimeError("injected failure in the middle of a batch")
        with self.lock:
            self.rows.extend(rows)
            nodes = len({r.nsqd_address for r in rows})
            self.batches.append((batch_id, len(rows), parts, nodes))

    def ids(self) -> set[tuple[str, str]]:
        with self.lock:
            return {(r.nsqd_address, r.message_id) for r in self.rows}


def read_stream(spark: Any, **options: str) -> Any:
    reader = spark.readStream.format("nsq")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


class Node:
    """An nsqd on fixed ports (so that it comes back where Spark planned to read it)."""

    def __init__(self, data: Path, lookupd: LookupdProcess) -> None:
        self.data = data
        for attempt in range(3):
            # Ports free when chosen; another process (a JVM's, say) may bind one first: then
            # new ones (a CI run under load lost all five standalone tests to that once).
            self.args = (
                "--retention-time=1h",
                f"--tcp-address=127.0.0.1:{free_port()}",
                f"--http-address=127.0.0.1:{free_port()}",
                f"--lookupd-tcp-address={lookupd.tcp_address}",
                "--broadcast-address=127.0.0.1",
            )
            try:
                self.proc = NsqdProcess(data, *self.args)
                break
            except RuntimeError as err:
                if "address already in use" not in str(err) or attempt == 2:
                    raise

    def kill(self) -> None:
        self.proc.proc.kill()
        self.proc.proc.wait()
        self.proc.stop()

    def start(self) -> None:
        self.proc = NsqdProcess(self.data, *self.args)


class Driver:
    """``cluster_query.py`` (a Spark driver of its own) in its own process group, so that kill -9
    takes its JVM too: on the standalone ``cluster`` when given, else in local mode. Made through
    the ``start_driver`` fixture, which kills it after the test whatever happened."""

    def __init__(
        self, log: Path, job: str, *args: str, cluster: StandaloneCluster | None = None
    ) -> None:
        self.log = log
        if cluster is not None:
            master, env = cluster.master_url, {**cluster.env}
        else:
            master = "local[2]"
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        with open(log, "ab") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(DRIVER), master, job, *args],
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

    def wait_committed(self, checkpoint: Path, past: int, what: str, timeout: float = 300) -> int:
        """Wait (a guard of ``timeout`` s, generous: a driver's JVM starts slowly on a loaded
        machine) until the query has committed more than ``past`` batches; the count."""
        commits = checkpoint / "commits"
        try:
            wait_for(lambda: self.running() and len(_numbered(commits)) > past, what, timeout)
        except BaseException:
            # Its log in the test's output: the rerun rule (tests/spark/conftest.py) reads it.
            print(self.tail(), file=sys.stderr)
            raise
        return len(_numbered(commits))

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def finish(self, timeout: float = 300) -> None:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            print(self.tail(), file=sys.stderr)
            raise
        assert code == 0, self.tail()


@pytest.fixture
def start_driver() -> Iterator[Callable[..., Driver]]:
    """Start drivers (``Driver``'s arguments); each is killed after the test if still running."""
    started: list[Driver] = []

    def start(log: Path, job: str, *args: str, cluster: StandaloneCluster | None = None) -> Driver:
        started.append(Driver(log, job, *args, cluster=cluster))
        return started[-1]

    yield start
    for driver in started:
        driver.kill()


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


def urlopen_post(http: str, path: str) -> None:
    import urllib.request

    req = urllib.request.Request(f"http://{http}{path}", data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=5):
        pass


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


DRIVER = Path(__file__).with_name("cluster_query.py")
