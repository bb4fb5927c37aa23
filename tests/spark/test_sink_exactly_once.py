"""The sink's exactly-once writes (pynsqd's idempotent publishing) with real Spark (local[2])
and real pynsqd processes: a micro-batch replayed after the driver died between publishing and
committing is written once (with ``exactlyOnce=false`` it was written twice: 400 records, no
duplicate dropped, when this test was written); a retried chunk is written once and a topic
without a log falls back to at-least-once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pynsqd.protocol import encode
from pynsqd_spark.options import SinkOptions
from pynsqd_spark.sink import Publisher, plain_command

from .conftest import NsqdProcess
from .helpers import log_stream, retained, urlopen_post


def relay(spark: Any, node: NsqdProcess, checkpoint: Path, **sink: str) -> None:
    """topic ``in`` (log mode, 100 records a batch) to topic ``out`` through the sink, until
    caught up."""
    df = log_stream(spark, node.http_address, "in", maxOffsetsPerTrigger="100")
    writer = (
        df.select("body")
        .writeStream.format("nsq")
        .option("topic", "out")
        .option("nsqdTcpAddresses", node.tcp_address)
        .option("checkpointLocation", str(checkpoint))
    )
    for k, v in sink.items():
        writer = writer.option(k, v)
    query = writer.start()
    try:
        query.processAllAvailable()
    finally:
        query.stop()


def test_a_batch_replayed_after_the_driver_died_is_written_once(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], tmp_path: Path
) -> None:
    node = retained(start_nsqd)
    node.publish("in", [b"r%04d" % i for i in range(300)])
    checkpoint = tmp_path / "checkpoint"
    relay(spark, node, checkpoint)
    # What a driver killed after the sink published batch 2 and before Spark committed it
    # leaves: the batch is planned (offsets/2) and not committed. The restart runs it again,
    # with the same query id, batch id and partitions.
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    assert commits == [0, 1, 2]
    for name in ("2", ".2.crc"):
        (checkpoint / "commits" / name).unlink(missing_ok=True)
    relay(spark, node, checkpoint)
    bodies = [r.body for r in node.log_records("out")]
    counts = Counter(bodies)
    assert set(counts) == {b"r%04d" % i for i in range(300)}
    stats = node.topic_stats("out")
    assert stats is not None
    assert len(bodies) == 300 and max(counts.values()) == 1
    # The replayed batch was published again, and recognised: none of it written twice.
    assert stats["log"]["duplicate_count"] == 100


def test_a_retried_chunk_is_written_once_and_a_topic_without_a_log_falls_back(
    start_nsqd: Callable[..., NsqdProcess],
) -> None:
    node = start_nsqd()
    for topic in ("kept", "plain"):
        if topic == "kept":
            urlopen_post(node.http_address, f"/topic/retention?topic={topic}&time=1h")
        opts = SinkOptions.parse({"topic": topic, "nsqdTcpAddresses": node.tcp_address}, False)
        commands = [
            encode.mpub(topic, [b"a", b"b"], ("spark.q.0.0", 0)),
            encode.mpub(topic, [b"c"], ("spark.q.0.0", 2)),
        ]
        for _ in range(2):  # the second time: a retried task sends the same commands
            pub = Publisher(opts)
            try:
                pub.publish_commands(topic, commands)
                pub.flush()
            finally:
                pub.close()
        stats = node.topic_stats(topic)
        assert stats is not None
        if topic == "kept":
            assert [r.body for r in node.log_records(topic)] == [b"a", b"b", b"c"]
            assert pub.plain == set()
        else:
            assert stats["message_count"] == 6  # at least once, as before
            assert pub.plain == {"plain"}
    assert plain_command(b"MPUB t p 5\n\x00") == b"MPUB t\n\x00"
    assert plain_command(b"MPUB t\n\x00") == b"MPUB t\n\x00"
