"""``spark.readStream.format("nsq")``: the stream reader.

Offsets are batch numbers ``{"seq": n}``. The consumer (connections, buffer, ledger) lives in the
driver-side source runner process and is created on the first engine call, never in ``__init__``
(the planner process builds and pickles the reader too). ``partitions()`` ships each batch's
messages to the executors as Arrow record batches inside the partitions, one or more per nsqd
node; ``read()`` yields them. ``commit(end)`` FINs. NSQ cannot replay: a batch Spark replays after
a restart comes back empty and its messages, never FIN'd, are redelivered by nsqd into a later
batch (at-least-once).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import sys
import time
from array import array
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from .consumer import ConsumerPool, Part
from .options import SourceOptions

log = logging.getLogger("pynsqd_spark.source")

SOURCE_SCHEMA = StructType(
    [
        StructField("body", BinaryType()),
        StructField("message_id", StringType()),
        StructField("timestamp", TimestampType()),
        StructField("attempts", IntegerType()),
        StructField("nsqd_address", StringType()),
        StructField("topic", StringType()),
        StructField("channel", StringType()),
    ]
)
_ARROW_SCHEMA = to_arrow_schema(SOURCE_SCHEMA, timezone="UTC")
#: ``includeHeaders``: each message's headers (``docs/headers.md``), as Spark's Kafka source
#: gives them: an array of (key, value) in their order, empty for a message without.
HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
SOURCE_SCHEMA_WITH_HEADERS = StructType(
    [*SOURCE_SCHEMA.fields, StructField("headers", HEADERS_TYPE)]
)
_ARROW_SCHEMA_WITH_HEADERS = to_arrow_schema(SOURCE_SCHEMA_WITH_HEADERS, timezone="UTC")
_ARROW_HEADERS = _ARROW_SCHEMA_WITH_HEADERS.field("headers").type


def headers_array(blocks: list[list[tuple[str, bytes]]]) -> Any:
    """A ``headers`` column: each message's (name, value) pairs as key/value structs."""
    return pa.array([[{"key": k, "value": v} for k, v in h] for h in blocks], _ARROW_HEADERS)


class NsqPartition(InputPartition):
    """One task's share of a batch: messages from one nsqd node.

    It carries the per-message columns (body, message_id, timestamp, attempts) as one Arrow
    record batch; the constant ones (nsqd_address, topic, channel) are added on the executor,
    so they do not travel through the JVM's task serialization for every row.
    """

    def __init__(
        self, seq: int, node: str, index: int, columns: Any, topic: str, channel: str
    ) -> None:
        super().__init__((seq, node, index))
        self.seq = seq
        self.node = node
        self.columns = columns
        self.topic = topic
        self.channel = channel

    @property
    def batch(self) -> Any:
        """The partition's rows as a record batch of the source schema."""
        n = self.columns.num_rows
        cols = self.columns.columns
        arrays = [
            *cols[:4],
            _repeat(self.node, n),
            _repeat(self.topic, n),
            _repeat(self.channel, n),
        ]
        if len(cols) > 4:  # includeHeaders
            return pa.RecordBatch.from_arrays([*arrays, cols[4]], schema=_ARROW_SCHEMA_WITH_HEADERS)
        return pa.RecordBatch.from_arrays(arrays, schema=_ARROW_SCHEMA)


def build_partitions(
    seq: int,
    parts: list[Part],
    topic: str,
    channel: str,
    max_messages: int,
    max_bytes: int,
    with_headers: bool = False,
) -> list[NsqPartition]:
    """One partition per node, split further to stay under ``max_messages`` / ``max_bytes``;
    ``with_headers``: a fifth column, each message's headers (``includeHeaders``)."""
    by_node: dict[str, list[Part]] = {}
    for p in parts:
        by_node.setdefault(p.node, []).append(p)
    out: list[NsqPartition] = []
    for node, node_parts in by_node.items():
        ts = list(itertools.chain.from_iterable(p.ts for p in node_parts))
        att = list(itertools.chain.from_iterable(p.att for p in node_parts))
        ids = list(itertools.chain.from_iterable(p.ids for p in node_parts))
        bodies = list(itertools.chain.from_iterable(p.bodies for p in node_parts))
        hdrs = list(itertools.chain.from_iterable(p.hdrs for p in node_parts))
        bounds = _split(bodies, max_messages, max_bytes)
        for index, (lo, hi) in enumerate(bounds):
            cols = _row_columns(ts[lo:hi], att[lo:hi], ids[lo:hi], bodies[lo:hi])
            if with_headers:
                cols = pa.RecordBatch.from_arrays(
                    [*cols.columns, headers_array(hdrs[lo:hi])],
                    names=[*cols.schema.names, "headers"],
                )
            out.append(NsqPartition(seq, node, index, cols, topic, channel))
    return out


