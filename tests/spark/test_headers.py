"""Message headers through Spark (``docs/headers.md``): log mode's ``includeHeaders`` column
(as Spark's Kafka source has it) and the sink's ``headers`` column, on a real nsqd."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

from pynsqd.client import ClientOptions, Connection
from pynsqd_spark.options import NsqOptionError, SinkOptions
from pynsqd_spark.sink import NsqArrowWriter, NsqSinkError

from .conftest import NsqdProcess
from .helpers import Collector, read_stream, retained, run_available_now


def _read(spark: Any, node: NsqdProcess, topic: str, **more: str) -> Any:
    reader = (
        spark.read.format("nsq")
        .option("mode", "log")
        .option("topic", topic)
        .option("nsqdHttpAddresses", node.http_address)
    )
    for k, v in more.items():
        reader = reader.option(k, v)
    return reader.load()


def test_log_mode_reads_headers_and_the_sink_writes_them(
    spark: Any, start_nsqd: Callable[..., NsqdProcess]
) -> None:
    node = retained(start_nsqd)
    with Connection(node.tcp_address, ClientOptions(headers=True)).connect() as c:
        c.mpub(
            "src",
            [b"a", b"b", b"c"],
            headers=[{"traceparent": "00-1-01", "tenant": "acme"}, None, [("k", b"\x00\xff")]],
        )
    plain = _read(spark, node, "src")
    assert "headers" not in plain.columns  # unchanged unless asked for
    df = _read(spark, node, "src", includeHeaders="true").orderBy("offset")
    rows = [(r.body, [(h.key, bytes(h.value)) for h in r.headers]) for r in df.collect()]
    assert rows == [
        (bytearray(b"a"), [("traceparent", b"00-1-01"), ("tenant", b"acme")]),
        (bytearray(b"b"), []),
        (bytearray(b"c"), [("k", b"\x00\xff")]),
    ]
    # The sink sends a 'headers' column with each row (its connections ask for headers).
    (
        df.select("body", "headers")
        .write.format("nsq")
        .option("nsqdTcpAddresses", node.tcp_address)
        .option("topic", "copy")
        .mode("append")
        .save()
    )
    copied = _read(spark, node, "copy", includeHeaders="true").orderBy("offset").collect()
    assert [(r.body, [(h.key, bytes(h.value)) for h in r.headers]) for r in copied] == rows


def test_channel_mode_reads_headers(
    spark: Any, start_nsqd: Callable[..., NsqdProcess], tmp_path: Path
) -> None:
    node = start_nsqd()
    with Connection(node.tcp_address, ClientOptions(headers=True)).connect() as c:
        c.mpub("ev", [b"x", b"y"], headers=[{"tenant": "acme"}, None])
    sink = Collector()
    df = read_stream(
        spark, topic="ev", channel="spark", nsqdTcpAddresses=node.tcp_address, includeHeaders="true"
    )
    run_available_now(df, sink, tmp_path / "ck")
    got = sorted((bytes(r.body), [(h.key, bytes(h.value)) for h in r.headers]) for r in sink.rows)
    assert got == [(b"x", [("tenant", b"acme")]), (b"y", [])]
    assert (
        "headers"
        not in read_stream(
            spark, topic="ev", channel="other", nsqdTcpAddresses=node.tcp_address
        ).columns
    )


HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


def test_the_sink_checks_its_headers_column() -> None:
    opts = SinkOptions.parse({"nsqdTcpAddresses": "127.0.0.1:4150", "topic": "t"}, False)
    bad = StructType([StructField("body", BinaryType()), StructField("headers", StringType())])
    with pytest.raises(NsqOptionError, match="column 'headers' must be array<struct<key"):
        NsqArrowWriter(opts, bad)
    schema = StructType([StructField("body", BinaryType()), StructField("headers", HEADERS)])
    w = NsqArrowWriter(opts, schema)
    struct = pa.struct([("key", pa.string()), ("value", pa.binary())])
    rb = pa.RecordBatch.from_arrays(
        [
            pa.array([b"x", b"y"]),
            pa.array(
                [[{"key": "ok", "value": b"1"}], [{"key": "Not Valid", "value": b"2"}]],
                pa.list_(struct),
            ),
        ],
        names=["body", "headers"],
    )
    with pytest.raises(NsqSinkError, match=r"row 1 of p: column 'headers': header name"):
        w._prepare(rb, 0, "p")
    ((topic, bodies, skipped),) = w._prepare(rb.slice(0, 1), 0, "p")
    assert (topic, bodies.to_pylist(), skipped) == ("t", [b"\x00\x06\x02ok\x00\x011x"], 0)
