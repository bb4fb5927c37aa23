"""Tracing with OpenTelemetry's SDK (``--otel-traces-file``, ``--otel-exporter-otlp-endpoint``):
a message's publish and each of its deliveries as spans of its publisher's trace.

Theory of operation. Off unless an exporter is given; then ``start`` imports the SDK (nothing
of it is imported otherwise), makes a tracer provider named ``--otel-service-name`` with a
batch span processor and the exporter(s), and sets the core's hook (``core/tracing.py``).
Only messages that carry a W3C ``traceparent`` header (``protocol/headers.py``) are traced:
their spans continue that trace, each a child of the publisher's span:

- ``publish <topic>`` (kind PRODUCER), from the message's timestamp (when nsqd made it) to
  its store (the log's append, or the queues), one per message, on the worker that stores it;
- ``commit <topic>`` (kind INTERNAL), on a replicated topic, from the store to
  the moment the partition's high watermark covers the record (``nsq.outcome`` committed, or
  failed with the reason when the publish failed: leadership lost, the timeout);
- ``deliver <topic>/<channel>`` (kind CONSUMER), from a delivery attempt to its end: FIN,
  REQ, a timeout or its consumer gone (``nsq.outcome``), with its attempt number.

Every span has the topic, the channel where there is one, the message id and the node id
(``--node-id``; a worker of a node of several says its own). The file exporter writes one
span per line, as JSON (``span_line``: the fields of ``to_json``), a batch appended with one
``write``, so the workers of a node can share the file. A span is exported by the processor's
thread; what was not exported yet is flushed when nsqd stops (a kill -9 loses it).
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..core import tracing as hook
from ..core.message import Message
from ..protocol import headers

if TYPE_CHECKING:
    from ..options import Options

log = logging.getLogger("pynsqd")

#: A header this name carries the publisher's span (W3C Trace Context).
TRACEPARENT = "traceparent"
#: The most publishes of one topic whose commit spans are open (a partition that never
#: commits them, e.g. a leader cut off and never told: the oldest end as ``unknown``).
MAX_COMMITTING = 10_000


def parent_of(block: bytes) -> str | None:
    """The ``traceparent`` value of a header block, or None."""
    if not block or b"traceparent" not in block:
        return None
    try:
        for name, value in headers.decode(block):
            if name == TRACEPARENT:
                return value.decode("ascii", "replace")
    except headers.HeaderError:
        return None
    return None


class Tracing:
    """The process's tracer (``core.tracing.MessageTracer``), over OpenTelemetry's SDK."""

    def __init__(self, opts: Options, node_id: int) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace import SpanKind
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._kinds = SpanKind
        self._propagator = TraceContextTextMapPropagator()
        self.node_id = node_id
        resource = Resource.create(
            {"service.name": opts.otel_service_name, "service.instance.id": str(node_id)}
        )
        self.provider = TracerProvider(resource=resource)
        if opts.otel_traces_file:
            self.provider.add_span_processor(
                BatchSpanProcessor(json_lines_exporter(opts.otel_traces_file))
            )
        if opts.otel_exporter_otlp_endpoint:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            self.provider.add_span_processor(
                BatchSpanProcessor(OTLPSpanExporter(endpoint=opts.otel_exporter_otlp_endpoint))
            )
        self.tracer = self.provider.get_tracer("pynsqd")
        #: Delivery spans not ended yet, by (topic, channel, message id).
        self._open: dict[tuple[str, str, bytes], Any] = {}
        #: Commit spans not ended yet, by topic: (the offset whose commit ends them, spans),
        #: in offset order (this node's partition appends in order).
        self._committing: dict[str, deque[tuple[int, list[Any]]]] = {}

    @staticmethod
    def _traced(msgs: list[Message]) -> Iterator[tuple[Message, str]]:
        """The messages of ``msgs`` that carry a ``traceparent``, with it."""
        for m in msgs:
            parent = parent_of(m.headers)
            if parent is not None:
                yield m, parent

    def _context(self, traceparent: str) -> Any:
        return self._propagator.extract({TRACEPARENT: traceparent})

    def _attributes(self, topic: str, msg: Message) -> dict[str, Any]:
        return {
            "messaging.system": "nsq",
            "messaging.destination.name": topic,
            "messaging.message.id": msg.id.decode("ascii", "replace"),
            "nsq.node_id": self.node_id,
        }

    # -- the publish (server/publishing.py, http/api.py) ------------------------------------

    def published(self, topic: str, msgs: list[Message], commit_at: int = -1) -> None:
        """``msgs`` were stored (``core/topic.py``): a publish span each of those traced; and
        on a replicated topic whose records are not committed yet, a commit span each, open
        until the partition's HW reaches ``commit_at`` (``committed``)."""
        commits = []
        for m, parent in self._traced(msgs):
            context = self._context(parent)
            attributes = self._attributes(topic, m)
            span = self.tracer.start_span(
                f"publish {topic}",
                context=context,
                kind=self._kinds.PRODUCER,
                start_time=m.timestamp,
                attributes={**attributes, "messaging.operation.type": "publish"},
            )
            span.end()
            if commit_at >= 0:
                commits.append(
                    self.tracer.start_span(
                        f"commit {topic}",
                        context=context,
                        kind=self._kinds.INTERNAL,
                        attributes={**attributes, "nsq.commit_offset": commit_at},
                    )
                )
        if commits:
            waiting = self._committing.setdefault(topic, deque())
            waiting.append((commit_at, commits))
            while len(waiting) > MAX_COMMITTING:  # a bound: the oldest ended, unknown
                self._end_commits(waiting.popleft()[1], "unknown")

    # -- a replicated topic's commit (cluster/partition.py) ---------------------------------

    def committed(self, topic: str, hw: int) -> None:
        waiting = self._committing.get(topic)
        while waiting and waiting[0][0] <= hw:
            self._end_commits(waiting.popleft()[1], "committed")
        if waiting is not None and not waiting:
            del self._committing[topic]

    def uncommitted(self, topic: str, why: str) -> None:
        for _, spans in self._committing.pop(topic, ()):
            self._end_commits(spans, "failed", why)

    def _end_commits(self, spans: list[Any], outcome: str, why: str = "") -> None:
        for span in spans:
            span.set_attribute("nsq.outcome", outcome)
            if why:
                from opentelemetry.trace import Status, StatusCode

                span.set_status(Status(StatusCode.ERROR, why))
            span.end()

    # -- deliveries (core/in_flight.py) ------------------------------------------------------

    def delivering(self, topic: str, channel: str, msgs: list[Message], client: str) -> None:
        for m, parent in self._traced(msgs):
            key = (topic, channel, m.id)
            old = self._open.pop(key, None)
            if old is not None:  # (a delivery whose end was not seen: ended here)
                old.set_attribute("nsq.outcome", "unknown")
                old.end()
            self._open[key] = self.tracer.start_span(
                f"deliver {topic}/{channel}",
                context=self._context(parent),
                kind=self._kinds.CONSUMER,
                attributes={
                    **self._attributes(topic, m),
                    "messaging.operation.type": "process",
                    "messaging.consumer.group.name": channel,
                    "nsq.attempts": m.attempts,
                    "nsq.client_id": client,
                },
            )

    def ended(self, topic: str, channel: str, ids: list[bytes], outcome: str) -> None:
        if not self._open:
            return
        for msg_id in ids:
            span = self._open.pop((topic, channel, msg_id), None)
            if span is not None:
                span.set_attribute("nsq.outcome", outcome)
                span.end()

    def stop(self) -> None:
        """Flush what the processors hold (nsqd exiting)."""
        for span in self._open.values():
            span.set_attribute("nsq.outcome", "exiting")
            span.end()
        self._open.clear()
        for waiting in self._committing.values():
            for _, spans in waiting:
                self._end_commits(spans, "exiting")
        self._committing.clear()
        self.provider.shutdown()


