"""Where a message's life is traced (``--otel-*``, ``server/tracing.py``): the hook the core
calls, and nothing when tracing is off.

Theory of operation. Tracing follows the messages that carry a W3C ``traceparent`` header
(``protocol/headers.py``): their publish, each delivery attempt and how it ended (FIN, REQ, a
timeout, its consumer gone) become spans of the publisher's trace. The core knows only this
module's ``TRACER``: None unless nsqd was started with an exporter, so a node without tracing
pays one test of a module global per batch of messages stored, delivered or finished, and
per move of a replicated partition's high watermark. The tracer
(``server/tracing.py``, OpenTelemetry's SDK) keeps each open delivery span by (topic,
channel, message id) and does its own I/O (an exporter thread).
"""

from __future__ import annotations

from typing import Protocol

from .message import Message


class MessageTracer(Protocol):
    """What the core tells the tracer (``server/tracing.py``'s ``Tracing``)."""

    def published(self, topic: str, msgs: list[Message], commit_at: int = -1) -> None:
        """``msgs`` were stored (logged or queued): a publish span each (of those traced).
        ``commit_at`` >= 0: a replicated topic's records, committed once its high watermark
        reaches that offset (``committed``): a commit span each until then."""

    def committed(self, topic: str, hw: int) -> None:
        """This node's partition of ``topic`` committed every offset below ``hw``."""

    def uncommitted(self, topic: str, why: str) -> None:
        """The publishes of ``topic`` waiting for their commit here failed (``why``)."""

    def delivering(self, topic: str, channel: str, msgs: list[Message], client: str) -> None:
        """``msgs`` are in flight to ``client``: a delivery span each (of those traced)."""

    def ended(self, topic: str, channel: str, ids: list[bytes], outcome: str) -> None:
        """The deliveries of ``ids`` ended: ``fin``, ``req``, ``timeout`` or ``requeued``."""


#: The process's tracer, or None (tracing off): set once by nsqd at start (``set_tracer``).
TRACER: MessageTracer | None = None


def set_tracer(tracer: MessageTracer | None) -> None:
    global TRACER
    TRACER = tracer
