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

import dataclasses
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
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
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from pynsqd.client import (
    LogIdentityError,
    NodeLog,
    NsqError,
    NsqLookupError,
    RangeUnreadable,
    find_nodes,
    read_range,
    report_reader,
    survey_logs,
    topic_offsets,
)
from pynsqd.protocol.headers import decode as decode_headers

from .channel_source import SOURCE_SCHEMA
from .options import LogOptions, NsqOptionError

log = logging.getLogger("pynsqd_spark.log")
#: How long a commit's report to a node (its lag in /stats) may take, seconds.
REPORT_TIMEOUT = 2.0
#: How often an unchanged commit is reported again, seconds.
REPORT_EVERY = 60.0

LOG_SCHEMA = StructType([*SOURCE_SCHEMA.fields, StructField("offset", LongType())])
_ARROW_SCHEMA = to_arrow_schema(LOG_SCHEMA, timezone="UTC")
#: ``includeHeaders``: each message's headers (``docs/headers.md``), as Spark's Kafka source
#: gives them: an array of (key, value) in their order, empty for a message without.
HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
LOG_SCHEMA_WITH_HEADERS = StructType([*LOG_SCHEMA.fields, StructField("headers", HEADERS_TYPE)])
_ARROW_SCHEMA_WITH_HEADERS = to_arrow_schema(LOG_SCHEMA_WITH_HEADERS, timezone="UTC")
_ARROW_HEADERS = _ARROW_SCHEMA_WITH_HEADERS.field("headers").type


class NsqDataLoss(RuntimeError):
    """Records the query had not read yet were removed by retention (``failOnDataLoss``)."""


# -- talking to a node (pynsqd.client's cluster side) ----------------------------------------


class NsqLogIdentityError(LogIdentityError):
    """Two nsqd processes answer with one storage id (a copied data directory): their logs
    differ, so the query cannot key its offsets by it."""


class NsqReadError(RuntimeError):
    """A planned range could not be read within ``readRetryTimeoutMs``."""


def _warn(message: str) -> None:
    log.warning("nsq log source: %s", message)


def node_offsets(
    node: str, opts: LogOptions, timestamp_ms: int | None = None, partition: int | None = None
) -> dict[str, Any]:
    """``/topic/offsets`` of one node; raises NsqError with the node's own error text."""
    return topic_offsets(node, opts.topic, opts.http, timestamp_ms, partition=partition)


def discover(opts: LogOptions, *, strict: bool = False) -> list[str]:
    """The addresses to ask: the given ones and those nsqlookupd lists for the topic. A lookupd
    that does not answer is logged, unless ``strict`` and no address was given: then nothing
    could be known, which is an error rather than "no data"."""
    nodes, err = find_nodes(opts.nodes, opts.lookupd, opts.topic, opts.http.timeout, port="http")
    if err is not None:
        if strict and not opts.nodes:
            raise NsqLookupError(f"option 'nsqlookupdHttpAddresses': {err}") from None
        log.warning("nsq log source: %s", err)
    return nodes


def survey(
    opts: LogOptions, addresses: Iterable[str], *, strict: bool = False
) -> dict[str, NodeLog]:
    """Each log of the topic the addresses serve, by identity (``pynsqd.client``'s
    ``survey_logs``): a node that cannot be asked is logged and left out, unless ``strict``."""
    try:
        return survey_logs(opts.topic, addresses, opts.http, strict=strict, warn=_warn)
    except LogIdentityError as e:
        raise NsqLogIdentityError(f"nsq log source: {e}") from None


def _rekey(offsets: Mapping[str, int], logs: Mapping[str, NodeLog]) -> dict[str, int]:
    """Offsets keyed by address (given by the user, or a checkpoint written before the query
    keyed them by identity) keyed by the identity of the node at that address, where known;
    a key that is another name of a log (a ``--workers`` node's worker, whose log an older
    version read as the node's one log: ``NodeLog.aliases``) keyed by that log's."""
    by_address = {n.address: n.key for n in logs.values()}
    by_address.update({a: n.key for n in logs.values() for a in n.aliases})
    out: dict[str, int] = {}
    for k, v in offsets.items():
        key = k if k in logs else by_address.get(k, k)
        out[key] = max(v, out.get(key, v))
    return out


