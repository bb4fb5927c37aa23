"""The nsq data source in real Spark (local[2], one shared session) against nsqd processes.

Kept few and small: every streaming query costs seconds of Spark start-up.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pynsqd.client.connection import Connection
from pynsqd_spark import source_metrics
from pynsqd_spark.options import SinkOptions
from pynsqd_spark.sink import Publisher

from ..processes import free_port
from ..waiting import wait_for
from .conftest import HAVE_LOOKUPD, NsqdProcess
from .helpers import QUERY_TIMEOUT, Collector, consume_all, read_stream, run_available_now

pytestmark = pytest.mark.timeout(360)


def test_read_exactly_n_then_channel_drained(
    spark: Any, nsqd_proc: NsqdProcess, tmp_path: Path
) -> None:
    n = 3000
    bodies = [b"msg-%05d" % i for i in range(n)]
    t0 = time.time()
    nsqd_proc.publish("events", bodies)
    sink = Collector()
    df = read_stream(
        spark,
        topic="events",
        channel="spark",
        nsqdTcpAddresses=nsqd_proc.tcp_address,
        maxMessagesPerBatch="1000",
    )
    q = run_available_now(df, sink, tmp_path / "ck")
    assert len(sink.rows) == n
    assert len(sink.ids()) == n
    # The last progress counts the last batch's FINs too (it said finished: 0 after one batch,
    # its counts taken before Spark committed the batch before it).
    assert source_metrics(q.lastProgress["sources"][0])["finished"] == n
    assert sorted(r.body for r in sink.rows) == bodies
    assert max(b[1] for b in sink.batches) <= 1000  # admission control
    r = sink.rows[0]
    assert (r.topic, r.channel, r.nsqd_address, r.attempts) == (
        "events",
        "spark",
        nsqd_proc.tcp_address,
        1,
    )
    assert len(r.message_id) == 16 and t0 - 60 < r.timestamp.timestamp() < time.time() + 60
    # Everything was FIN'd: nothing left, nothing in flight (pynsqd would requeue un-FIN'd
    # messages when the query's connections closed, so depth would show them).
    nsqd_proc.wait_drained("events", "spark")


def test_idle_topic_commits_its_last_batch(
    spark: Any, nsqd_proc: NsqdProcess, tmp_path: Path
) -> None:
    nsqd_proc.publish("idle", [b"x%d" % i for i in range(500)])
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "100ms")
    sink = Collector()
    df = read_stream(spark, topic="idle", channel="c", nsqdTcpAddresses=nsqd_proc.tcp_address)
    q = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: len(sink.ids()) == 500, "500 rows", QUERY_TIMEOUT)
        # The query is still running and the topic is idle: the last batch is FIN'd anyway.
        c = nsqd_proc.wait_drained("idle", "c")
        assert c["client_count"] >= 1

        # The consumer's counts ride on the progress's latestOffset (PySpark has no source
        # metrics for Python sources); idle triggers report progress every 100 ms here.
        def counted() -> bool:
            p = q.lastProgress
            return bool(p) and source_metrics(p["sources"][0]).get("finished") == 500

        wait_for(counted, "progress counting 500 FIN'd", QUERY_TIMEOUT)
        m = source_metrics(q.lastProgress["sources"][0])
        assert m["received"] == 500 and m["buffered"] == 0 and m["redelivered"] == 0
    finally:
        q.stop()
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
    assert len(sink.rows) == 500


def test_restart_after_failure_mid_batch(
    spark: Any, nsqd_proc: NsqdProcess, tmp_path: Path
) -> None:
    n = 2000
    nsqd_proc.publish("rs", [b"r%05d" % i for i in range(n)])
    opts = {
        "topic": "rs",
        "channel": "c",
        "nsqdTcpAddresses": nsqd_proc.tcp_address,
        "maxMessagesPerBatch": "400",
        "msgTimeoutMs": "2000",
    }
    first = Collector(fail_on_batch=2)
    q = (
        read_stream(spark, **opts)
        .writeStream.foreachBatch(first)
        .trigger(availableNow=True)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .start()
    )
    with pytest.raises(Exception, match="injected failure"):
        q.awaitTermination(QUERY_TIMEOUT)
    q.stop()
    assert 0 < len(first.rows) < n
    second = Collector()
    run_available_now(read_stream(spark, **opts), second, tmp_path / "ck")
    got = {r.body for r in first.rows} | {r.body for r in second.rows}
    assert got == {b"r%05d" % i for i in range(n)}  # every message at least once
    redelivered = [r for r in second.rows if r.attempts > 1]
    assert redelivered  # the failed batch's messages came again
    nsqd_proc.wait_drained("rs", "c")


@pytest.mark.skipif(not HAVE_LOOKUPD, reason="no nsqlookupd console script")
def test_two_nsqd_nodes_behind_nsqlookupd(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], request: Any, tmp_path: Path
) -> None:
    lookupd = request.getfixturevalue("lookupd")
    flags = (f"--lookupd-tcp-address={lookupd.tcp_address}", "--broadcast-address=127.0.0.1")
    a, b = start_nsqd(*flags), start_nsqd(*flags)
    a.publish("multi", [b"a%d" % i for i in range(600)])
    b.publish("multi", [b"b%d" % i for i in range(600)])
    nodes = sorted([a.tcp_address, b.tcp_address])
    wait_for(lambda: lookupd.producers("multi") == nodes, "both nsqd registered", 20)
    sink = Collector()
    df = read_stream(
        spark,
        topic="multi",
        channel="c",
        nsqlookupdHttpAddresses=lookupd.http_address,
        maxMessagesPerBatch="800",
    )
    run_available_now(df, sink, tmp_path / "ck")
    assert len(sink.ids()) == 1200
    by_node = {n: sum(1 for r in sink.rows if r.nsqd_address == n) for n in nodes}
    assert by_node == {a.tcp_address: 600, b.tcp_address: 600}
    assert all(parts >= nodes for _, _, parts, nodes in sink.batches)  # a partition per node
    a.wait_drained("multi", "c")
    b.wait_drained("multi", "c")
    # The sink finds the nodes through nsqlookupd too, and spreads the tasks over them.
    spark.range(1000, numPartitions=4).selectExpr("cast(id as string) as body").write.format(
        "nsq"
    ).mode("append").option("topic", "back").option(
        "nsqlookupdHttpAddresses", lookupd.http_address
    ).save()
    counts = [(n.topic_stats("back") or {}).get("message_count", 0) for n in (a, b)]
    assert counts == [500, 500]


@pytest.mark.skipif(not HAVE_LOOKUPD, reason="no nsqlookupd console script")
def test_progress_shows_the_channel_backlog_through_nsqlookupd(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], request: Any, tmp_path: Path
) -> None:
    lookupd = request.getfixturevalue("lookupd")
    node = start_nsqd(
        f"--lookupd-tcp-address={lookupd.tcp_address}", "--broadcast-address=127.0.0.1"
    )
    node.publish("deep", [b"d%04d" % i for i in range(1000)])
    wait_for(lambda: lookupd.producers("deep") == [node.tcp_address], "registered", 20)
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "100ms")
    sink = Collector()
    df = read_stream(
        spark,
        topic="deep",
        channel="c",
        nsqlookupdHttpAddresses=lookupd.http_address,
        maxInFlight="50",  # nsqd keeps most of the 1000 until the first batches are FIN'd
        maxMessagesPerBatch="100",
    )
    q = (
        df.writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="100 milliseconds")
        .start()
    )

    def backlogs() -> list[int]:
        metrics = [source_metrics(p["sources"][0]) for p in q.recentProgress]
        return [m["backlog"] for m in metrics if "backlog" in m]

    try:
        wait_for(backlogs, "a backlog reported", QUERY_TIMEOUT)
        assert 500 < backlogs()[0] <= 1000  # the channel's depth when the query started
        wait_for(lambda: len(sink.ids()) == 1000, "1000 rows", QUERY_TIMEOUT)
        node.wait_drained("deep", "c")
        wait_for(lambda: backlogs()[-1:] == [0], "a backlog of 0 reported", QUERY_TIMEOUT)
    finally:
        q.stop()
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")


def test_source_bad_input(spark: Any, tmp_path: Path) -> None:
    # Missing topic: refused at load(), naming the option.
    with pytest.raises(Exception, match="option 'topic' is required"):
        read_stream(spark, channel="c", nsqdTcpAddresses="127.0.0.1:1", mode="channel")
    # A misspelled option (issue 41: reported at start() as "option 'channel' is required",
    # inside a 25-line trace): refused at load(), named, with the nearest valid name.
    with pytest.raises(Exception, match="'chanel': did you mean 'channel'") as err:
        read_stream(spark, topic="t", chanel="c", nsqdTcpAddresses="127.0.0.1:1", mode="channel")
    assert "UnboundLocalError" not in str(err.value)
    # Nobody listening: the query fails, naming the option and the address.
    dead = f"127.0.0.1:{free_port()}"
    q = (
        read_stream(spark, topic="t", channel="c", nsqdTcpAddresses=dead)
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck2"))
        .start()
    )
    with pytest.raises(Exception, match="nsqdTcpAddresses") as err:
        q.awaitTermination(QUERY_TIMEOUT)
    q.stop()
    assert dead in str(err.value)


# -- sink ---------------------------------------------------------------------------------------


def test_batch_write_n_rows_and_topic_routing(spark: Any, nsqd_proc: NsqdProcess) -> None:
    n = 5000
    Connection(nsqd_proc.tcp_address).connect().close()
    df = spark.range(n).selectExpr("cast(concat('row-', id) as binary) as body")
    (
        df.write.format("nsq")
        .mode("append")
        .option("topic", "out")
        .option("nsqdTcpAddresses", nsqd_proc.tcp_address)
        .option("maxMessagesPerMpub", "700")
        .save()
    )
    assert nsqd_proc.topic_stats("out")["message_count"] == n  # type: ignore[index]
    assert sorted(consume_all(nsqd_proc, "out", n)) == sorted(b"row-%d" % i for i in range(n))
    # A string body and a topic column: rows go to their own topics.
    routed = spark.range(100).selectExpr(
        "concat('v', id) as body", "if(id % 4 = 0, 'quarter', 'rest') as topic"
    )
    routed.write.format("nsq").mode("append").option(
        "nsqdTcpAddresses", nsqd_proc.tcp_address
    ).save()
    assert nsqd_proc.topic_stats("quarter")["message_count"] == 25  # type: ignore[index]
    assert nsqd_proc.topic_stats("rest")["message_count"] == 75  # type: ignore[index]


def test_stream_nsq_to_nsq(spark: Any, nsqd_proc: NsqdProcess, tmp_path: Path) -> None:
    n = 2000
    nsqd_proc.publish("in", [b"%d" % i for i in range(n)])
    df = read_stream(spark, topic="in", channel="c", nsqdTcpAddresses=nsqd_proc.tcp_address)
    q = (
        df.selectExpr("concat(cast(body as string), '!') as body")
        .writeStream.format("nsq")
        .option("topic", "out")
        .option("nsqdTcpAddresses", nsqd_proc.tcp_address)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert q.awaitTermination(QUERY_TIMEOUT)
    finally:
        q.stop()
    assert sorted(consume_all(nsqd_proc, "out", n)) == sorted(b"%d!" % i for i in range(n))
    nsqd_proc.wait_drained("in", "c")


def test_sink_bad_rows(spark: Any, nsqd_proc: NsqdProcess) -> None:
    def write(df: Any, **options: str) -> None:
        w = df.write.format("nsq").mode("append").option("nsqdTcpAddresses", nsqd_proc.tcp_address)
        for k, v in options.items():
            w = w.option(k, v)
        w.save()

    one_part = spark.range(10).coalesce(1)
    nulls = one_part.selectExpr("if(id = 7, null, cast(id as string)) as body")
    with pytest.raises(Exception, match="row 7 of partition 0: column 'body' is null"):
        write(nulls, topic="bad")
    big = one_part.selectExpr("if(id = 3, repeat('x', 200), 'ok') as body")
    with pytest.raises(
        Exception, match="row 3 of partition 0: body is 200 bytes, over the maxMsgSize of 100"
    ):
        write(big, topic="bad", maxMsgSize="100")
    write(big, topic="skip", maxMsgSize="100", oversize="skip")
    assert nsqd_proc.topic_stats("skip")["message_count"] == 9  # type: ignore[index]
    with pytest.raises(Exception, match="'topic' is required"):
        write(one_part.selectExpr("'x' as body"))
    with pytest.raises(Exception, match="'body'"):
        write(one_part.selectExpr("id"), topic="t")
    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(Exception, match=f"cannot connect to nsqd {dead}"):
        one_part.selectExpr("'x' as body").write.format("nsq").mode("append").option(
            "nsqdTcpAddresses", dead
        ).option("topic", "t").option("maxRetries", "1").option("retryBackoffMs", "1").save()


@pytest.mark.skipif(not HAVE_LOOKUPD, reason="no nsqlookupd console script")
def test_sink_tasks_spread_evenly_whatever_lookupd_answered_when_each_started(
    start_nsqd: Callable[..., NsqdProcess], request: Any
) -> None:
    """Task i starts on the i-th node of one sorted list. Each task used to index nsqlookupd's
    answer as it stood when the task started, topic holders first: tasks 0 and 2 before the
    topic existed and 1 and 3 after it appeared on the other node all went to one node."""
    lookupd = request.getfixturevalue("lookupd")
    flags = (f"--lookupd-tcp-address={lookupd.tcp_address}", "--broadcast-address=127.0.0.1")
    a, b = start_nsqd(*flags), start_nsqd(*flags)
    wait_for(lambda: len(lookupd.nodes()) == 2, "both nsqd registered", 20)
    opts = SinkOptions.parse({"topic": "s", "nsqlookupdHttpAddresses": lookupd.http_address}, False)

    def first_node(pid: int) -> str:
        pub = Publisher(opts, start_index=pid)
        try:
            pub._connection("s")  # the node the task starts on (connecting creates no topic)
            return pub.used[0]
        finally:
            pub.close()

    # Before the topic exists the list is lookupd's /nodes; then it appears on the node that is
    # not first there, which the old list put first.
    early = {pid: first_node(pid) for pid in (0, 2)}
    later = next(n for n in (a, b) if n.tcp_address != lookupd.nodes()[0])
    later.publish("s", [b"seed"])
    wait_for(lambda: lookupd.producers("s") == [later.tcp_address], "the topic registered", 20)
    late = {pid: first_node(pid) for pid in (1, 3)}
    used = [{**early, **late}[pid] for pid in range(4)]
    assert sorted(used) == sorted([a.tcp_address, b.tcp_address] * 2), used
