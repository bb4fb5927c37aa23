"""The tracer's bookkeeping of a replicated topic's commit spans (``server/tracing.py``), over
OpenTelemetry's SDK with its in-memory exporter: which spans end at which high watermark."""

from __future__ import annotations

from typing import Any

import pytest

from pynsqd.core.message import Message
from pynsqd.options import Options
from pynsqd.protocol import headers
from pynsqd.server import tracing
from pynsqd.server.tracing import Tracing

pytestmark = pytest.mark.unit


def traced(n: int) -> Message:
    block = headers.encode([("traceparent", f"00-{n:032x}-00f067aa0ba902b7-01".encode())])
    return Message(b"%016d" % n, b"body", 1, headers=block)


@pytest.fixture
def tracer() -> Any:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    t = Tracing(Options(), 1)
    exporter = InMemorySpanExporter()
    t.provider.add_span_processor(SimpleSpanProcessor(exporter))
    t.finished = lambda name: [  # type: ignore[attr-defined]
        (s.attributes["messaging.message.id"], s.attributes.get("nsq.outcome"))
        for s in exporter.get_finished_spans()
        if s.name == name
    ]
    yield t
    t.stop()


def test_commit_spans_end_in_offset_order_as_the_hw_passes_them(tracer: Any) -> None:
    tracer.published("t", [traced(1), Message(b"%016d" % 9, b"untraced", 1)], commit_at=2)
    tracer.published("t", [traced(2), traced(3)], commit_at=4)
    assert tracer.finished("commit t") == []
    tracer.committed("t", 1)  # below the first batch's end: nothing ends
    assert tracer.finished("commit t") == []
    tracer.committed("t", 3)
    assert tracer.finished("commit t") == [("0000000000000001", "committed")]
    tracer.committed("t", 4)
    assert [o for _, o in tracer.finished("commit t")] == ["committed"] * 3
    assert tracer.finished("publish t") != []


def test_a_failed_commit_ends_its_spans_with_the_reason(tracer: Any) -> None:
    tracer.published("t", [traced(1)], commit_at=1)
    tracer.published("u", [traced(2)], commit_at=1)
    tracer.uncommitted("t", "this node no longer leads")
    assert tracer.finished("commit t") == [("0000000000000001", "failed")]
    assert tracer.finished("commit u") == []  # another topic's wait goes on


def test_an_unstored_commit_at_makes_no_commit_span(tracer: Any) -> None:
    tracer.published("t", [traced(1)])  # a topic that commits at its store
    tracer.committed("t", 10)
    assert tracer.finished("commit t") == []
    assert tracer.finished("publish t") == [("0000000000000001", None)]


def test_open_commit_spans_are_bounded(tracer: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracing, "MAX_COMMITTING", 2)
    for i in range(1, 4):
        tracer.published("t", [traced(i)], commit_at=i)
    assert tracer.finished("commit t") == [("0000000000000001", "unknown")]