def retained_everywhere(options: Mapping[str, str]) -> str | None:
    """For ``mode=auto``: None when every node found (``nsqdHttpAddresses``, and those
    nsqlookupd names) has the topic with retention; else why not."""
    try:
        opts = LogOptions.parse(options)
        nodes = discover(opts, strict=True)
        if not nodes:
            return f"no nsqd has topic {opts.topic!r}"
        survey(opts, nodes, strict=True)
        return None
    except (NsqOptionError, NsqError, ConnectionError, ValueError, NsqLogIdentityError) as e:
        return str(e)


def _retention_of(address: str, opts: LogOptions) -> str:
    """`` (retention time T, bytes B: ...)``: the setting that removed records, as the node
    says it now ("" when it does not answer)."""
    try:
        doc = topic_offsets(address, opts.topic, opts.http)
    except (NsqError, ConnectionError, OSError, ValueError):
        return ""
    return (
        f" (retention time {doc.get('retention_time')}, bytes {doc.get('retention_bytes')}: "
        f"POST /topic/retention?topic={opts.topic} sets it)"
    )


def fetch(
    node: str,
    opts: LogOptions,
    start: int,
    end: int,
    key: str = "",
    replicas: tuple[str, ...] = (),
    partition: int | None = None,
) -> Iterator[tuple[int, int, bytes, int, bytes, bytes]]:
    """Records ``[start, end)`` of one log: (offset, timestamp ns, id, attempts, body, header
    block), read
    with failover between its copies by ``pynsqd.client``'s ``read_range``, for
    ``readRetryTimeoutMs``. Records pruned before ``start`` was read raise ``NsqDataLoss`` (or,
    without ``failOnDataLoss``, are skipped and logged)."""

    def pruned(address: str, first: int, stop: int) -> None:
        message = (
            f"nsq log source: nsqd {address} topic {opts.topic}: offsets {first}-{stop - 1} "
            f"were removed by retention{_retention_of(address, opts)} before they were read"
        )
        if opts.fail_on_data_loss:
            raise NsqDataLoss(message + " (failOnDataLoss=false skips them)")
        log.warning("%s; skipped %d records", message, stop - first)

    try:
        for r in read_range(
            opts.topic,
            node,
            start,
            end,
            opts.http,
            key=key,
            replicas=replicas,
            partition=partition,
            retry_timeout=opts.read_retry_timeout_ms / 1000,
            retry_backoff=opts.read_retry_backoff_ms / 1000,
            on_pruned=pruned,
            warn=_warn,
        ):
            yield r.offset, r.timestamp, r.id, r.attempts, r.body, r.headers
    except RangeUnreadable as e:
        raise NsqReadError(f"nsq log source: {e} (option readRetryTimeoutMs)") from None
    except LogIdentityError as e:
        raise NsqLogIdentityError(f"nsq log source: {e}") from None


# -- partitions and readers ---------------------------------------------------------------------


class LogPartition(InputPartition):
    """One task: records ``[start, end)`` of one log (``key``), read at ``node`` (or, for a
    replicated partition, at another of ``replicas`` if it cannot be)."""

    def __init__(
        self,
        node: str,
        start: int,
        end: int,
        key: str = "",
        replicas: tuple[str, ...] = (),
        partition: int | None = None,
    ) -> None:
        super().__init__((key or node, node, start, end))
        self.node, self.start, self.end, self.key = node, start, end, key or node
        self.replicas, self.partition = replicas, partition


