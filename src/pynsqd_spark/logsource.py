"""Log mode: read a replayable topic by offset, on the executors, as Spark's Kafka source does.

A pynsqd topic with retention keeps a log addressed by offset (``GET /topic/offsets``, ``GET
/topic/log`` on each nsqd's HTTP port). Here the offset of a stream is ``{node: next offset}`` for
each nsqd node (``nsqdHttpAddresses``); ``latestOffset`` asks each node for its latest offset,
``partitions(start, end)`` splits each node's range into tasks, and ``read`` runs on the
executors and fetches its range straight from the node: no message passes through the driver.
Replaying a batch reads the same records again, so with an idempotent sink (the file sink,
foreachBatch keyed on the batch id) the output is exactly-once. Nothing is acknowledged: the
offsets live in Spark's checkpoint.

Records are the log's own framing (big-endian): int64 offset, uint32 crc32 of the rest, uint32
length, int64 timestamp (ns), 16-byte ID, uint16 attempts, uint32 deferral (ms), body.
"""

from __future__ import annotations

import json
import logging
import ssl
import struct
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Iterator, Mapping
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

from .options import NsqOptionError, _check_name, _Opts
from .source import SOURCE_SCHEMA

log = logging.getLogger("pynsqd_spark.log")

LOG_SCHEMA = StructType([*SOURCE_SCHEMA.fields, StructField("offset", LongType())])
_ARROW_SCHEMA = to_arrow_schema(LOG_SCHEMA, timezone="UTC")
_HEAD = struct.Struct(">qII")  # offset, crc, length
_TAIL = struct.Struct(">q16sHI")  # timestamp, id, attempts, defer
_HEADER = _HEAD.size + _TAIL.size  # 46
_READ_BYTES = 16 << 20

#: Every option log mode reads (names are case-insensitive).
LOG_OPTIONS = (
    "mode",
    "topic",
    "nsqdHttpAddresses",
    "nsqlookupdHttpAddresses",
    "startingOffsets",
    "startingTimestamp",
    "endingOffsets",
    "maxOffsetsPerTrigger",
    "minPartitions",
    "failOnDataLoss",
    "authSecret",
    "timeoutMs",
    "tls",
    "tlsVerify",
    "tlsCaFile",
    "tlsCertFile",
    "tlsKeyFile",
)


class NsqDataLoss(RuntimeError):
    """Records the query had not read yet were removed by retention (``failOnDataLoss``)."""


@dataclass(frozen=True)
class LogOptions:
    topic: str
    nodes: tuple[str, ...]  # given nsqd HTTP addresses
    lookupd: tuple[str, ...]  # nsqlookupd HTTP addresses: nodes discovered for the topic
    starting: str | dict[str, int]  # "earliest", "latest" or {node: offset}
    starting_timestamp_ms: int | None
    ending: str | dict[str, int]  # batch reads: "latest" or {node: offset}
    max_offsets_per_trigger: int
    min_partitions: int
    fail_on_data_loss: bool
    auth_secret: str | None
    timeout: float
    tls: bool = False  # the addresses are nsqd's --https-address
    tls_verify: bool = True
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> LogOptions:
        o = _Opts(options)
        unknown = sorted(
            k for k in o._o if k not in {n.lower() for n in LOG_OPTIONS} and k != "path"
        )
        if unknown:
            raise NsqOptionError(
                f"unknown option(s) {', '.join(repr(k) for k in unknown)} for mode 'log'; "
                f"valid: {', '.join(LOG_OPTIONS)}"
            )
        topic = o.get("topic")
        if topic is None:
            raise NsqOptionError("option 'topic' is required")
        _check_name("topic", "topic", topic)
        nodes = tuple(o.addresses("nsqdHttpAddresses", 4151))
        lookupd = tuple(o.addresses("nsqlookupdHttpAddresses", 4161))
        if not nodes and not lookupd:
            raise NsqOptionError(
                "mode 'log' reads each nsqd's HTTP port: set option 'nsqdHttpAddresses' "
                "(host:port,...) or 'nsqlookupdHttpAddresses'"
            )
        tls = o.boolean("tls", False)
        if tls and lookupd:
            raise NsqOptionError(
                "option 'tls' in mode 'log': give each nsqd's HTTPS address in "
                "'nsqdHttpAddresses' (nsqlookupd only knows their plain HTTP ports)"
            )
        return cls(
            topic=topic,
            nodes=nodes,
            lookupd=lookupd,
            starting=_offsets_option(o, "startingOffsets", "earliest", nodes),
            starting_timestamp_ms=(
                o.integer("startingTimestamp", 0) if o.get("startingTimestamp") else None
            ),
            ending=_offsets_option(o, "endingOffsets", "latest", nodes),
            max_offsets_per_trigger=o.integer("maxOffsetsPerTrigger", 0),
            min_partitions=o.integer("minPartitions", len(nodes), 1),
            fail_on_data_loss=o.boolean("failOnDataLoss", True),
            auth_secret=o.get("authSecret"),
            timeout=o.integer("timeoutMs", 30000, 1) / 1000,
            tls=tls,
            tls_verify=o.boolean("tlsVerify", True),
            tls_ca_file=o.get("tlsCaFile"),
            tls_cert_file=o.get("tlsCertFile"),
            tls_key_file=o.get("tlsKeyFile"),
        )


