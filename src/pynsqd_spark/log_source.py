"""Log mode: read a replayable topic by offset, on the executors, as Spark's Kafka source does.

A pynsqd topic with retention keeps a log addressed by offset (``GET /topic/offsets``, ``GET
/topic/log`` on each nsqd's HTTP port). Here the offset of a stream is ``{node: next offset}`` for
each nsqd node (``nsqdHttpAddresses``); ``latestOffset`` asks each node for its latest offset,
``partitions(start, end)`` splits each node's range into tasks, and ``read`` runs on the
executors and fetches its range straight from the node: no message passes through the driver.
Replaying a batch reads the same records again, so with an idempotent sink (the file sink,
foreachBatch keyed on the batch id) the output is exactly-once. Nothing is acknowledged: the
offsets live in Spark's checkpoint.

Talking to the nodes (``/topic/offsets``, ``/topic/log`` with its checked records,
nsqlookupd) is ``pynsqd.client``'s: this module keeps only the Spark side.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import LongType, StructField, StructType

from pynsqd.client import (
    LogOffsetOutOfRange,
    NsqError,
    NsqLookupError,
    lookup_http_addresses,
    read_log,
    topic_offsets,
)

from .channel_source import SOURCE_SCHEMA
from .options import LogOptions, NsqOptionError

log = logging.getLogger("pynsqd_spark.log")

LOG_SCHEMA = StructType([*SOURCE_SCHEMA.fields, StructField("offset", LongType())])
_ARROW_SCHEMA = to_arrow_schema(LOG_SCHEMA, timezone="UTC")
_READ_BYTES = 16 << 20


class NsqDataLoss(RuntimeError):
    """Records the query had not read yet were removed by retention (``failOnDataLoss``)."""


# -- talking to a node (pynsqd.client's cluster side) ----------------------------------------


def node_offsets(node: str, opts: LogOptions, timestamp_ms: int | None = None) -> dict[str, Any]:
    """``/topic/offsets`` of one node; raises NsqError with the node's own error text."""
    return topic_offsets(node, opts.topic, opts.http, timestamp_ms)


def discover(opts: LogOptions) -> list[str]:
    """The nodes to read: the given ones and those nsqlookupd lists for the topic (a lookupd
    that does not answer is logged; the others still count)."""
    nodes = list(opts.nodes)
    if not opts.lookupd:
        return nodes
    try:
        found = lookup_http_addresses(opts.lookupd, opts.topic, opts.http.timeout)
    except NsqLookupError as e:
        log.warning("nsq log source: %s", e)
        return nodes
    for node in found.values():
        if node not in nodes:
            nodes.append(node)
    return nodes


def _latest(node: str, opts: LogOptions) -> int | None:
    """A node's latest offset, or None while it cannot be asked (it is down, restarting)."""
    try:
        return int(node_offsets(node, opts)["latest"])
    except (NsqError, ConnectionError, ValueError, KeyError) as e:
        log.warning("nsq log source: %s", e)
        return None


def retained_everywhere(options: Mapping[str, str]) -> bool:
    """For ``mode=auto``: every node in ``nsqdHttpAddresses`` has the topic with retention."""
    try:
        opts = LogOptions.parse(options)
        nodes = discover(opts)
        return bool(nodes) and all(node_offsets(n, opts) for n in nodes)
    except (NsqOptionError, NsqError, ConnectionError, ValueError):
        return False