def _split(bodies: list[bytes], max_messages: int, max_bytes: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` ranges of at most ``max_messages`` and ``max_bytes`` (at least one each)."""
    n = len(bodies)
    sizes = list(itertools.accumulate(map(len, bodies)))
    if n <= max_messages and (not sizes or sizes[-1] <= max_bytes):
        return [(0, n)]
    bounds: list[tuple[int, int]] = []
    lo = 0
    while lo < n:
        base = sizes[lo - 1] if lo else 0
        hi = min(bisect.bisect_right(sizes, base + max_bytes, lo), lo + max_messages)
        hi = max(hi, lo + 1)
        bounds.append((lo, hi))
        lo = hi
    return bounds


def _binary_array(values: list[bytes]) -> Any:
    """``pa.array(values, pa.binary())``, built from two buffers (several times faster)."""
    offsets = array("i", [0])
    offsets.extend(itertools.accumulate(map(len, values)))
    data = b"".join(values)
    return pa.Array.from_buffers(
        pa.binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )


def _fixed_width(type_: Any, data: bytes, n: int, width: int) -> Any:
    """An Arrow binary/string array of ``n`` values of ``width`` bytes each, laid end to end."""
    offsets = np.arange(0, n * width + 1, width, dtype=np.int32)
    return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _repeat(value: str, n: int) -> Any:
    """A string array of ``n`` times ``value`` (no Python object per row)."""
    raw = value.encode()
    return _fixed_width(pa.string(), raw * n, n, len(raw))


_ROW_SCHEMA = pa.schema(list(_ARROW_SCHEMA)[:4])


def _row_columns(ts: list[int], att: list[int], ids: list[bytes], bodies: list[bytes]) -> Any:
    """body, message_id, timestamp, attempts as one record batch."""
    n = len(ids)
    # Columns from flat buffers: a Python object per row only where there is one already.
    ts_ns = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(array("q", ts))])
    ts_us = pc.divide(ts_ns, 1000).cast(pa.timestamp("us", tz="UTC"))
    # The reader thread cuts every id to nsqd's 16 bytes.
    id_col = _fixed_width(pa.string(), b"".join(ids), n, 16)
    return pa.RecordBatch.from_arrays(
        [
            _binary_array(bodies),
            id_col,
            ts_us,
            pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(array("i", att))]),
        ],
        schema=_ROW_SCHEMA,
    )


class NsqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: SourceOptions) -> None:
        self.opts = options
        self._pool: ConsumerPool | None = None
        self._seq = 0
        #: batch numbers this process created (a planned seq not in here is a replay)
        self._issued: set[int] = set()
        self._cache: dict[int, list[NsqPartition]] = {}
        self._last_end = 0
        self._available_now = False
        self._done = False

    def __getstate__(self) -> dict[str, Any]:
        # The planner process pickles the reader for the executors: no sockets, threads or data.
        state = self.__dict__.copy()
        state["_pool"] = None
        state["_cache"] = {}
        state["_issued"] = set()
        return state

    def _ensure(self) -> ConsumerPool:
        if self._pool is None:
            pool = ConsumerPool(self.opts)
            pool.start()
            self._pool = pool
        return self._pool

    # -- engine calls (driver, source runner process) -------------------------------------

    def initialOffset(self) -> dict[str, Any]:
        self._ensure()
        return {"seq": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.opts.max_messages_per_batch)

    def prepareForTriggerAvailableNow(self) -> None:
        pool = self._ensure()
        self._available_now = True
        # Only messages published before now (plus a clock-skew allowance) belong to this run.
        pool.cutoff_ns = time.time_ns() + self.opts.available_now_clock_skew_ms * 1_000_000

    def latestOffset(
        self, start: dict[Any, Any] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, Any]:
        pool = self._ensure()
        start_seq = self._last_end if start is None else int(start["seq"])
        self._seq = max(self._seq, start_seq)
        # Spark asks from ``start`` only once the batch ending there is in its commit log (a
        # batch not yet committed at a restart is run again first, without asking), so its
        # messages are FIN'd here, a trigger earlier than Spark's own ``commit`` call, and the
        # counts reportLatestOffset gives the progress include them. (Spark's async progress
        # tracking, which writes the commit log later, would break this; Spark allows it
        # only with its Kafka sink.)
        finished = pool.commit(start_seq) if start is not None else 0
        pending = pool.pending_after(start_seq)
        if pending is not None:  # taken earlier but not planned yet: offer it again
            return {"seq": pending}
        if self._done:
            return {"seq": start_seq}
        max_rows, max_bytes = self._limits(limit)
        while True:
            if pool.take(self._seq + 1, max_rows, max_bytes):
                return self._issue()
            if self.opts.flush_empty_batch and finished:
                # Nothing new, but the last batch was just FIN'd: an empty batch makes Spark
                # report a progress whose counts include it (the last one a query shows).
                return self._issue()
            if not self._available_now:
                return {"seq": start_seq}
            deadline = pool.last_eligible_receive + self.opts.available_now_idle_ms / 1000
            if pool.clock() >= deadline:
                self._done = True
                n = pool.release_all()
                log.info("nsq source: Trigger.AvailableNow done; %d later messages requeued", n)
                return {"seq": start_seq}
            pool.wait_for_messages(deadline)

    def reportLatestOffset(self) -> dict[str, Any]:
        """The query progress's ``latestOffset``: the last batch number issued, and beside it
        the consumer's running counts and, with nsqlookupd, the channel's depth on the nodes
        (PySpark gives Python sources no ``metrics`` of their
        own; :func:`pynsqd_spark.progress.source_metrics` reads them back)."""
        out: dict[str, Any] = {"seq": self._seq}
        if self._pool is not None:
            out.update(self._pool.counts())
            backlog = self._pool.backlog()
            if backlog is not None:
                out["backlog"] = backlog
        return out

    def _limits(self, limit: ReadLimit | None) -> tuple[int, int]:
        if isinstance(limit, ReadAllAvailable):
            return sys.maxsize, sys.maxsize
        if isinstance(limit, ReadMaxRows):
            return max(1, limit.max_rows), self.opts.max_bytes_per_batch
        if isinstance(limit, ReadMaxBytes):
            return self.opts.max_messages_per_batch, max(1, limit.max_bytes)
        return self.opts.max_messages_per_batch, self.opts.max_bytes_per_batch

    def _issue(self) -> dict[str, Any]:
        self._seq += 1
        self._issued.add(self._seq)
        return {"seq": self._seq}

    def partitions(self, start: dict[Any, Any], end: dict[Any, Any]) -> list[InputPartition]:
        pool = self._ensure()
        lo, hi = int(start["seq"]), int(end["seq"])
        self._last_end = max(self._last_end, hi)
        self._seq = max(self._seq, hi)
        out: list[InputPartition] = []
        for seq in range(lo + 1, hi + 1):
            cached = self._cache.get(seq)
            if cached is None:
                parts = pool.parts(seq)
                if parts is None:
                    if seq not in self._issued:
                        log.info(
                            "nsq source: batch %d is a replay after a restart: empty (its "
                            "messages were never FIN'd, nsqd redelivers them)",
                            seq,
                        )
                    cached = []
                else:
                    cached = build_partitions(
                        seq,
                        parts,
                        self.opts.topic,
                        self.opts.channel,
                        self.opts.max_messages_per_partition,
                        self.opts.max_bytes_per_partition,
                        self.opts.include_headers,
                    )
                    pool.drop_payload(seq)  # the partitions hold the data until commit
                self._cache[seq] = cached
            out.extend(cached)
        return out

    def commit(self, end: dict[Any, Any]) -> None:
        seq = int(end["seq"])
        for s in [s for s in self._cache if s <= seq]:
            del self._cache[s]
        if self._pool is not None:
            done = self._pool.commit(seq)
            # The counts go to the log too (the progress has them through reportLatestOffset).
            log.info(
                "nsq source: batch %(seq)d committed, %(done)d FIN'd; so far received "
                "%(received)d, FIN'd %(finished)d, requeued %(requeued)d, redelivered after a "
                "lost connection %(redelivered)d, reconnects %(reconnects)d, buffered "
                "%(buffered)d",
                {"seq": seq, "done": done, **self._pool.counts()},
            )

    def stop(self) -> None:
        # Spark does not promise to call it; nsqd's timeouts cover us when it does not.
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    # -- executor --------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if isinstance(partition, NsqPartition):  # not Spark's InputPartition(None) of no rows
            yield partition.batch
