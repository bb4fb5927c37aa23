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
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
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
    LogChunk,
    LogOffsetOutOfRange,
    NodeHTTPError,
    NsqError,
    NsqLookupError,
    find_nodes,
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


class NsqLogIdentityError(RuntimeError):
    """Two nsqd processes answer with one storage id (a copied data directory): their logs
    differ, so the query cannot key its offsets by it."""


class NsqReadError(RuntimeError):
    """A planned range could not be read within ``readRetryTimeoutMs``."""


@dataclass(frozen=True)
class NodeLog:
    """One log of the topic, as a survey found it. ``key`` is its identity, which the query's
    offsets are keyed by: a node's storage id (``storage/identity.py``), whatever address
    reached it (from a node too old to say, the address); for a replicated topic, the
    partition (``<cluster>/<origin node id>``), which ``replicas`` serve (in-sync copies,
    the leader first), each read with ``partition=``."""

    key: str
    address: str
    earliest: int
    latest: int
    instance: str = ""
    partition: int | None = None
    replicas: tuple[str, ...] = ()


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
    """Each log of the topic the addresses serve, by identity: two addresses reaching one
    process count once (the first), two processes answering with one storage id are refused;
    a replicated topic's partitions, each with the copies that can serve it. A node that
    cannot be asked (down, restarting) is logged and left out, unless ``strict``."""
    found: dict[str, NodeLog] = {}
    copies: dict[str, list[tuple[str, int, dict[str, Any]]]] = {}
    todo = list(dict.fromkeys(addresses))
    for address in todo:
        try:
            doc = node_offsets(address, opts)
            held = doc.get("partitions")
            if isinstance(held, list) and doc.get("cluster") is not None:
                # The cluster's other nodes hold copies too: asked as well (one given node
                # is enough to find them all; one that is down is logged and passed over).
                nodes = doc.get("nodes")
                if isinstance(nodes, dict):
                    todo += [a for a in nodes.values() if isinstance(a, str) and a not in todo]
                # Its own log is its own partition: keyed, like every copy, by partition.
                for q in held:
                    key = f"{doc['cluster']}/{int(q['partition'])}"
                    copies.setdefault(key, []).append((address, int(doc["node_id"]), q))
                continue
            here = NodeLog(
                str(doc.get("storage_id") or address),
                address,
                int(doc["earliest"]),
                int(doc["latest"]),
                str(doc.get("instance") or ""),
            )
        except (NsqError, ConnectionError, ValueError, KeyError, TypeError) as e:
            if strict:
                raise
            log.warning("nsq log source: %s", e)
            continue
        seen = found.get(here.key)
        if seen is None:
            found[here.key] = here
        elif seen.instance != here.instance:
            raise NsqLogIdentityError(
                f"nsq log source: nsqd {seen.address} and {here.address} both answer with "
                f"storage id {here.key} but are different processes (a copied data "
                f"directory?): give each node its own --data-path"
            )
    for key, entries in copies.items():
        found[key] = _partition(key, entries)
    return found


def _partition(key: str, entries: list[tuple[str, int, dict[str, Any]]]) -> NodeLog:
    """A replicated partition from the copies found: readable up to the highest committed
    offset (the leader's), from the copies its leader counts in sync (all found, when the
    leader is not among them: it is down, or being replaced), the leader first."""
    leaders = [e for e in entries if e[2].get("role") == "leader"]
    leader = max(leaders, key=lambda e: int(e[2].get("epoch", 0))) if leaders else None
    isr = {int(n) for n in leader[2].get("isr", [])} if leader is not None else None
    usable = [e for e in entries if isr is None or e[1] in isr] or entries
    usable.sort(key=lambda e: (e is not leader, -int(e[2]["committed"])))
    return NodeLog(
        key,
        usable[0][0],
        max(int(e[2]["earliest"]) for e in usable),
        max(int(e[2]["committed"]) for e in usable),
        partition=int(usable[0][2]["partition"]),
        replicas=tuple(dict.fromkeys(e[0] for e in usable)),
    )


def _rekey(offsets: Mapping[str, int], logs: Mapping[str, NodeLog]) -> dict[str, int]:
    """Offsets keyed by address (given by the user, or a checkpoint written before the query
    keyed them by identity) keyed by the identity of the node at that address, where known."""
    by_address = {n.address: n.key for n in logs.values()}
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


