"""GET /metrics: Prometheus text format, parsed with prometheus_client's own parser."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import ServerThread

from ..waiting import wait_for
from .servers import channel_stats, request

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(server: ServerThread) -> tuple[Samples, dict[str, str]]:
    reply = request(server, "GET", "/metrics")
    assert reply.status == 200
    assert reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(reply.body.decode()):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def test_metrics(nsqd: ServerThread) -> None:
    with nsqd.connect() as sub, nsqd.connect() as pub:
        sub.sub("t", "c", rdy=1)
        pub.mpub("t", [b"aa", b"bb", b"cc"])
        msg = sub.read_message()
        sub.req(msg.id, 0)
        wait_for(lambda: channel_stats(nsqd, "t", "c")["requeue_count"] == 1)
        request(nsqd, "POST", "/pub?topic=t&defer=60000", b"d")
        wait_for(lambda: channel_stats(nsqd, "t", "c")["deferred_count"] == 1)
        request(nsqd, "POST", "/topic/create?topic=idle")
        samples, types = scrape(nsqd)
    t = (("topic", "t"),)
    c = (("channel", "c"), ("topic", "t"))
    assert samples[("nsq_topic_depth", t)] == 0
    assert samples[("nsq_topic_depth", (("topic", "idle"),))] == 0
    assert samples[("nsq_topic_backend_depth", t)] == 0
    assert samples[("nsq_topic_messages_total", t)] == 4
    assert samples[("nsq_topic_message_bytes_total", t)] == 7
    assert samples[("nsq_topic_paused", t)] == 0
    assert samples[("nsq_channel_depth", c)] == 2
    assert samples[("nsq_channel_in_flight", c)] == 1
    assert samples[("nsq_channel_deferred", c)] == 1
    assert samples[("nsq_channel_messages_total", c)] == 4
    assert samples[("nsq_channel_requeued_total", c)] == 1
    assert samples[("nsq_channel_timed_out_total", c)] == 0
    assert samples[("nsq_channel_clients", c)] == 1
    assert samples[("nsq_clients", ())] == 2
    assert samples[("nsq_healthy", ())] == 1
    assert types["nsq_topic_messages"] == "counter"
    assert types["nsq_channel_depth"] == "gauge"
    # Process metrics from prometheus_client's collectors.
    assert samples[("process_resident_memory_bytes", ())] > 0
    assert any(name == "python_gc_collections_total" for name, _ in samples)
    assert ("nsq_build_info", (("pynsqd", "0.1.0"), ("version", "1.3.0"))) in samples


def test_metrics_e2e_quantiles(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(e2e_processing_latency_percentiles=[0.99, 0.5])
    with server.connect() as sub, server.connect() as pub:
        sub.sub("t", "c", rdy=5)
        pub.mpub("t", [b"a", b"b"])
        for m in sub.read_messages(2):
            sub.fin(m.id)
        wait_for(
            lambda: (
                scrape(server)[0].get(
                    ("nsq_topic_e2e_processing_latency_seconds_count", (("topic", "t"),))
                )
                == 2
            )
        )
        samples, types = scrape(server)
    assert types["nsq_channel_e2e_processing_latency_seconds"] == "summary"
    labels = (("channel", "c"), ("quantile", "0.99"), ("topic", "t"))
    value = samples[("nsq_channel_e2e_processing_latency_seconds", labels)]
    assert 0 < value < 60
    assert (
        samples[("nsq_channel_e2e_processing_latency_seconds_count", labels[:1] + labels[2:])] == 2
    )
    assert (
        "nsq_topic_e2e_processing_latency_seconds",
        (("quantile", "0.5"), ("topic", "t")),
    ) in samples