def span_line(span: Any) -> str:
    """One span as a line of JSON, with the fields of OpenTelemetry's ``to_json`` that a
    reader needs (ids as ``0x`` hex, times in ns, the attributes and the resource's); written
    here because ``to_json`` costs more than making the span."""
    ctx = span.context
    parent = span.parent
    doc = {
        "name": span.name,
        "context": {"trace_id": f"0x{ctx.trace_id:032x}", "span_id": f"0x{ctx.span_id:016x}"},
        "kind": str(span.kind),
        "parent_id": None if parent is None else f"0x{parent.span_id:016x}",
        "start_time": span.start_time,
        "end_time": span.end_time,
        "attributes": dict(span.attributes or {}),
        "resource": {"attributes": dict(span.resource.attributes)},
    }
    return json.dumps(doc, separators=(",", ":")) + "\n"


def json_lines_exporter(path: str) -> Any:
    """``--otel-traces-file``: a span exporter writing each span as one JSON line, appended
    with one ``write`` (the SDK imported here, only when asked for). Raises OSError."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    class JsonLines(SpanExporter):
        def export(self, spans: Sequence[Any]) -> SpanExportResult:
            try:
                os.write(fd, "".join(map(span_line, spans)).encode())
            except OSError as err:
                log.error("TRACING: writing spans to --otel-traces-file=%s failed - %s", path, err)
                return SpanExportResult.FAILURE
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            os.close(fd)

    return JsonLines()


def start(opts: Options, node_id: int) -> Tracing | None:
    """The tracer the options ask for, set as the core's hook; None when tracing is off.
    Raises ``RuntimeError`` with the one line to show (the SDK missing, a file not writable)."""
    if not (opts.otel_traces_file or opts.otel_exporter_otlp_endpoint):
        return None
    try:
        tracer = Tracing(opts, node_id)
    except ImportError as err:
        raise RuntimeError(
            f"--otel-*: OpenTelemetry's SDK is not installed ({err}); pip install "
            "opentelemetry-sdk opentelemetry-exporter-otlp-proto-http"
        ) from None
    except OSError as err:
        raise RuntimeError(f"--otel-traces-file={opts.otel_traces_file}: {err}") from None
    hook.set_tracer(tracer)
    return tracer


def stop(tracer: Tracing | None) -> None:
    if tracer is not None:
        hook.set_tracer(None)
        tracer.stop()