def _offsets_option(
    o: _Opts, name: str, default: str, nodes: tuple[str, ...]
) -> str | dict[str, int]:
    v = o.get(name)
    if v is None:
        return default
    v = v.strip()
    if v.lower() in ("earliest", "latest"):
        return v.lower()
    try:
        doc = json.loads(v)
        if not isinstance(doc, dict) or not all(
            isinstance(n, int) and n >= -2 for n in doc.values()
        ):
            raise ValueError
    except ValueError:
        raise NsqOptionError(
            f"option {name!r} must be 'earliest', 'latest' or JSON {{\"host:port\": offset}}"
            f" (-2 earliest, -1 latest), got {v!r}"
        ) from None
    stray = sorted(set(doc) - set(nodes))
    if stray and nodes:
        raise NsqOptionError(f"option {name!r} names nodes not in 'nsqdHttpAddresses': {stray}")
    return {str(k): int(n) for k, n in doc.items()}


# -- talking to a node --------------------------------------------------------------------------


_CONTEXTS: dict[tuple[Any, ...], ssl.SSLContext] = {}


def _ssl_context(opts: LogOptions) -> ssl.SSLContext:
    """One context per set of TLS options and process (built on the executor, not pickled)."""
    key = (opts.tls_verify, opts.tls_ca_file, opts.tls_cert_file, opts.tls_key_file)
    ctx = _CONTEXTS.get(key)
    if ctx is None:
        ctx = ssl.create_default_context(cafile=opts.tls_ca_file)
        if not opts.tls_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if opts.tls_cert_file:
            ctx.load_cert_chain(opts.tls_cert_file, opts.tls_key_file)
        _CONTEXTS[key] = ctx
    return ctx


def _request(node: str, path: str, opts: LogOptions) -> tuple[int, dict[str, str], bytes]:
    headers = {"Accept": "application/vnd.nsq; version=1.0"}
    if opts.auth_secret:
        headers["X-Nsq-Auth-Secret"] = opts.auth_secret
    scheme = "https" if opts.tls else "http"
    req = urllib.request.Request(f"{scheme}://{node}{path}", headers=headers)
    context = _ssl_context(opts) if opts.tls else None
    try:
        with urllib.request.urlopen(req, timeout=opts.timeout, context=context) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {}, e.read()
    except OSError as e:
        raise ConnectionError(f"nsq log source: nsqd {node} unreachable - {e}") from None


def node_offsets(node: str, opts: LogOptions, timestamp_ms: int | None = None) -> dict[str, Any]:
    """``/topic/offsets`` of one node; raises with the node's own error text."""
    query = {"topic": opts.topic}
    if timestamp_ms is not None:
        query["timestamp"] = str(timestamp_ms)
    status, _, body = _request(node, "/topic/offsets?" + urllib.parse.urlencode(query), opts)
    if status != 200:
        text = body.decode(errors="replace")
        raise RuntimeError(f"nsq log source: nsqd {node} topic {opts.topic}: {status} {text}")
    doc: dict[str, Any] = json.loads(body)
    return doc


