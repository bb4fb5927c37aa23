"""The sink's MPUB building from Arrow buffers, checked against the plain encoder (no Spark)."""

from __future__ import annotations

import random

import pyarrow as pa  # type: ignore[import-untyped]
import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from pynsqd.protocol import encode
from pynsqd_spark.options import SinkOptions
from pynsqd_spark.sink import NsqArrowWriter, NsqSinkError, chunk_bodies, mpub_commands


def test_mpub_commands_match_the_encoder() -> None:
    rng = random.Random(7)
    for trial in range(200):
        n = rng.randint(1, 60)
        bodies = [bytes([rng.randint(0, 255)]) * rng.randint(1, 50) for _ in range(n)]
        max_count, max_body = rng.randint(1, 20), rng.randint(60, 400)
        # A sliced array (non-zero offset) and a string column cast to binary.
        arr = pa.array([b"head", *bodies, b"tail"], pa.binary()).slice(1, n)
        if trial % 2:
            arr = pa.array([b.hex() for b in bodies]).cast(pa.binary())
            bodies = [b.hex().encode() for b in bodies]
        chunks = chunk_bodies(bodies, [len(b) for b in bodies], max_count, max_body)
        expected = [encode.mpub("t", c) for c in chunks]
        assert mpub_commands("t", arr, max_count, max_body) == expected
    assert mpub_commands("t", pa.array([], pa.binary()), 10, 100) == []


def _writer(schema: StructType, **options: str) -> NsqArrowWriter:
    opts = SinkOptions.parse(
        {"nsqdTcpAddresses": "127.0.0.1:4150", **options}, "topic" in schema.fieldNames()
    )
    return NsqArrowWriter(opts, schema)


def test_prepare_routes_skips_and_names_rows() -> None:
    schema = StructType([StructField("body", StringType()), StructField("topic", StringType())])
    rb = pa.RecordBatch.from_arrays(
        [
            pa.array(["a", "", "bb", "x" * 50, "c", "d"]),
            pa.array(["t1", "t2", None, "t1", "", "t2"]),
        ],
        names=["body", "topic"],
    )
    w = _writer(schema, topic="dflt", maxMsgSize="10", oversize="skip", emptyBody="skip")
    got = [(t, b.to_pylist(), s) for t, b, s in w._prepare(rb, 0, "p")]
    assert got == [("t1", [b"a"], 2), ("dflt", [b"bb", b"c"], 0), ("t2", [b"d"], 0)]
    with pytest.raises(NsqSinkError, match="row 13 of p: body is 50 bytes"):
        _writer(schema, topic="dflt", maxMsgSize="10", emptyBody="skip")._prepare(rb, 10, "p")
    with pytest.raises(NsqSinkError, match="row 1 of p: body is empty"):
        _writer(schema, topic="dflt")._prepare(rb, 0, "p")
    ok = rb.slice(2, 1)
    with pytest.raises(NsqSinkError, match="row 0 of p: column 'topic' is null"):
        _writer(schema)._prepare(ok, 0, "p")
    bad = pa.RecordBatch.from_arrays(
        [pa.array(["a", "b"]), pa.array(["ok", "not valid!"])], names=["body", "topic"]
    )
    with pytest.raises(NsqSinkError, match="row 1 of p: 'not valid!' is not a valid"):
        _writer(schema)._prepare(bad, 0, "p")
    plain = StructType([StructField("body", BinaryType())])
    nulls = pa.RecordBatch.from_arrays([pa.array([b"a", None])], names=["body"])
    with pytest.raises(NsqSinkError, match="row 1 of p: column 'body' is null"):
        _writer(plain, topic="t")._prepare(nulls, 0, "p")
