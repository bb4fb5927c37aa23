"""Log mode on real Spark (local[2]) and real nodes: which log a node is (its storage id, not
the address that reached it), how nodes are found (nsqlookupd in every address form, auto
mode), the auth secret from the environment, and a read that rides out a restarting node."""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pynsqd_spark.log_source import NsqReadError, fetch
from pynsqd_spark.options import LogOptions
from tests.integration.secure_client import AuthServer

from ..processes import free_port
from ..waiting import wait_for
from .conftest import TEST_SECRET_ENV, LookupdProcess, NsqdProcess
from .helpers import log_stream, storage_id, to_parquet


def read(spark: Any, **options: str) -> Any:
    reader = spark.read.format("nsq")
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


def registered(lookupd: LookupdProcess, topic: str, count: int) -> None:
    wait_for(lambda: len(lookupd.producers(topic)) >= count, f"{count} nsqd registered {topic}")


def test_a_node_reached_by_two_names_is_read_once(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], lookupd: LookupdProcess
) -> None:
    """localhost:P and 127.0.0.1:P are one node: its records once, not twice (they were read
    twice when the offsets were keyed by the address)."""
    node = start_nsqd(
        "--retention-time=1h",
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        "--broadcast-address=127.0.0.1",
    )
    node.publish("t", [b"r%03d" % i for i in range(120)])
    registered(lookupd, "t", 1)
    port = node.http_address.rpartition(":")[2]
    rows = read(
        spark,
        mode="log",
        topic="t",
        nsqdHttpAddresses=f"localhost:{port},127.0.0.1:{port}",
        nsqlookupdHttpAddresses=lookupd.http_address,  # lists it as 127.0.0.1:P again
    ).collect()
    assert sorted(r.offset for r in rows) == list(range(120))


def test_a_node_at_a_new_address_goes_on_where_the_query_was(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], tmp_path: Path
) -> None:
    """The node restarted on another port (its broadcast address changed): the query goes on
    from its checkpoint instead of reading that log again from its earliest offset."""
    data = tmp_path / "moving"
    node = NsqdProcess(data, "--retention-time=1h")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run(address: str) -> None:
        query = to_parquet(log_stream(spark, address), out, checkpoint)
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    try:
        node.publish("t", [b"a%03d" % i for i in range(150)])
        run(node.http_address)
        first = node.http_address
        node.stop()
        node = NsqdProcess(data, "--retention-time=1h")  # new ports, same data directory
        assert node.http_address != first
        node.publish("t", [b"b%03d" % i for i in range(50)])
        run(node.http_address)
    finally:
        node.stop()
    offsets = sorted(r.offset for r in spark.read.parquet(str(out)).collect())
    assert offsets == list(range(200))  # none read twice


def test_two_processes_with_one_storage_id_are_refused(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], tmp_path: Path
) -> None:
    """A data directory copied to make a second node copies its identity, not its log: the
    query refuses them (naming both) instead of reading one and skipping the other."""
    first = NsqdProcess(tmp_path / "one", "--retention-time=1h")
    first.publish("t", [b"x"] * 10)
    first.stop()
    shutil.copytree(tmp_path / "one", tmp_path / "two")
    a = NsqdProcess(tmp_path / "one", "--retention-time=1h")
    b = NsqdProcess(tmp_path / "two", "--retention-time=1h")
    try:
        assert storage_id(a) == storage_id(b)
        both = f"{a.http_address},{b.http_address}"
        with pytest.raises(Exception, match=r"both answer with storage id .* own --data-path"):
            read(spark, mode="log", topic="t", nsqdHttpAddresses=both).count()
    finally:
        a.stop()
        b.stop()


def test_nsqlookupd_with_a_scheme_reads_everything_and_one_down_is_an_error(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], lookupd: LookupdProcess
) -> None:
    node = start_nsqd(
        "--retention-time=1h",
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        "--broadcast-address=127.0.0.1",
    )
    node.publish("t", [b"s"] * 40)
    registered(lookupd, "t", 1)
    for form in (lookupd.http_address, f"http://{lookupd.http_address}"):
        df = read(spark, mode="log", topic="t", nsqlookupdHttpAddresses=form)
        assert df.count() == 40, form
    # No lookupd answers: not "no data" (0 rows), an error naming the option.
    down = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(Exception, match=r"nsqlookupdHttpAddresses.*no nsqlookupd answered"):
        read(spark, mode="log", topic="t", nsqlookupdHttpAddresses=down).count()