def _retrying(address: str, key: str, opts: LogOptions, what: str) -> Iterator[float]:
    """Yields before each try of a read (the time waited so far); raises NsqReadError once
    ``readRetryTimeoutMs`` is spent. The caller breaks out when a try succeeds."""
    began = time.monotonic()
    wait = opts.read_retry_backoff_ms / 1000
    tries = 0
    while True:
        yield time.monotonic() - began
        tries += 1
        spent = time.monotonic() - began
        if spent + wait > opts.read_retry_timeout_ms / 1000:
            raise NsqReadError(
                f"nsq log source: nsqd {address} (storage {key}) topic {opts.topic}: {what} "
                f"unreadable after {tries} tries in {spent:.1f}s (option readRetryTimeoutMs)"
            )
        time.sleep(wait)
        wait = min(wait * 2, 2.0)


def fetch(
    node: str,
    opts: LogOptions,
    start: int,
    end: int,
    key: str = "",
    replicas: tuple[str, ...] = (),
    partition: int | None = None,
) -> Iterator[tuple[int, int, bytes, int, bytes]]:
    """Records ``[start, end)`` of one log: (offset, timestamp ns, id, attempts, body), read
    at ``node`` or, for a replicated partition, at the first of ``replicas`` that has them
    committed. A node that does not answer (restarting) is tried again, after the other
    copies, for ``readRetryTimeoutMs``; one that answers with another log than ``key`` is an
    error. Records pruned before ``start`` was read raise ``NsqDataLoss`` (or, without
    ``failOnDataLoss``, are skipped and logged)."""
    candidates = list(dict.fromkeys([node, *replicas]))
    offset = start
    while offset < end:
        what = f"offsets {offset}-{end - 1}"
        chunk: LogChunk | None = None
        errors: list[str] = []
        for waited in _retrying(node, key or node, opts, what):
            if errors:
                log.warning(
                    "nsq log source: nsqd %s topic %s: %s: retrying (%.1fs so far) - %s",
                    node,
                    opts.topic,
                    what,
                    waited,
                    "; ".join(errors),
                )
            errors = []
            for i, address in enumerate(candidates):
                last = i == len(candidates) - 1
                try:
                    got = read_log(
                        address,
                        opts.topic,
                        offset,
                        opts.http,
                        max_messages=end - offset,
                        max_bytes=_READ_BYTES,
                        partition=partition,
                    )
                except ConnectionError as e:
                    errors.append(str(e))
                    continue
                except NodeHTTPError as e:
                    if e.status < 500 and partition is None:
                        raise
                    errors.append(str(e))  # a copy that lost the partition: another has it
                    continue
                except LogOffsetOutOfRange as e:
                    if e.earliest <= offset:
                        if not last:
                            errors.append(str(e))
                            continue
                        raise
                    if not last:  # pruned here: another copy may still have them
                        errors.append(str(e))
                        continue
                    message = (
                        f"nsq log source: nsqd {address} topic {opts.topic}: offsets {offset}-"
                        f"{min(e.earliest, end) - 1} were removed by retention before they "
                        f"were read"
                    )
                    if opts.fail_on_data_loss:
                        raise NsqDataLoss(message + " (failOnDataLoss=false skips them)") from None
                    log.warning("%s; skipped %d records", message, min(e.earliest, end) - offset)
                    offset = e.earliest
                    break
                if partition is not None and got.next <= offset:
                    # This copy has not learnt yet that the range is committed: another may.
                    errors.append(f"nsqd {address} has committed less than offset {offset + 1}")
                    continue
                chunk = got
                if i:  # the copies that failed go last for the next chunks (a paused one
                    # would cost a timeout each time)
                    candidates = candidates[i:] + candidates[:i]
                break
            if chunk is not None or not errors:
                break
        if chunk is None:
            continue  # records skipped (failOnDataLoss=false): from the new offset
        planned = partition is None and key and key != node  # on a storage id: check it
        if planned and chunk.storage_id and chunk.storage_id != key:
            raise NsqLogIdentityError(
                f"nsq log source: nsqd {node} topic {opts.topic}: the node there now has "
                f"storage id {chunk.storage_id}, the range was planned on {key}"
            )
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

    rows = fetch(p.node, opts, p.start, p.end, p.key, p.replicas, p.partition)
    for offset, ts, msg_id, attempts, body in rows:
        cols["body"].append(body)
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
        pass  # nothing to acknowledge: the offsets live in Spark's checkpoint


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
