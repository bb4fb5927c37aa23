"""``df.write.format("nsq")`` and ``df.writeStream.format("nsq")``.

Each task publishes its rows with MPUB in chunks under nsqd's limits (``maxBodySize`` per MPUB,
``maxMsgSize`` per message), a few MPUBs pipelined, on one connection per task. A broken
connection or a retriable error (E_MPUB_FAILED, E_PUB_FAILED) is retried on a fresh connection
with exponential backoff: the chunks not yet acknowledged are sent again. Rows are checked
before anything is sent: a null body is an error naming the row; an oversize or empty body
follows the ``oversize`` / ``emptyBody`` option (fail or skip).

Exactly once (``exactlyOnce``, on by default; pynsqd's idempotent publishing, ``core/dedup.py``).
Every row is published with an identity that a retry reproduces: the producer id names the
write (a streaming query's id and its batch, or a batch write's id), and the task's partition;
the sequence number is the row's position among the partition's rows for that topic. A task
retried or run speculatively, a micro-batch replayed after the driver restarted, and a chunk
sent again after a broken connection publish the same identities, and the topic writes each row
once. It takes a retained topic (a topic without a log answers ``E_NOT_RETAINED``: the sink says
how to give it one and goes on at least once) and a deterministic query (the same rows, in the
same partitions and order, when a batch runs again, as Spark's own exactly-once sinks need). A
retry stays on the node that had the rows (another node does not know them) unless that node
refuses connections; a node killed mid-write can thus leave rows written twice, on two nodes,
unless the topic is replicated. Without identities (``exactlyOnce=false``, or a node that does
not offer them: Go nsqd) a retry fails over to the next node and a chunk that was stored before
the connection broke is published twice (at-least-once).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructType

from pynsqd.client import (
    Connection,
    NsqConnectionError,
    NsqError,
    find_nodes,
)
from pynsqd.protocol import encode
from pynsqd.protocol import headers as header_codec
from pynsqd.protocol.headers import HeaderError, join_body

from .options import NsqOptionError, SinkOptions, check_name

log = logging.getLogger("pynsqd_spark.sink")

#: errors after which a retry on a fresh connection can succeed
RETRIABLE_ERRORS = frozenset({"E_PUB_FAILED", "E_MPUB_FAILED", "E_DPUB_FAILED"})


class NsqSinkError(RuntimeError):
    """A row cannot be published, or publishing failed after every retry."""


@dataclass
class NsqCommitMessage(WriterCommitMessage):
    partition_id: int = 0
    batch_id: int | None = None
    messages: int = 0
    bytes: int = 0
    skipped: int = 0
    retries: int = 0
    nodes: list[str] = field(default_factory=list)


def check_schema(schema: StructType, opts: SinkOptions) -> None:
    names = schema.fieldNames()
    if "body" not in names:
        raise NsqOptionError(
            f"the DataFrame needs a 'body' column (binary or string); it has {names}"
        )
    body_type = schema["body"].dataType
    if not isinstance(body_type, BinaryType | StringType):
        raise NsqOptionError(
            f"column 'body' must be binary or string, not {body_type.simpleString()}"
        )
    if "topic" in names and not isinstance(schema["topic"].dataType, StringType):
        raise NsqOptionError("column 'topic' must be a string")
    if "headers" in names:
        t = schema["headers"].dataType
        ok = (
            isinstance(t, ArrayType)
            and isinstance(t.elementType, StructType)
            and t.elementType.fieldNames() == ["key", "value"]
            and isinstance(t.elementType["key"].dataType, StringType)
            and isinstance(t.elementType["value"].dataType, BinaryType | StringType)
        )
        if not ok:
            raise NsqOptionError(
                "column 'headers' must be array<struct<key: string, value: binary or string>> "
                f"(as the source's includeHeaders gives), not {t.simpleString()}"
            )


class Publisher:
    """MPUBs chunks with pipelining, retries on a fresh connection and failover across nodes.

    Chunks stay in ``_outstanding`` until nsqd's OK for them arrives (responses come in order);
    after a failure all of them are sent again on a new connection.
    """

    def __init__(self, opts: SinkOptions, start_index: int = 0, headers: bool = False) -> None:
        self.opts = opts
        #: Each body is sent with its header block (a ``headers`` column): asked for in IDENTIFY.
        self._client = dataclasses.replace(opts.client, headers=True) if headers else opts.client
        self._index = start_index
        self._nodes: list[str] | None = None
        self._conn: Connection | None = None
        self.retries = 0
        self.used: list[str] = []
        #: (topic, MPUB command) sent (or about to be) and not yet acknowledged, in order
        self._outstanding: deque[tuple[str, bytes]] = deque()
        #: Topics written without identities (no log there): the commands lose theirs.
        self.plain: set[str] = set()
        #: The node offers no idempotent publishing (Go nsqd): every command loses its identity.
        self.no_identities = False

    def nodes(self, topic: str) -> list[str]:
        if self._nodes is None:
            # Sorted, so that every task sees one list whenever it asks, and task i starts on
            # node i modulo their number: an even spread.
            nodes, err = find_nodes(
                self.opts.nsqd_addresses,
                self.opts.lookupd_addresses,
                topic,
                self.opts.client.connect_timeout,
                every_node=True,
                sort_found=True,
            )
            if err is not None and not self.opts.nsqd_addresses:
                raise NsqSinkError(
                    f"option 'nsqlookupdHttpAddresses' "
                    f"({','.join(self.opts.lookupd_addresses)}): {err}"
                ) from err
            if not nodes:
                raise NsqSinkError(
                    "option 'nsqlookupdHttpAddresses': no nsqd is registered with nsqlookupd"
                )
            self._nodes = nodes
        return self._nodes

    def _connection(self, topic: str) -> Connection:
        if self._conn is None or self._conn.closed:
            nodes = self.nodes(topic)
            node = nodes[self._index % len(nodes)]
            self._conn = Connection(node, self._client).connect()
            if node not in self.used:
                self.used.append(node)
            offered = self._conn.identify_response.get("idempotent_publish") is True
            if self.opts.exactly_once and not offered and not self.no_identities:
                self.no_identities = True
                log.warning(
                    "nsq sink: nsqd %s does not offer idempotent publishing (pynsqd does; Go "
                    "nsqd does not): writes to it are at-least-once",
                    node,
                )
        return self._conn

    def _wire(self, topic: str, command: bytes) -> bytes:
        """The command as sent: without its identity where identities cannot be used."""
        if self.no_identities or topic in self.plain:
            return plain_command(command)
        return command

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def publish(self, topic: str, chunks: Sequence[list[bytes]]) -> None:
        """Send one MPUB per chunk of bodies (see :meth:`publish_commands`)."""
        self.publish_commands(topic, [encode.mpub(topic, chunk) for chunk in chunks])

    def publish_commands(self, topic: str, commands: Sequence[bytes]) -> None:
        """Send MPUB commands, keeping at most ``pipelineDepth`` unacknowledged.

        Call :meth:`flush` at the end to wait for the rest. NsqSinkError once the retries
        are used up.
        """
        for command in commands:
            self._outstanding.append((topic, command))
            self._run(command, self.opts.pipeline)

    def flush(self) -> None:
        """Wait until nsqd acknowledged every chunk."""
        self._run(None, 0)

    def _run(self, send: bytes | None, keep: int) -> None:
        failures = 0
        resend = False
        while True:
            try:
                if resend:
                    conn = self._connection(self._outstanding[0][0])
                    data = b"".join([self._wire(t, c) for t, c in self._outstanding])
                    conn.send(data)
                    resend = False
                elif send is not None:
                    topic = self._outstanding[-1][0]
                    self._connection(topic).send(self._wire(topic, send))
                send = None
                while len(self._outstanding) > keep:
                    assert self._conn is not None
                    self._conn.read_response()
                    self._outstanding.popleft()
                    failures = 0
                return
            except (NsqConnectionError, OSError, NsqError) as e:
                self.close()
                topic = self._outstanding[0][0]
                if isinstance(e, NsqError) and e.code == "E_NOT_RETAINED":
                    self.plain.add(topic)
                    log.warning(
                        "nsq sink: topic %r keeps no log, so its writes are at-least-once; for "
                        "exactly-once give it retention (POST /topic/retention?topic=%s&time=24h "
                        "on its nodes, or nsqd --retention-time) or set exactlyOnce=false to "
                        "silence this",
                        topic,
                        topic,
                    )
                    resend, send = True, None
                    continue
                if isinstance(e, NsqError) and e.code not in RETRIABLE_ERRORS:
                    raise NsqSinkError(f"publishing to topic {topic!r} failed: {e}") from e
                failures += 1
                if failures > self.opts.max_retries:
                    raise NsqSinkError(
                        f"publishing to topic {topic!r} failed after {self.opts.max_retries} "
                        f"retries: {e}"
                    ) from e
                self.retries += 1
                if not self.identified or _refused(e):
                    # Fail over to the next node. With identities a retry stays where the rows
                    # went (only that node recognises them) while the node takes connections.
                    self._index += 1
                backoff = self.opts.retry_backoff_ms / 1000 * 2 ** (failures - 1)
                log.warning("nsq sink: %s; retry %d in %.2fs", e, failures, backoff)
                time.sleep(backoff)
                # Everything not acknowledged goes again on the new connection.
                resend = True
                send = None

    @property
    def identified(self) -> bool:
        return self.opts.exactly_once and not self.no_identities


def _refused(e: BaseException) -> bool:
    """The node takes no connection (down): the only failure an identified write fails over."""
    seen: BaseException | None = e
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError):
            return True
        seen = seen.__cause__
    return False


def plain_command(command: bytes) -> bytes:
    """An MPUB without its identity (``MPUB topic producer seq`` -> ``MPUB topic``)."""
    line, sep, rest = command.partition(b"\n")
    parts = line.split(b" ")
    if len(parts) <= 2:
        return command
    return b" ".join(parts[:2]) + sep + rest


def chunk_bodies(
    bodies: list[bytes], lengths: list[int], max_count: int, max_body: int
) -> list[list[bytes]]:
    """Split into MPUB chunks: at most ``max_count`` messages and ``max_body`` body bytes each."""
    chunks: list[list[bytes]] = []
    start = 0
    size = 4
    for i, n in enumerate(lengths):
        if i > start and (i - start >= max_count or size + 4 + n > max_body):
            chunks.append(bodies[start:i])
            start, size = i, 4
        size += 4 + n
    if start < len(bodies):
        chunks.append(bodies[start:])
    return chunks


def mpub_commands(
    topic: str,
    bodies: Any,
    max_count: int,
    max_body: int,
    identity: tuple[str, int] | None = None,
) -> list[bytes]:
    """MPUB commands for an Arrow binary array of (non-null) bodies, split like
    :func:`chunk_bodies`, built from Arrow buffers without a Python object per row.
    ``identity``: the producer and the first body's sequence number (each MPUB names its first).
    """
    n = len(bodies)
    if not n:
        return []
    lengths = pc.binary_length(bodies).to_numpy(zero_copy_only=False).astype(np.int64)
    # Each message on the wire is its 4-byte big-endian size, then the body: join a column of
    # those prefixes with the bodies element-wise and the data buffer is the MPUB payload.
    prefix_data = lengths.astype(">u4").tobytes()
    prefixes = pa.Array.from_buffers(
        pa.large_binary(),
        n,
        [None, pa.py_buffer(np.arange(0, 4 * n + 1, 4, dtype=np.int64)), pa.py_buffer(prefix_data)],
    )
    joined = pc.binary_join_element_wise(
        prefixes, bodies.cast(pa.large_binary()), pa.scalar(b"", pa.large_binary())
    )
    bufs = joined.buffers()
    ends = np.frombuffer(bufs[1], dtype=np.int64, count=n + 1, offset=joined.offset * 8)
    data = bufs[2]
    commands: list[bytes] = []
    lo = 0
    while lo < n:
        # The largest hi with 4 + payload(lo..hi) <= max_body, at most max_count messages.
        hi = int(np.searchsorted(ends, ends[lo] + max_body - 4, side="right")) - 1
        hi = max(lo + 1, min(hi, lo + max_count, n))
        a, b = int(ends[lo]), int(ends[hi])
        ident = None if identity is None else (identity[0], identity[1] + lo)
        commands.append(encode.mpub_framed(topic, data[a:b].to_pybytes(), hi - lo, ident))
        lo = hi
    return commands


class _WriterBase:
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_schema(schema, opts)
        self.opts = opts
        self.has_topic = "topic" in schema.fieldNames()
        #: Each row's headers are sent with it (``docs/headers.md``).
        self.has_headers = "headers" in schema.fieldNames()
        #: A batch write's identity (made on the driver, the same in every task and retry).
        self.write_id = uuid.uuid4().hex

    def _producer(self, ctx: Any, pid: int, batch_id: int | None) -> str | None:
        """The producer id of this task's rows: the same when the task runs again."""
        if not self.opts.exactly_once:
            return None
        if batch_id is None:
            return f"spark.{self.write_id}.{pid}"
        query = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
        return f"spark.{query or self.write_id}.{batch_id}.{pid}"

    def _write(self, iterator: Iterator[Any], batch_id: int | None) -> NsqCommitMessage:
        ctx = TaskContext.get()
        pid = ctx.partitionId() if ctx is not None else 0
        where = f"partition {pid}" + (f" of batch {batch_id}" if batch_id is not None else "")
        msg = NsqCommitMessage(partition_id=pid, batch_id=batch_id)
        pub = Publisher(self.opts, start_index=pid, headers=self.has_headers)
        producer = self._producer(ctx, pid, batch_id)
        seqs: dict[str, int] = {}  # per topic: the next row's sequence number
        row_base = 0
        try:
            for rb in iterator:
                for topic, bodies, skipped in self._prepare(rb, row_base, where):
                    msg.skipped += skipped
                    if not len(bodies):
                        continue
                    identity = None if producer is None else (producer, seqs.get(topic, 0))
                    seqs[topic] = seqs.get(topic, 0) + len(bodies)
                    commands = mpub_commands(
                        topic,
                        bodies,
                        self.opts.max_messages_per_mpub,
                        self.opts.max_body_size,
                        identity,
                    )
                    pub.publish_commands(topic, commands)
                    msg.messages += len(bodies)
                    msg.bytes += int(pc.sum(pc.binary_length(bodies)).as_py() or 0)
                row_base += rb.num_rows
            pub.flush()
        finally:
            pub.close()
        msg.retries = pub.retries
        msg.nodes = pub.used
        if msg.skipped:
            log.warning(
                "nsq sink: %s skipped %d rows (option oversize/emptyBody)", where, msg.skipped
            )
        return msg

    def _prepare(self, rb: Any, row_base: int, where: str) -> list[tuple[str, Any, int]]:
        """Check a record batch; group its bodies by topic: (topic, Arrow bodies, skipped)."""
        col = rb.column(rb.schema.get_field_index("body"))
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            col = col.cast(pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary())
        if col.null_count:
            row = row_base + int(pc.index(col.is_null(), True).as_py())
            raise NsqSinkError(f"row {row} of {where}: column 'body' is null")
        lengths = pc.binary_length(col).to_numpy(zero_copy_only=False)
        keep: Any = None  # numpy bool mask of the rows to publish, None: all of them
        skipped = 0
        if rb.num_rows and (lengths.max() > self.opts.max_msg_size or lengths.min() == 0):
            oversize = lengths > self.opts.max_msg_size
            empty = lengths == 0
            bad = np.flatnonzero(oversize | empty)
            for i in bad.tolist():
                n = int(lengths[i])
                if n and self.opts.oversize == "fail":
                    raise NsqSinkError(
                        f"row {row_base + i} of {where}: body is {n} bytes, over the "
                        f"maxMsgSize of {self.opts.max_msg_size} (option oversize=skip drops "
                        "such rows)"
                    )
                if not n and self.opts.empty_body == "fail":
                    raise NsqSinkError(
                        f"row {row_base + i} of {where}: body is empty, which NSQ rejects "
                        "(option emptyBody=skip drops such rows)"
                    )
            keep = ~(oversize | empty)
            skipped = len(bad)
        if self.has_headers:
            col = _with_headers(rb, col, row_base, where)
        if not self.has_topic:
            topic = self.opts.topic
            assert topic is not None
            if keep is not None:
                col = col.filter(pa.array(keep))
            return [(topic, col, skipped)]
        topics = rb.column(rb.schema.get_field_index("topic"))
        if topics.null_count and self.opts.topic is None:
            nulls = topics.is_null().to_numpy(zero_copy_only=False)
            if keep is not None:
                nulls &= keep
            if nulls.any():
                row = row_base + int(np.flatnonzero(nulls)[0])
                raise NsqSinkError(
                    f"row {row} of {where}: column 'topic' is null and no 'topic' option is set"
                )
        if self.opts.topic is not None:
            # A null or empty topic cell means the 'topic' option.
            topics = pc.if_else(pc.equal(topics, ""), self.opts.topic, topics)
            topics = pc.fill_null(topics, self.opts.topic)
        if keep is not None:
            col = col.filter(pa.array(keep))
            topics = topics.filter(pa.array(keep))
        out: list[tuple[str, Any, int]] = []
        # In order of first appearance, as the rows come.
        for t in pc.unique(topics.drop_null()).to_pylist():
            try:
                check_name("topic", "topic", t)
            except NsqOptionError:
                first = np.flatnonzero(pc.equal(topics, t).fill_null(False).to_numpy(False))[0]
                row = row_base + _original_row(keep, int(first))
                raise NsqSinkError(
                    f"row {row} of {where}: {t!r} is not a valid NSQ topic name"
                ) from None
            out.append((t, col.filter(pc.equal(topics, t).fill_null(False)), 0))
        if out:
            t0, b0, _ = out[0]
            out[0] = (t0, b0, skipped)
        elif skipped:
            out.append((self.opts.topic or "", col.slice(0, 0), skipped))
        return out