def test_auto_mode_asks_the_nodes_nsqlookupd_names(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], lookupd: LookupdProcess
) -> None:
    """The usual NSQ set-up names only nsqlookupd: auto mode reads the log of the nodes it
    lists (it fell back to channel mode, and batch reads failed pointing at the wrong option)."""
    flags = (f"--lookupd-tcp-address={lookupd.tcp_address}", "--broadcast-address=127.0.0.1")
    a = start_nsqd("--retention-time=1h", *flags)
    b = start_nsqd("--retention-time=1h", *flags)
    a.publish("t", [b"a"] * 30)
    b.publish("t", [b"b"] * 20)
    registered(lookupd, "t", 2)
    df = read(spark, topic="t", nsqlookupdHttpAddresses=lookupd.http_address)
    assert "offset" in df.columns and df.count() == 50
    # A node without retention: the batch read says which and why, not "use nsqdHttpAddresses".
    c = start_nsqd(*flags)
    c.publish("t", [b"c"])
    registered(lookupd, "t", 3)
    # The cause first (issue 41: every error began "batch reads need a replayable topic").
    with pytest.raises(Exception, match=r"TOPIC_NOT_RETAINED.*need a replayable topic"):
        read(spark, topic="t", nsqlookupdHttpAddresses=lookupd.http_address).count()


def test_the_auth_secret_comes_from_the_environment_where_it_is_read(
    spark: Any, start_nsqd: Callable[..., NsqdProcess]
) -> None:
    """``authSecretEnv`` in log mode: the driver and the executors read the secret from their
    own environment (the test's Spark got it when it started), it never rides in the options."""
    authd = AuthServer()
    try:
        node = start_nsqd("--retention-time=1h", f"--auth-http-address={authd.address}")
        with urllib_post(node, "/pub?topic=allowed_t", b"hello"):
            pass
        df = read(
            spark,
            mode="log",
            topic="allowed_t",
            nsqdHttpAddresses=node.http_address,
            authSecretEnv=TEST_SECRET_ENV,
        )
        assert [r.body for r in df.collect()] == [b"hello"]
        assert any("secret=s3cret" in q["path"] for q in authd.requests)
        # Without it the node refuses the read: the secret above did the work.
        with pytest.raises(Exception, match=r"AUTH"):
            read(spark, mode="log", topic="allowed_t", nsqdHttpAddresses=node.http_address).count()
        with pytest.raises(Exception, match=r"authSecretEnv.*'NO_SUCH_PYNSQD_VAR' is not set"):
            read(
                spark,
                mode="log",
                topic="allowed_t",
                nsqdHttpAddresses=node.http_address,
                authSecretEnv="NO_SUCH_PYNSQD_VAR",
            ).count()
    finally:
        authd.close()


class _Waiting(logging.Handler):
    """Set once the reader logs that it is retrying: the node is seen down."""

    def __init__(self) -> None:
        super().__init__()
        self.retrying = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "retrying" in record.getMessage():
            self.retrying.set()


def test_a_read_rides_out_a_node_restarting_and_gives_up_naming_the_range(
    tmp_path: Path,
) -> None:
    """A node killed after its range was planned: the read tries it again with backoff and goes
    on when it is back (the query died, Spark's 4 task attempts being spent within a second);
    one that stays down fails after readRetryTimeoutMs, naming node, topic and range."""
    tcp, http = free_port(), free_port()
    fixed = (
        "--retention-time=1h",
        f"--tcp-address=127.0.0.1:{tcp}",
        f"--http-address=127.0.0.1:{http}",
    )
    node = NsqdProcess(tmp_path / "n", *fixed)
    watcher = _Waiting()
    logger = logging.getLogger("pynsqd_spark.log")
    logger.addHandler(watcher)
    try:
        node.publish("t", [b"k%04d" % i for i in range(3000)])
        key = storage_id(node)
        node.proc.kill()
        node.proc.wait()
        node.stop()
        opts = LogOptions.parse({"topic": "t", "nsqdHttpAddresses": node.http_address})
        got: list[int] = []
        reader = threading.Thread(
            target=lambda: got.extend(r[0] for r in fetch(node.http_address, opts, 0, 3000, key))
        )
        reader.start()
        assert watcher.retrying.wait(30), "the reader never saw the node down"
        node = NsqdProcess(tmp_path / "n", *fixed)
        reader.join(60)
        assert not reader.is_alive()
        assert got == list(range(3000))
        node.stop()
        quick = LogOptions.parse(
            {
                "topic": "t",
                "nsqdHttpAddresses": node.http_address,
                "readRetryTimeoutMs": "300",
                "readRetryBackoffMs": "50",
            }
        )
        pattern = (
            rf"nsqd {node.http_address} \(storage {key}\) topic t: offsets 10-2999 "
            r"unreadable after \d+ tries .* \(option readRetryTimeoutMs\)"
        )
        with pytest.raises(NsqReadError, match=pattern):
            list(fetch(node.http_address, quick, 10, 3000, key))
    finally:
        logger.removeHandler(watcher)
        node.stop()