def fetch(
    node: str, opts: LogOptions, start: int, end: int
) -> Iterator[tuple[int, int, bytes, int, bytes]]:
    """Records ``[start, end)`` of one node: (offset, timestamp ns, id, attempts, body).
    Records pruned before ``start`` was read raise ``NsqDataLoss`` (or, without
    ``failOnDataLoss``, are skipped and logged)."""
    offset = start
    while offset < end:
        try:
            chunk = read_log(
                node,
                opts.topic,
                offset,
                opts.http,
                max_messages=end - offset,
                max_bytes=_READ_BYTES,
            )
        except LogOffsetOutOfRange as e:
            if e.earliest <= offset:
                raise
            message = (
                f"nsq log source: nsqd {node} topic {opts.topic}: offsets {offset}-"
                f"{min(e.earliest, end) - 1} were removed by retention before they were read"
            )
            if opts.fail_on_data_loss:
                raise NsqDataLoss(message + " (failOnDataLoss=false skips them)") from None
            log.warning("%s; skipped %d records", message, min(e.earliest, end) - offset)
            offset = e.earliest
            continue
        if chunk.first > offset:  # a gap the node skipped (records lost to damage, or pruned)
            log.warning(
                "nsq log source: nsqd %s topic %s: offsets %d-%d are not in the log; skipped",
                node,
                opts.topic,
                offset,
                min(chunk.first, end) - 1,
            )
        for r in chunk.records:
            if r.offset >= end:
                return
            yield r.offset, r.timestamp, r.id, r.attempts, r.body
        if chunk.next <= offset:
            return  # the node has nothing more (retention moved past, or caught up)
        offset = chunk.next


# -- partitions and readers ---------------------------------------------------------------------


class LogPartition(InputPartition):
    """One task: records ``[start, end)`` of one node."""

    def __init__(self, node: str, start: int, end: int) -> None:
        super().__init__((node, start, end))
        self.node, self.start, self.end = node, start, end