def split(
    start: Mapping[str, int],
    end: Mapping[str, int],
    tasks: int,
    logs: Mapping[str, NodeLog] | None = None,
) -> list[LogPartition]:
    """Each log's range in up to ``tasks / logs`` (at least one) equal parts; ``logs`` says
    where each is read (by default the key is the address). A replicated partition's parts
    start on its copies in turn, spreading the reads."""
    logs = logs or {}
    keys = [n for n in end if end[n] > start.get(n, 0)]
    per = max(1, tasks // max(1, len(end)))
    out: list[LogPartition] = []
    for k in keys:
        lo, hi = start.get(k, 0), end[k]
        step = -(-(hi - lo) // per)
        n = logs.get(k)
        for i, a in enumerate(range(lo, hi, step)):
            if n is None:
                out.append(LogPartition(k, a, min(a + step, hi), k))
                continue
            copies = n.replicas or (n.address,)
            first = copies[i % len(copies)]
            out.append(LogPartition(first, a, min(a + step, hi), k, copies, n.partition))
    return out


def read_partition(p: LogPartition, opts: LogOptions) -> Iterator[Any]:
    """Arrow record batches of a partition, on the executor."""
    names = ("body", "id", "ts", "attempts", "offset", "headers")
    cols: dict[str, list[Any]] = {k: [] for k in names}

    def batch() -> Any:
        n = len(cols["offset"])
        arrays = [
            pa.array(cols["body"], pa.binary()),
            pa.array(cols["id"], pa.string()),
            pa.array(cols["ts"], pa.timestamp("us", tz="UTC")),
            pa.array(cols["attempts"], pa.int32()),
            pa.array([p.node] * n, pa.string()),
            pa.array([opts.topic] * n, pa.string()),
            pa.nulls(n, pa.string()),
            pa.array(cols["offset"], pa.int64()),
        ]
        if opts.include_headers:
            pairs = [
                [{"key": k, "value": v} for k, v in decode_headers(h)] for h in cols["headers"]
            ]
            arrays.append(pa.array(pairs, _ARROW_HEADERS))
        out = pa.RecordBatch.from_arrays(
            arrays, schema=_ARROW_SCHEMA_WITH_HEADERS if opts.include_headers else _ARROW_SCHEMA
        )
        for v in cols.values():
            v.clear()
        return out

    rows = fetch(p.node, opts, p.start, p.end, p.key, p.replicas, p.partition)
    for offset, ts, msg_id, attempts, body, block in rows:
        cols["body"].append(body)
        cols["headers"].append(block)
        cols["id"].append(msg_id.decode("ascii", "replace"))
        cols["ts"].append(ts // 1000)
        cols["attempts"].append(attempts)
        cols["offset"].append(offset)
        if len(cols["offset"]) >= 65536:
            yield batch()
    if cols["offset"]:
        yield batch()


def resolve_start(opts: LogOptions) -> tuple[dict[str, int], dict[str, NodeLog]]:
    """Where a new query (or a batch read) starts in each log, and the logs found. Every node
    must answer: a query cannot start without knowing where."""
    logs = survey(opts, discover(opts, strict=True), strict=True)
    given = opts.starting if isinstance(opts.starting, dict) else {}
    wanted = _rekey(given, logs)
    out: dict[str, int] = {}
    for key, n in logs.items():
        if opts.starting_timestamp_ms is not None:
            at = node_offsets(n.address, opts, opts.starting_timestamp_ms, n.partition)
            out[key] = int(at["offset"])
            continue
        want = opts.starting if isinstance(opts.starting, str) else wanted.get(key, -2)
        if want in ("earliest", -2):
            out[key] = n.earliest
        elif want in ("latest", -1):
            out[key] = n.latest
        else:
            out[key] = int(want)
    return out, logs


class NsqLogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: LogOptions) -> None:
        self.opts = opts
        # Trigger.AvailableNow: each log's latest offset when the query started; batches
        # (still bounded by maxOffsetsPerTrigger) never go past it, so the query ends.
        self._target: dict[str, int] | None = None
        #: Each log (by identity) as last found: where to read it.
        self._logs: dict[str, NodeLog] = {}
        #: What each log's node was last told the query committed, and when to tell it again.
        self._reported: dict[str, tuple[int, float]] = {}

    def _survey(self, start: Mapping[str, int] | None = None) -> dict[str, NodeLog]:
        """The logs found now: through the given nodes and nsqlookupd, and where the logs the
        query already reads were last found (a node lookupd no longer lists)."""
        known = [a for k in start or {} if k in self._logs for a in self._addresses(k)]
        logs = survey(self.opts, discover(self.opts) + known)
        self._logs.update(logs)
        return logs

    def _addresses(self, key: str) -> tuple[str, ...]:
        n = self._logs[key]
        return n.replicas or (n.address,)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {k: n.latest for k, n in self._survey().items()}

    def initialOffset(self) -> dict[str, int]:
        start, logs = resolve_start(self.opts)
        self._logs.update(logs)
        return start

    def getDefaultReadLimit(self) -> ReadLimit:
        cap = self.opts.max_offsets_per_trigger
        return ReadMaxRows(cap) if cap else ReadAllAvailable()

    def latestOffset(
        self, start: dict[str, int] | None = None, limit: ReadLimit | None = None
    ) -> dict[str, int]:
        logs = self._survey(start)
        latest = {k: n.latest for k, n in logs.items()}
        if start is None:
            return latest
        self._report(start)  # where the last batch ended: it is committed when the next is planned
        # A checkpoint written when the offsets were keyed by address: by identity from now.
        start = _rekey(start, logs)
        # Never behind where the query is (a node that lost its log does not move it back); a
        # log that is down for now makes no progress while the others go on; one that
        # appeared since (through nsqlookupd) is read from its earliest offset.
        end = {k: max(v, start.get(k, v)) for k, v in latest.items()}
        end.update({k: start[k] for k in start if k not in end})
        if self._target is not None:  # AvailableNow: nothing past what was there at the start
            end = {
                k: max(start.get(k, 0), min(v, self._target.get(k, start.get(k, 0))))
                for k, v in end.items()
            }
        if not isinstance(limit, ReadMaxRows):
            return end
        # maxOffsetsPerTrigger: at most this many records per batch, shared by the logs that
        # are behind.
        behind = [k for k in end if k in start and end[k] > start[k]]
        share = max(1, max(1, limit.max_rows) // max(1, len(behind)))
        for k in behind:
            end[k] = min(end[k], start[k] + share)
        return end

    def reportLatestOffset(self) -> dict[str, int] | None:
        """Each log's latest offset, shown as the source's ``latestOffset`` in the query's
        progress: beside ``endOffset`` it says how far behind the query is, per log."""
        return {k: n.latest for k, n in self._survey().items()} or None

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[InputPartition]:
        missing = [k for k in [*start, *end] if k not in self._logs]
        if missing:  # a driver restarted from its checkpoint: where are they now?
            self._survey()
        # A batch planned before the offsets were keyed by identity: by identity now (the
        # same node, so the same range).
        start, end = _rekey(start, self._logs), _rekey(end, self._logs)
        start = {k: v for k, v in start.items() if k in end}
        for k in end:
            if k not in start:  # a log new to the query: from its earliest offset
                n = self._survey().get(k)
                start[k] = min(end[k], n.earliest if n is not None else end[k])
        return list(split(start, end, self.opts.min_partitions, self._logs))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        # An empty range plans no partitions, and Spark then runs one task with
        # InputPartition(None): it reads nothing.
        if isinstance(partition, LogPartition):
            yield from read_partition(partition, self.opts)

    def commit(self, end: dict[str, int]) -> None:
        """A batch is committed (the offsets live in Spark's checkpoint): reported
        (``_report``)."""
        self._report(end)

    def _report(self, committed: Mapping[str, int]) -> None:
        """Each log's node is told what the query (``readerName``) has committed
        (``POST /topic/reader``), so that its ``/stats``, ``/metrics`` and nsqadmin show the
        query and its lag: at a commit, and when the next batch is planned from where the last
        one ended (Spark commits a batch to its source only when it plans the next, so a
        query's last batch would otherwise never show). Only a change is sent, or the same
        offset again after ``REPORT_EVERY`` (a node forgets a reader after a day); a node that
        does not answer within ``REPORT_TIMEOUT`` is told next time. Nothing read changes."""
        now = time.monotonic()
        http = dataclasses.replace(self.opts.http, timeout=REPORT_TIMEOUT)
        for key, offset in _rekey(dict(committed), self._logs).items():
            n = self._logs.get(key)
            last = self._reported.get(key)
            if n is None or (last is not None and last[0] == offset and now < last[1]):
                continue
            self._reported[key] = (offset, now + REPORT_EVERY)
            # Every in-sync copy of a replicated partition: whichever leads it later shows
            # the query where it is (a copy that led once is not left with a stale report).
            for address in n.replicas or (n.address,):
                try:
                    report_reader(
                        address,
                        self.opts.topic,
                        self.opts.reader_name,
                        offset,
                        http,
                        partition=n.partition,
                    )
                except (NsqError, ConnectionError, OSError, ValueError) as e:
                    self._reported.pop(key, None)
                    log.debug("nsq log source: commit not reported to %s - %s", address, e)


class NsqLogBatchReader(DataSourceReader):
    """``spark.read.format("nsq")`` over ``[startingOffsets, endingOffsets)``."""

    def __init__(self, opts: LogOptions) -> None:
        self.opts = opts
        start, logs = resolve_start(opts)
        if opts.ending == "latest":
            end = {k: n.latest for k, n in logs.items()}
        elif isinstance(opts.ending, dict):
            ending = _rekey(opts.ending, logs)
            end = {k: ending.get(k, start[k]) for k in start}
        else:
            raise NsqOptionError("option 'endingOffsets' cannot be 'earliest'")
        self._parts = split(start, end, opts.min_partitions, logs)

    def partitions(self) -> list[InputPartition]:
        return list(self._parts)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        # An empty range plans no partitions, and Spark then runs one task with
        # InputPartition(None): it reads nothing.
        if isinstance(partition, LogPartition):
            yield from read_partition(partition, self.opts)