def urllib_post(node: NsqdProcess, path: str, body: bytes) -> Any:
    import urllib.request

    req = urllib.request.Request(f"http://{node.http_address}{path}", data=body, method="POST")
    return urllib.request.urlopen(req, timeout=5)


def test_offsets_keyed_by_address_are_taken_over_by_the_nodes_identity(
    start_nsqd: Callable[..., NsqdProcess],
) -> None:
    """A checkpoint written before the offsets were keyed by identity holds ``{address:
    offset}``: the next batch goes on from there under the node's storage id (not from the
    earliest offset again), and a batch replayed from such a checkpoint reads its range."""
    from pynsqd_spark.log_source import LogPartition, NsqLogStreamReader

    node = start_nsqd("--retention-time=1h")
    node.publish("t", [b"r%03d" % i for i in range(100)])
    reader = NsqLogStreamReader(
        LogOptions.parse({"topic": "t", "nsqdHttpAddresses": node.http_address})
    )
    old = {node.http_address: 40}
    end = reader.latestOffset(old)
    key = storage_id(node)
    assert end == {key: 100}
    (part,) = reader.partitions(old, end)
    assert isinstance(part, LogPartition)
    assert (part.key, part.start, part.end) == (key, 40, 100)
    # A replay of a batch whose both ends were keyed by address.
    (part,) = NsqLogStreamReader(reader.opts).partitions(old, {node.http_address: 60})
    assert isinstance(part, LogPartition)
    assert (part.key, part.start, part.end) == (key, 40, 60)
    got = [r[4] for r in fetch(part.node, reader.opts, part.start, part.end, part.key)]
    assert got == [b"r%03d" % i for i in range(40, 60)]


def _spread(node: NsqdProcess, topic: str, tag: str, conns: int = 8) -> list[bytes]:
    """MPUBs from ``conns`` connections open at once: they spread over a --workers node's
    workers, each appending to its own partition."""
    from pynsqd.client import Connection

    bodies: list[bytes] = []
    opened = [Connection(node.tcp_address).connect() for _ in range(conns)]
    try:
        for i, c in enumerate(opened):
            batch = [f"{tag}-{i}-{j}".encode() for j in range(25)]
            c.mpub(topic, batch)
            bodies += batch
    finally:
        for c in opened:
            c.close()
    return bodies


def _offsets(node: NsqdProcess, topic: str) -> dict[str, Any]:
    import json
    import urllib.request

    url = f"http://{node.http_address}/topic/offsets?topic={topic}"
    with urllib.request.urlopen(url, timeout=5) as r:
        return dict(json.loads(r.read()))


def test_a_node_of_several_workers_is_read_partition_by_partition_exactly_once(
    spark: Any, tmp_path: Path
) -> None:
    """``--workers 2``: each worker's log of a retained topic is a partition of the node. A
    batch read and a stream (stopped, more published, started again from its checkpoint) read
    every partition's records once: none lost, none twice, offsets dense in each partition."""
    node = NsqdProcess(tmp_path / "workers", "--workers=2", "--retention-time=1h")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    try:
        wait_for(lambda: b"OK" in _ping(node), "the node to be ready")
        published = _spread(node, "t", "a")
        parts = _offsets(node, "t")["partitions"]
        assert len(parts) == 2 and all(p["latest"] > 0 for p in parts), parts
        rows = read(spark, mode="log", topic="t", nsqdHttpAddresses=node.http_address).collect()
        assert sorted(r.body for r in rows) == sorted(published)

        def run() -> None:
            query = to_parquet(log_stream(spark, node.http_address), out, checkpoint)
            try:
                query.processAllAvailable()
            finally:
                query.stop()

        run()
        published += _spread(node, "t", "b")
        run()
    finally:
        node.stop()
    got = spark.read.parquet(str(out)).collect()
    assert sorted(r.body for r in got) == sorted(published)  # each once
    assert len({r.offset for r in got}) < len(got)  # two partitions, offsets of their own


def _ping(node: NsqdProcess) -> bytes:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{node.http_address}/ping", timeout=5) as r:
            return bytes(r.read())
    except (urllib.error.URLError, OSError):
        return b""
