"""Log mode with real Spark (local[2]) and real pynsqd processes: a replayable topic read by
offset on the executors, batch and streaming, exactly once across a restart, data loss."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pynsqd_spark import source_metrics

from ..processes import free_port
from ..waiting import wait_for
from .conftest import NsqdProcess
from .helpers import Driver, log_stream, retained, start_driver, storage_id, to_parquet

__all__ = ["start_driver"]  # the fixture


def log_reader(spark: Any, node: NsqdProcess, topic: str = "t", stream: bool = False) -> Any:
    reader = spark.readStream if stream else spark.read
    return (
        reader.format("nsq")
        .option("mode", "log")
        .option("topic", topic)
        .option("nsqdHttpAddresses", node.http_address)
    )


def test_batch_read_of_an_offset_range(spark: Any, start_nsqd: Callable[..., NsqdProcess]) -> None:
    node = retained(start_nsqd)
    node.publish("t", [b"m%03d" % i for i in range(100)])
    df = (
        log_reader(spark, node)
        .option("startingOffsets", json.dumps({node.http_address: 10}))
        .option("endingOffsets", json.dumps({node.http_address: 60}))
        .option("minPartitions", "3")
        .load()
    )
    assert df.rdd.getNumPartitions() == 3
    rows = sorted(
        (r.offset, r.body, r.topic) for r in df.select("offset", "body", "topic").collect()
    )
    assert rows == [(i, b"m%03d" % i, "t") for i in range(10, 60)]


def test_an_empty_range_reads_no_rows(spark: Any, start_nsqd: Callable[..., NsqdProcess]) -> None:
    # An empty range gives Spark no partitions; it then runs one task with InputPartition(None),
    # which the reader must answer with no rows rather than fail.
    node = retained(start_nsqd)
    node.publish("t", [b"x"] * 5)
    same = json.dumps({node.http_address: 3})
    df = log_reader(spark, node).option("startingOffsets", same).option("endingOffsets", same)
    assert df.load().count() == 0
    assert log_reader(spark, node).option("startingOffsets", "latest").load().count() == 0


def test_auto_mode_picks_the_log_and_reads_everything(
    spark: Any, start_nsqd: Callable[..., NsqdProcess]
) -> None:
    node = retained(start_nsqd)
    node.publish("t", [b"x"] * 25)
    df = (
        spark.read.format("nsq")
        .option("topic", "t")
        .option("nsqdHttpAddresses", node.http_address)
        .load()
    )
    assert "offset" in df.columns and df.count() == 25


def test_streaming_is_exactly_once_across_a_restart(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], tmp_path: Path
) -> None:
    node = retained(start_nsqd)
    node.publish("t", [b"a%04d" % i for i in range(300)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run(behind: int) -> None:
        df = log_stream(spark, node.http_address, maxOffsetsPerTrigger="70")
        query = to_parquet(df, out, checkpoint)
        try:
            query.processAllAvailable()
            sizes = [p["numInputRows"] for p in query.recentProgress]
            assert sizes and max(sizes) <= 70  # maxOffsetsPerTrigger
            last = query.lastProgress["sources"][0]
            assert json.loads(last["latestOffset"]) == json.loads(last["endOffset"])  # caught up
            # Kafka's lag metrics, from the progress: the first batch stopped 70 records in.
            lags = [source_metrics(p["sources"][0]) for p in query.recentProgress]
            first = next(m for m in lags if m)
            assert first["maxOffsetsBehindLatest"] == first["minOffsetsBehindLatest"] == behind
            # Per log, by its identity (the node's storage id), not by the address.
            assert first["perNode"] == {storage_id(node): behind}
            assert source_metrics(last)["maxOffsetsBehindLatest"] == 0
        finally:
            query.stop()

    run(behind=300 - 70)
    node.publish("t", [b"b%04d" % i for i in range(200)])
    run(behind=200 - 70)  # restarted from the checkpoint: it goes on where it stopped
    rows = spark.read.parquet(str(out)).collect()
    offsets = [r.offset for r in rows]
    assert len(offsets) == 500 and sorted(offsets) == list(range(500))  # none lost, none twice
    assert {r.body for r in rows} == {b"a%04d" % i for i in range(300)} | {
        b"b%04d" % i for i in range(200)
    }


def test_trigger_available_now_reads_what_was_there_in_bounded_batches_and_stops(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], tmp_path: Path
) -> None:
    node = retained(start_nsqd)
    node.publish("t", [b"a%04d" % i for i in range(250)])
    df = (
        log_reader(spark, node, stream=True)
        .option("maxOffsetsPerTrigger", "70")
        .option("readerName", "offsets-etl")
        .load()
    )
    query = (
        df.select("offset")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "an AvailableNow query must stop by itself"
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    # Without the source's own support Spark would read it all in one batch, ignoring the limit.
    assert sizes == [70, 70, 70, 40]
    offsets = sorted(r.offset for r in spark.read.parquet(str(tmp_path / "out")).collect())
    assert offsets == list(range(250))
    # The node shows the query as a reader of its log: what it committed, and its lag.
    stats = node.topic_stats("t") or {}
    readers = [(r["reader"], r["committed"], r["lag"]) for r in stats["log"]["readers"]]
    assert readers == [("offsets-etl", 250, 0)]


def _make_prunable(node: NsqdProcess, n: int) -> int:
    """Publish ``n`` messages that a channel has had (so retention may prune them); return the
    earliest retained offset once some were pruned."""
    req = urllib.request.Request(
        f"http://{node.http_address}/channel/create?topic=t&channel=c", method="POST"
    )
    urllib.request.urlopen(req, timeout=5).read()
    for _ in range(n // 10):  # many appends: a batch is never split across log segments
        node.publish("t", [b"p" * 100] * 10)
    with urllib.request.urlopen(f"http://{node.http_address}/topic/offsets?topic=t") as r:
        doc = json.loads(r.read())
    assert doc["earliest"] > 0, doc
    return int(doc["earliest"])


def test_records_pruned_before_they_were_read_fail_or_are_skipped(
    spark: Any, start_nsqd: Callable[..., NsqdProcess]
) -> None:
    node = start_nsqd("--retention-bytes=20000", "--max-bytes-per-file=4096")
    node.publish("t", [b"seed"])  # creates the topic (no channel yet: nothing prunable)
    earliest = _make_prunable(node, 400)
    start = json.dumps({node.http_address: 0})
    # The error names the range and the setting that removed it.
    removed = r"offsets 0-\d+ were removed by retention \(retention time [^,]+, bytes 20000"
    with pytest.raises(Exception, match=removed):
        log_reader(spark, node).option("startingOffsets", start).load().count()
    rows = (
        log_reader(spark, node)
        .option("startingOffsets", start)
        .option("failOnDataLoss", "false")
        .load()
        .select("offset")
        .collect()
    )
    assert min(r.offset for r in rows) >= earliest and len(rows) == 401 - earliest


def test_batch_reads_of_a_channel_fail_at_load_saying_what_to_use(
    spark: Any, nsqd_proc: NsqdProcess
) -> None:
    with pytest.raises(Exception, match=r"batch reads \(spark.read\) need a replayable topic"):
        spark.read.format("nsq").option("topic", "t").option("channel", "c").option(
            "nsqdTcpAddresses", nsqd_proc.tcp_address
        ).load().count()


def test_unknown_options_are_named_with_the_valid_ones(
    spark: Any, start_nsqd: Callable[..., NsqdProcess]
) -> None:
    node = retained(start_nsqd)
    with pytest.raises(Exception, match=r"unknown option\(s\) 'bogusoption'.*valid: mode, topic"):
        log_reader(spark, node).option("bogusOption", "1").load().count()


# A driver killed and started again: Spark starts twice, and the second run replays its batches
# (it took more than 300 s on a loaded 2-core machine).
@pytest.mark.timeout(900)
def test_killing_the_driver_mid_query_loses_and_duplicates_nothing(
    spark: Any,
    start_nsqd: Callable[..., NsqdProcess],
    start_driver: Callable[..., Driver],
    tmp_path: Path,
) -> None:
    node = retained(start_nsqd)
    n = 6000
    node.publish("t", [b"k%05d" % i for i in range(n)])
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = ("nodes", node.http_address, "t", str(out), str(checkpoint))
    first = start_driver(tmp_path / "first.log", *args)
    # Several batches in (each commits a file), then kill -9 the driver and its JVM.
    done = first.wait_committed(checkpoint, 2, "three batches")
    first.kill()
    assert done < n // 500  # killed mid-query
    start_driver(tmp_path / "second.log", *args).finish(480)
    rows = spark.read.parquet(str(out)).select("offset", "body").collect()
    offsets = [r.offset for r in rows]
    assert len(offsets) == n  # no duplicate
    assert sorted(offsets) == list(range(n))  # none lost
    assert {r.body for r in rows} == {b"k%05d" % i for i in range(n)}


def test_two_nodes_found_through_nsqlookupd(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], request: Any
) -> None:
    lookupd = request.getfixturevalue("lookupd")
    flags = (
        f"--lookupd-tcp-address={lookupd.tcp_address}",
        "--broadcast-address=127.0.0.1",
        "--retention-time=1h",
    )
    a, b = start_nsqd(*flags), start_nsqd(*flags)
    a.publish("multi", [b"a%d" % i for i in range(300)])
    b.publish("multi", [b"b%d" % i for i in range(200)])
    wait_for(lambda: len(lookupd.producers("multi")) >= 2, "both nsqd registered")
    rows = (
        spark.read.format("nsq")
        .option("mode", "log")
        .option("topic", "multi")
        .option("nsqlookupdHttpAddresses", lookupd.http_address)
        .load()
        .select("nsqd_address", "offset")
        .collect()
    )
    by_node: dict[str, list[int]] = {}
    for r in rows:
        by_node.setdefault(r.nsqd_address, []).append(r.offset)
    assert {n: sorted(v) for n, v in by_node.items()} == {
        a.http_address: list(range(300)),
        b.http_address: list(range(200)),
    }


def test_a_node_killed_and_restarted_mid_query_loses_and_duplicates_nothing(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], tmp_path: Path
) -> None:
    tcp, http = free_port(), free_port()
    fixed = (f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}")
    data = tmp_path / "nsqd"
    node = NsqdProcess(data, "--retention-time=1h", *fixed)
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    try:
        df = log_reader(spark, node, stream=True).option("maxOffsetsPerTrigger", "100").load()
        query = (
            df.select("offset", "body")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        try:
            node.publish("t", [b"x%03d" % i for i in range(300)])
            query.processAllAvailable()
            node.proc.kill()  # kill -9: the query must ride it out
            node.proc.wait()
            node.stop()
            query.processAllAvailable()  # planning goes on without the node
            assert query.exception() is None
            node = NsqdProcess(data, "--retention-time=1h", *fixed)
            node.publish("t", [b"y%03d" % i for i in range(200)])
            query.processAllAvailable()
        finally:
            query.stop()
    finally:
        node.stop()  # started here, not by the fixture: stopped here whatever failed
    offsets = sorted(r.offset for r in spark.read.parquet(str(out)).select("offset").collect())
    assert offsets == list(range(500))


def test_log_reads_over_https_when_nsqd_requires_tls(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], tmp_path: Path
) -> None:
    import re

    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    ca_file, key_file, cert_file = tmp_path / "ca.pem", tmp_path / "key.pem", tmp_path / "cert.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    cert.private_key_pem.write_to_path(str(key_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    node = retained(
        start_nsqd, f"--tls-cert={cert_file}", f"--tls-key={key_file}", "--tls-required=true"
    )

    # The start waited for TCP and HTTP; nsqd logs HTTPS's line just after (a fresh-clone run
    # read the log in between).
    listening = r"HTTPS: listening on (\S+)"
    wait_for(lambda: re.search(listening, node.log_path.read_text()), "the HTTPS listener")
    found = re.search(listening, node.log_path.read_text())
    assert found is not None
    https = found.group(1)
    from pynsqd.client.connection import ClientOptions, Connection

    with Connection(
        node.tcp_address, ClientOptions(tls=True, tls_ca_file=str(ca_file))
    ).connect() as c:
        c.mpub("t", [b"s1", b"s2"])

    def read(**extra: str) -> list[bytes]:
        reader = (
            spark.read.format("nsq")
            .option("mode", "log")
            .option("topic", "t")
            .option("nsqdHttpAddresses", https)
        )
        for k, v in extra.items():
            reader = reader.option(k, v)
        return sorted(r.body for r in reader.load().select("body").collect())

    assert read(tls="true", tlsCaFile=str(ca_file)) == [b"s1", b"s2"]
    with pytest.raises(Exception, match=r"nsqd 127\.0\.0\.1"):
        read()  # plain HTTP to the HTTPS port: a clear error, not a hang