def _with_headers(rb: Any, bodies: Any, row_base: int, where: str) -> Any:
    """The bodies as a client that asked for headers sends them: each after its row's header
    block (``protocol/headers.py``; a null or empty array: none)."""
    cells = rb.column(rb.schema.get_field_index("headers")).to_pylist()
    out = []
    for i, (cell, body) in enumerate(zip(cells, bodies.to_pylist(), strict=True)):
        try:
            pairs = []
            for entry in cell or ():
                key, value = entry["key"], entry["value"]
                if key is None:
                    raise HeaderError("a header key is null")
                pairs.append((key, value.encode() if isinstance(value, str) else value or b""))
            block = header_codec.encode(pairs)
        except HeaderError as err:
            raise NsqSinkError(f"row {row_base + i} of {where}: column 'headers': {err}") from None
        out.append(join_body(block, body))
    return pa.array(out, pa.binary())


def _original_row(keep: Any, i: int) -> int:
    """The row number in the record batch of the ``i``-th row kept."""
    if keep is None:
        return i
    return int(np.flatnonzero(keep)[i])


def _log_commit(messages: Sequence[WriterCommitMessage | None], batch_id: int | None) -> None:
    ok = [m for m in messages if isinstance(m, NsqCommitMessage)]
    log.info(
        "nsq sink: %sbatch committed: %d messages, %d bytes, %d skipped, %d retries, %d tasks",
        "" if batch_id is None else f"streaming {batch_id} ",
        sum(m.messages for m in ok),
        sum(m.bytes for m in ok),
        sum(m.skipped for m in ok),
        sum(m.retries for m in ok),
        len(messages),
    )


class NsqArrowWriter(_WriterBase, DataSourceArrowWriter):
    """Batch writes: ``df.write.format("nsq")``."""

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        return self._write(iterator, None)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        _log_commit(messages, None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        log.warning("nsq sink: write aborted; published messages cannot be taken back")


class NsqStreamArrowWriter(_WriterBase, DataSourceStreamArrowWriter):
    """Streaming writes: ``df.writeStream.format("nsq")``."""

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        ctx = TaskContext.get()
        bid = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        return self._write(iterator, int(bid) if bid is not None else None)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _log_commit(messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning("nsq sink: batch %d aborted; published messages cannot be taken back", batchId)