def discover(opts: LogOptions) -> list[str]:
    """The nodes to read: the given ones and those nsqlookupd lists for the topic (a lookupd
    that does not answer is logged; the others still count)."""
    nodes = list(opts.nodes)
    for lookupd in opts.lookupd:
        url = f"http://{lookupd}/lookup?" + urllib.parse.urlencode({"topic": opts.topic})
        req = urllib.request.Request(url, headers={"Accept": "application/vnd.nsq; version=1.0"})
        try:
            with urllib.request.urlopen(req, timeout=opts.timeout) as r:
                doc = json.loads(r.read())
        except urllib.error.HTTPError as e:
            if e.code != 404:  # 404: no node has the topic yet
                log.warning("nsq log source: nsqlookupd %s: %s", lookupd, e)
            continue
        except (OSError, ValueError) as e:
            log.warning("nsq log source: nsqlookupd %s unreachable - %s", lookupd, e)
            continue
        for p in (doc.get("data", doc) if isinstance(doc, dict) else {}).get("producers") or []:
            node = f"{p.get('broadcast_address')}:{p.get('http_port')}"
            if node not in nodes:
                nodes.append(node)
    return nodes


def _latest(node: str, opts: LogOptions) -> int | None:
    """A node's latest offset, or None while it cannot be asked (it is down, restarting)."""
    try:
        return int(node_offsets(node, opts)["latest"])
    except (RuntimeError, ConnectionError, ValueError, KeyError) as e:
        log.warning("nsq log source: %s", e)
        return None


def retained_everywhere(options: Mapping[str, str]) -> bool:
    """For ``mode=auto``: every node in ``nsqdHttpAddresses`` has the topic with retention."""
    try:
        opts = LogOptions.parse(options)
        nodes = discover(opts)
        return bool(nodes) and all(node_offsets(n, opts) for n in nodes)
    except (NsqOptionError, RuntimeError, ConnectionError, ValueError):
        return False


def fetch(
    node: str, opts: LogOptions, start: int, end: int
) -> Iterator[tuple[int, int, bytes, int, bytes]]:
    """Records ``[start, end)`` of one node: (offset, timestamp ns, id, attempts, body).
    Records pruned before ``start`` was read raise ``NsqDataLoss`` (or, without
    ``failOnDataLoss``, are skipped and logged)."""
    offset = start
    while offset < end:
        query = urllib.parse.urlencode(
            {
                "topic": opts.topic,
                "offset": offset,
                "max_messages": end - offset,
                "max_bytes": _READ_BYTES,
            }
        )
        status, headers, body = _request(node, "/topic/log?" + query, opts)
        if status == 400 and b"OFFSET_OUT_OF_RANGE" in body:
            earliest = int(json.loads(body)["earliest"])
            if earliest <= offset:
                raise RuntimeError(f"nsq log source: nsqd {node}: {body.decode()}")
            message = (
                f"nsq log source: nsqd {node} topic {opts.topic}: offsets {offset}-"
                f"{min(earliest, end) - 1} were removed by retention before they were read"
            )
            if opts.fail_on_data_loss:
                raise NsqDataLoss(message + " (failOnDataLoss=false skips them)")
            log.warning("%s; skipped %d records", message, min(earliest, end) - offset)
            offset = earliest
            continue
        if status != 200:
            raise RuntimeError(
                f"nsq log source: nsqd {node}: {status} {body.decode(errors='replace')}"
            )
        first = int(headers.get("x-nsq-first-offset", offset))
        if first > offset:  # a gap the node skipped (records lost to damage, or pruned)
            log.warning(
                "nsq log source: nsqd %s topic %s: offsets %d-%d are not in the log; skipped",
                node,
                opts.topic,
                offset,
                min(first, end) - 1,
            )
        view = memoryview(body)
        pos = 0
        while pos + _HEADER <= len(body):
            rec_offset, crc, length = _HEAD.unpack_from(body, pos)
            stop = pos + 16 + length
            if stop > len(body) or zlib.crc32(view[pos + 12 : stop]) != crc:
                raise RuntimeError(
                    f"nsq log source: nsqd {node}: damaged record at offset {rec_offset}"
                )
            if rec_offset >= end:
                return
            ts, msg_id, attempts, _ = _TAIL.unpack_from(body, pos + 16)
            yield rec_offset, ts, msg_id, attempts, body[pos + _HEADER : stop]
            pos = stop
        nxt = int(headers.get("x-nsq-next-offset", offset))
        if nxt <= offset:
            return  # the node has nothing more (retention moved past, or caught up)
        offset = nxt


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
