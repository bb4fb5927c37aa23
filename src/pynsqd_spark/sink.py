"""``df.write.format("nsq")`` and ``df.writeStream.format("nsq")`` (design: SPARK.md §6.3).

Each task publishes its rows with MPUB in chunks under nsqd's limits (``maxBodySize`` per MPUB,
``maxMsgSize`` per message), a few MPUBs pipelined, on one connection per task. A broken
connection or a retriable error (E_MPUB_FAILED, E_PUB_FAILED) is retried on a fresh connection,
failing over to the next nsqd, with exponential backoff: the chunks not yet acknowledged are sent
again, so a chunk that nsqd stored before the connection broke is published twice
(at-least-once). Rows are checked before anything is sent: a null body is an error naming the
row; an oversize or empty body follows the ``oversize`` / ``emptyBody`` option (fail or skip).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa  # type: ignore[import-untyped]
import pyarrow.compute as pc  # type: ignore[import-untyped]
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from pynsqd.protocol import encode

from .client import (
    Connection,
    NsqConnectionError,
    NsqError,
    NsqLookupError,
    lookup_nodes,
    lookup_producers,
)
from .options import NsqOptionError, SinkOptions, _check_name

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


class Publisher:
    """MPUBs chunks with pipelining, retries on a fresh connection and failover across nodes.

    Chunks stay in ``_outstanding`` until nsqd's OK for them arrives (responses come in order);
    after a failure all of them are sent again on a new connection.
    """

    def __init__(self, opts: SinkOptions, start_index: int = 0) -> None:
        self.opts = opts
        self._index = start_index
        self._nodes: list[str] | None = None
        self._conn: Connection | None = None
        self.retries = 0
        self.used: list[str] = []
        #: (topic, chunk) sent (or about to be) and not yet acknowledged, in order
        self._outstanding: deque[tuple[str, list[bytes]]] = deque()

    def nodes(self, topic: str) -> list[str]:
        if self._nodes is None:
            nodes = list(self.opts.nsqd_addresses)
            if self.opts.lookupd_addresses:
                timeout = self.opts.client.connect_timeout
                try:
                    found = lookup_producers(self.opts.lookupd_addresses, topic, timeout)
                    found += [
                        n
                        for n in lookup_nodes(self.opts.lookupd_addresses, timeout)
                        if n not in found
                    ]
                except NsqLookupError as e:
                    if not nodes:
                        raise NsqSinkError(
                            f"option 'nsqlookupdHttpAddresses' "
                            f"({','.join(self.opts.lookupd_addresses)}): {e}"
                        ) from e
                    found = []
                nodes += [n for n in found if n not in nodes]
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
            self._conn = Connection(node, self.opts.client).connect()
            if node not in self.used:
                self.used.append(node)
        return self._conn

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def publish(self, topic: str, chunks: Sequence[list[bytes]]) -> None:
        """Send one MPUB per chunk, keeping at most ``pipelineDepth`` unacknowledged.

        Call :meth:`flush` at the end to wait for the rest. NsqSinkError once the retries
        are used up.
        """
        for chunk in chunks:
            self._outstanding.append((topic, chunk))
            self._run(encode.mpub(topic, chunk), self.opts.pipeline)

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
                    data = b"".join([encode.mpub(t, c) for t, c in self._outstanding])
                    conn.send(data)
                    resend = False
                elif send is not None:
                    self._connection(self._outstanding[-1][0]).send(send)
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
                if isinstance(e, NsqError) and e.code not in RETRIABLE_ERRORS:
                    raise NsqSinkError(f"publishing to topic {topic!r} failed: {e}") from e
                failures += 1
                if failures > self.opts.max_retries:
                    raise NsqSinkError(
                        f"publishing to topic {topic!r} failed after {self.opts.max_retries} "
                        f"retries: {e}"
                    ) from e
                self.retries += 1
                self._index += 1  # fail over to the next node
                backoff = self.opts.retry_backoff_ms / 1000 * 2 ** (failures - 1)
                log.warning("nsq sink: %s; retry %d in %.2fs", e, failures, backoff)
                time.sleep(backoff)
                # Everything not acknowledged goes again on the new connection.
                resend = True
                send = None


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


class _WriterBase:
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_schema(schema, opts)
        self.opts = opts
        self.has_topic = "topic" in schema.fieldNames()

    def _write(self, iterator: Iterator[Any], batch_id: int | None) -> NsqCommitMessage:
        ctx = TaskContext.get()
        pid = ctx.partitionId() if ctx is not None else 0
        where = f"partition {pid}" + (f" of batch {batch_id}" if batch_id is not None else "")
        msg = NsqCommitMessage(partition_id=pid, batch_id=batch_id)
        pub = Publisher(self.opts, start_index=pid)
        row_base = 0
        try:
            for rb in iterator:
                for topic, bodies, lengths, skipped in self._prepare(rb, row_base, where):
                    msg.skipped += skipped
                    if not bodies:
                        continue
                    chunks = chunk_bodies(
                        bodies, lengths, self.opts.max_messages_per_mpub, self.opts.max_body_size
                    )
                    pub.publish(topic, chunks)
                    msg.messages += len(bodies)
                    msg.bytes += sum(lengths)
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

    def _prepare(
        self, rb: Any, row_base: int, where: str
    ) -> list[tuple[str, list[bytes], list[int], int]]:
        """Check a record batch; group its bodies by topic: (topic, bodies, lengths, skipped)."""
        col = rb.column(rb.schema.get_field_index("body"))
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            col = col.cast(pa.large_binary() if pa.types.is_large_string(col.type) else pa.binary())
        if col.null_count:
            row = row_base + int(pc.index(col.is_null(), True).as_py())
            raise NsqSinkError(f"row {row} of {where}: column 'body' is null")
        lengths_arr = pc.binary_length(col)
        lengths: list[int] = lengths_arr.to_pylist()
        bodies: list[bytes] = col.to_pylist()
        keep: list[int] | None = None
        skipped = 0
        if rb.num_rows and (
            pc.max(lengths_arr).as_py() > self.opts.max_msg_size or pc.min(lengths_arr).as_py() == 0
        ):
            keep = []
            for i, n in enumerate(lengths):
                if n > self.opts.max_msg_size:
                    if self.opts.oversize == "fail":
                        raise NsqSinkError(
                            f"row {row_base + i} of {where}: body is {n} bytes, over the "
                            f"maxMsgSize of {self.opts.max_msg_size} (option oversize=skip drops "
                            "such rows)"
                        )
                elif n == 0:
                    if self.opts.empty_body == "fail":
                        raise NsqSinkError(
                            f"row {row_base + i} of {where}: body is empty, which NSQ rejects "
                            "(option emptyBody=skip drops such rows)"
                        )
                else:
                    keep.append(i)
                    continue
                skipped += 1
        if not self.has_topic:
            topic = self.opts.topic
            assert topic is not None
            if keep is not None:
                bodies = [bodies[i] for i in keep]
                lengths = [lengths[i] for i in keep]
            return [(topic, bodies, lengths, skipped)]
        topics: list[str | None] = rb.column(rb.schema.get_field_index("topic")).to_pylist()
        groups: dict[str, tuple[list[bytes], list[int]]] = {}
        for i in keep if keep is not None else range(len(bodies)):
            t = topics[i] or self.opts.topic
            if t is None:
                raise NsqSinkError(
                    f"row {row_base + i} of {where}: column 'topic' is null and no 'topic' option "
                    "is set"
                )
            g = groups.get(t)
            if g is None:
                try:
                    _check_name("topic", "topic", t)
                except NsqOptionError:
                    raise NsqSinkError(
                        f"row {row_base + i} of {where}: {t!r} is not a valid NSQ topic name"
                    ) from None
                g = groups[t] = ([], [])
            g[0].append(bodies[i])
            g[1].append(lengths[i])
        out = [(t, b, n, 0) for t, (b, n) in groups.items()]
        if out:
            t0, b0, n0, _ = out[0]
            out[0] = (t0, b0, n0, skipped)
        elif skipped:
            out.append((self.opts.topic or "", [], [], skipped))
        return out


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
