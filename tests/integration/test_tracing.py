"""Tracing (``server/tracing.py``, ``--otel-traces-file``): a message that carries a W3C
``traceparent`` header is one trace from its publish to its FIN, through REQ and a timeout and
across the workers of a node; spans read back from the file exporter of real processes."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from pynsqd.protocol import encode, headers

from ..processes import NsqdProcess
from ..wire import Conn
from .replication_harness import Cluster, Etcd, replicate

pytestmark = pytest.mark.integration

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


def traced(body: bytes, trace: str = TRACE) -> bytes:
    block = headers.encode([("traceparent", f"00-{trace}-{PARENT}-01".encode())])
    return headers.join_body(block, body)


def spans_of(path: Path, trace: str = TRACE) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [s for s in found if s["context"]["trace_id"] == f"0x{trace}"]


def producer(proc: NsqdProcess) -> Conn:
    c = Conn(("127.0.0.1", proc.port))
    c.identify({"feature_negotiation": True, "headers": True})
    return c


def test_a_traced_message_is_one_trace_from_publish_through_req_and_timeout_to_fin(
    tmp_path: Path,
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    (tmp_path / "data").mkdir()
    proc = NsqdProcess(tmp_path / "data", tmp_path / "nsqd.log", f"--otel-traces-file={spans_file}")
    try:
        with producer(proc) as p:
            p.pub("orders", traced(b"traced"))
            p.pub("orders", headers.join_body(b"", b"plain"))
        with Conn(("127.0.0.1", proc.port)) as c:
            c.identify({"msg_timeout": 1000})
            c.sub("orders", "billing", rdy=1)
            first = c.read_message()
            if first.body != b"traced":
                c.fin(first.id)
                first = c.read_message()
            c.req(first.id, 0)  # attempt 1 ends: REQ
            again = c.read_message()
            while again.body != b"traced":
                c.fin(again.id)
                again = c.read_message()
            # attempt 2 is not answered: it times out (msg_timeout 1 s) and comes again
            third = c.read_message()
            assert (third.id, third.attempts) == (first.id, 3)
            c.fin(third.id)
            c.nop()
    finally:
        proc.stop()  # the exporters flush
    spans = spans_of(spans_file)
    by_name = sorted(spans, key=lambda s: s["start_time"])
    assert [s["name"] for s in by_name] == [
        "publish orders",
        "deliver orders/billing",
        "deliver orders/billing",
        "deliver orders/billing",
    ]
    assert all(s["parent_id"] == f"0x{PARENT}" for s in spans)  # children of the publisher's
    deliveries = [s["attributes"] for s in by_name[1:]]
    assert [(a["nsq.attempts"], a["nsq.outcome"]) for a in deliveries] == [
        (1, "req"),
        (2, "timeout"),
        (3, "fin"),
    ]
    publish = by_name[0]["attributes"]
    assert publish["messaging.destination.name"] == "orders"
    assert publish["messaging.message.id"] == first.id.decode()
    assert by_name[0]["kind"] == "SpanKind.PRODUCER"
    # The message without a traceparent made no span at all.
    every = [json.loads(line) for line in spans_file.read_text().splitlines()]
    assert len(every) == len(spans) == 4


def test_a_trace_crosses_the_workers_of_a_node(tmp_path: Path) -> None:
    """``--workers 2``: messages published on connections spread over both workers, a
    consumer on one of them: each message's publish span comes from the worker that stored
    it, its delivery span from the one whose consumer had it, all in its one trace."""
    spans_file = tmp_path / "spans.jsonl"
    (tmp_path / "data").mkdir()
    proc = NsqdProcess(
        tmp_path / "data",
        tmp_path / "nsqd.log",
        "--workers=2",
        f"--otel-traces-file={spans_file}",
    )
    traces = [f"{i:032x}" for i in range(1, 7)]
    try:
        consumer = Conn(("127.0.0.1", proc.port))
        consumer.sub("t", "c", rdy=10)
        for trace in traces:
            with producer(proc) as p:  # new connections: spread over the workers
                p.send(encode.pub("t", traced(b"m", trace)))
                assert p.read_response() == b"OK"
        for msg in consumer.read_messages(len(traces)):
            consumer.fin(msg.id)
        consumer.nop()
        consumer.close()
    finally:
        proc.stop()
    services = set()
    for trace in traces:
        spans = spans_of(spans_file, trace)
        names = sorted(s["name"] for s in spans)
        assert names == ["deliver t/c", "publish t"], (trace, names)
        deliver = next(s for s in spans if s["name"] == "deliver t/c")
        assert deliver["attributes"]["nsq.outcome"] == "fin"
        services |= {s["resource"]["attributes"]["service.instance.id"] for s in spans}
    assert len(services) == 2  # both workers traced some


class _Collector(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts.append((self.path, self.headers["Content-Type"], body))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_spans_go_to_an_otlp_http_endpoint(tmp_path: Path) -> None:
    """``--otel-exporter-otlp-endpoint``: the spans are POSTed there as OTLP protobuf."""
    collector = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Collector)
    collector.posts = []  # type: ignore[attr-defined]
    threading.Thread(target=collector.serve_forever, daemon=True).start()
    (tmp_path / "data").mkdir()
    endpoint = f"http://127.0.0.1:{collector.server_address[1]}/v1/traces"
    proc = NsqdProcess(
        tmp_path / "data",
        tmp_path / "nsqd.log",
        f"--otel-exporter-otlp-endpoint={endpoint}",
        "--otel-service-name=orders-nsqd",
    )
    try:
        with producer(proc) as p:
            p.pub("orders", traced(b"traced"))
    finally:
        proc.stop()
        collector.shutdown()
        collector.server_close()
    posts = collector.posts  # type: ignore[attr-defined]
    assert posts and all(path == "/v1/traces" for path, _, _ in posts)
    assert posts[0][1] == "application/x-protobuf"
    sent = b"".join(body for _, _, body in posts)
    assert bytes.fromhex(TRACE) in sent and b"orders-nsqd" in sent and b"publish orders" in sent


def test_a_replicated_publish_has_a_commit_span_until_its_partition_commits(
    tmp_path: Path, etcd: Etcd
) -> None:
    """Three replicating nodes, acks=all: a traced message published to node 1 is one trace
    of a publish span (its append), a commit span (from the append until the partition's HW
    covers it, after both followers have it) and its delivery to FIN; an untraced message
    beside it makes none."""
    spans_file = tmp_path / "spans.jsonl"
    cluster = Cluster(tmp_path, etcd, 3, f"--otel-traces-file={spans_file}")
    try:
        replicate(cluster, "orders", acks="all")
        node = cluster.node(1)
        assert node.proc is not None
        with producer(node.proc) as p:
            p.pub("orders", traced(b"traced"))
            p.pub("orders", headers.join_body(b"", b"plain"))
        with Conn(("127.0.0.1", node.proc.port)) as c:
            c.sub("orders", "billing", rdy=2)
            for msg in c.read_messages(2):
                c.fin(msg.id)
            c.nop()
        committed = cluster.partition("orders", 1)
        assert committed is not None and committed["committed"] >= 2
    finally:
        cluster.stop()  # the exporters flush
    spans = {s["name"]: s for s in spans_of(spans_file)}
    assert sorted(spans) == ["commit orders", "deliver orders/billing", "publish orders"]
    commit, publish = spans["commit orders"], spans["publish orders"]
    assert {s["resource"]["attributes"]["service.instance.id"] for s in spans.values()} == {"1"}
    assert all(s["parent_id"] == f"0x{PARENT}" for s in spans.values())
    assert commit["attributes"]["nsq.outcome"] == "committed"
    assert commit["attributes"]["nsq.commit_offset"] >= 1
    # The commit begins at the store (the publish span's end) and ends after it.
    assert publish["end_time"] <= commit["start_time"] <= commit["end_time"]
    assert spans["deliver orders/billing"]["attributes"]["nsq.outcome"] == "fin"
    every = [json.loads(line) for line in spans_file.read_text().splitlines()]
    assert len(every) == 3