def split(start: Mapping[str, int], end: Mapping[str, int], tasks: int) -> list[LogPartition]:
    """Each node's range in up to ``tasks / nodes`` (at least one) equal parts."""
    nodes = [n for n in end if end[n] > start.get(n, 0)]
    per = max(1, tasks // max(1, len(end)))
    out: list[LogPartition] = []
    for n in nodes:
        lo, hi = start.get(n, 0), end[n]
        step = -(-(hi - lo) // per)
        out += [LogPartition(n, a, min(a + step, hi)) for a in range(lo, hi, step)]
    return out


def read_partition(p: LogPartition, opts: LogOptions) -> Iterator[Any]:
    """Arrow record batches of a partition, on the executor."""
    cols: dict[str, list[Any]] = {k: [] for k in ("body", "id", "ts", "attempts", "offset")}

    def batch() -> Any:
        n = len(cols["offset"])
        out = pa.RecordBatch.from_arrays(
            [
                pa.array(cols["body"], pa.binary()),
                pa.array(cols["id"], pa.string()),
                pa.array(cols["ts"], pa.timestamp("us", tz="UTC")),
                pa.array(cols["attempts"], pa.int32()),
                pa.array([p.node] * n, pa.string()),
                pa.array([opts.topic] * n, pa.string()),
                pa.nulls(n, pa.string()),
                pa.array(cols["offset"], pa.int64()),
            ],
            schema=_ARROW_SCHEMA,
        )
        for v in cols.values():
            v.clear()
        return out

    for offset, ts, msg_id, attempts, body in fetch(p.node, opts, p.start, p.end):
        cols["body"].append(body)
        cols["id"].append(msg_id.decode("ascii", "replace"))
        cols["ts"].append(ts // 1000)
        cols["attempts"].append(attempts)
        cols["offset"].append(offset)
        if len(cols["offset"]) >= 65536:
            yield batch()
    if cols["offset"]:
        yield batch()


def resolve_start(opts: LogOptions) -> dict[str, int]:
    """Where a new query (or a batch read) starts on each node."""
    out: dict[str, int] = {}
    for node in discover(opts):
        if opts.starting_timestamp_ms is not None:
            out[node] = int(node_offsets(node, opts, opts.starting_timestamp_ms)["offset"])
            continue
        doc = node_offsets(node, opts)
        want = opts.starting if isinstance(opts.starting, str) else opts.starting.get(node, -2)
        if want in ("earliest", -2):
            out[node] = int(doc["earliest"])
        elif want in ("latest", -1):
            out[node] = int(doc["latest"])
        else:
            out[node] = int(want)
    return out


class NsqLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: LogOptions) -> None:
        self.opts = opts
        # Trigger.AvailableNow: each node's latest offset when the query started; batches
        # (still bounded by maxOffsetsPerTrigger) never go past it, so the query ends.
        self._target: dict[str, int] | None = None

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {
            n: v for n in discover(self.opts) if (v := _latest(n, self.opts)) is not None
        }

    def initialOffset(self) -> dict[str, int]:
        return resolve_start(self.opts)

    def getDefaultReadLimit(self) -> ReadLimit:
        cap = self.opts.max_offsets_per_trigger
        return ReadMaxRows(cap) if cap else ReadAllAvailable()

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, int]:
        latest: dict[str, int] = {}
        for n in discover(self.opts) + [n for n in (start or {}) if n not in self.opts.nodes]:
            value = _latest(n, self.opts)
            if value is not None:
                latest[n] = value
            elif start is not None and n in start:
                latest[n] = start[n]  # down for now: no progress on it, the others go on
        if start is None:
            return latest
        # Never behind where the query is (a node that lost its log does not move it back); a
        # node that appeared since (through nsqlookupd) is read from its earliest offset.
        end = {n: max(latest[n], start.get(n, latest[n])) for n in latest}
        end.update({n: start[n] for n in start if n not in end})
        if self._target is not None:  # AvailableNow: nothing past what was there at the start
            end = {
                n: max(start.get(n, 0), min(v, self._target.get(n, start.get(n, 0))))
                for n, v in end.items()
            }
        if not isinstance(limit, ReadMaxRows):
            return end
        # maxOffsetsPerTrigger: at most this many records per batch, shared by the nodes that
        # are behind.
        behind = [n for n in end if n in start and end[n] > start[n]]
        share = max(1, max(1, limit.max_rows) // max(1, len(behind)))
        for n in behind:
            end[n] = min(end[n], start[n] + share)
        return end

    def reportLatestOffset(self) -> dict[str, int] | None:
        """Each node's latest offset, shown as the source's ``latestOffset`` in the query's
        progress: beside ``endOffset`` it says how far behind the query is, per node."""
        latest = {n: _latest(n, self.opts) for n in discover(self.opts)}
        return {n: v for n, v in latest.items() if v is not None} or None

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        start = dict(start)
        for n in end:
            if n not in start:  # a node new to the query: from its earliest offset
                start[n] = min(end[n], int(node_offsets(n, self.opts)["earliest"]))
        return list(split(start, end, self.opts.min_partitions))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        # An empty range plans no partitions, and Spark then runs one task with
        # InputPartition(None): it reads nothing.
        if isinstance(partition, LogPartition):
            yield from read_partition(partition, self.opts)

    def commit(self, end: dict[str, int]) -> None:
        pass  # nothing to acknowledge: the offsets live in Spark's checkpoint


class NsqLogBatchReader(DataSourceReader):
    """``spark.read.format("nsq")`` over ``[startingOffsets, endingOffsets)``."""

    def __init__(self, opts: LogOptions) -> None:
        self.opts = opts
        start = resolve_start(opts)
        if opts.ending == "latest":
            end = {n: int(node_offsets(n, opts)["latest"]) for n in start}
        elif isinstance(opts.ending, dict):
            end = {n: opts.ending.get(n, start[n]) for n in start}
        else:
            raise NsqOptionError("option 'endingOffsets' cannot be 'earliest'")
        self._parts = split(start, end, opts.min_partitions)

    def partitions(self) -> list[InputPartition]:
        return list(self._parts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        # An empty range plans no partitions, and Spark then runs one task with
        # InputPartition(None): it reads nothing.
        if isinstance(partition, LogPartition):
            yield from read_partition(partition, self.opts)
