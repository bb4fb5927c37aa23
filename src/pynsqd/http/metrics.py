"""``GET /metrics``: Prometheus text exposition (nsqio/nsq#732; README, "Differences from nsqd").

A custom collector reads the live topics, channels and clients at scrape time (nothing is
counted on the message path); prometheus_client's own collectors add the process, GC and
platform metrics, and its ``generate_latest`` writes the text format.

Names follow Prometheus conventions: an ``nsq_`` namespace, ``_total`` on counters, base units
(seconds) for latencies, and labels for topic and channel names.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from .. import NSQD_VERSION, __version__
from .host import NSQDHost
from .stats import channel_e2e, e2e_sink, topic_e2e

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


class NSQCollector:
    """Topic, channel and client metrics of one nsqd."""

    def __init__(self, nsqd: NSQDHost) -> None:
        self.nsqd = nsqd

    def collect(self) -> Iterator[Metric]:
        nsqd = self.nsqd
        info = GaugeMetricFamily(
            "nsq_build_info", "nsqd version spoken and pynsqd version", labels=["version", "pynsqd"]
        )
        info.add_metric([NSQD_VERSION, __version__], 1)
        yield info
        yield GaugeMetricFamily(
            "nsq_healthy",
            "1 unless the last backend write failed",
            value=int(not nsqd.health_error),
        )
        yield GaugeMetricFamily(
            "nsq_start_time_seconds", "Unix time nsqd started", value=nsqd.start_time
        )
        yield GaugeMetricFamily("nsq_clients", "Connected TCP clients", value=len(nsqd.clients))
        yield GaugeMetricFamily("nsq_topics", "Topics", value=len(nsqd.topics))

        t_labels = ["topic"]
        c_labels = ["topic", "channel"]
        t_depth = GaugeMetricFamily(
            "nsq_topic_depth", "Messages queued (memory + disk)", labels=t_labels
        )
        t_backend = GaugeMetricFamily(
            "nsq_topic_backend_depth", "Messages queued on disk", labels=t_labels
        )
        t_msgs = CounterMetricFamily("nsq_topic_messages", "Messages published", labels=t_labels)
        t_bytes = CounterMetricFamily(
            "nsq_topic_message_bytes", "Message body bytes published", labels=t_labels
        )
        t_paused = GaugeMetricFamily(
            "nsq_topic_paused", "1 if the topic is paused", labels=t_labels
        )
        t_channels = GaugeMetricFamily(
            "nsq_topic_channels", "Channels of the topic", labels=t_labels
        )
        t_log_earliest = GaugeMetricFamily(
            "nsq_topic_log_earliest_offset",
            "Oldest retained offset of a replayable topic",
            labels=t_labels,
        )
        t_log_latest = GaugeMetricFamily(
            "nsq_topic_log_latest_offset",
            "Next offset to be written to a replayable topic's log",
            labels=t_labels,
        )
        t_log_bytes = GaugeMetricFamily(
            "nsq_topic_log_bytes", "Bytes in a replayable topic's log", labels=t_labels
        )
        t_log_segments = GaugeMetricFamily(
            "nsq_topic_log_segments", "Segment files of a replayable topic's log", labels=t_labels
        )
        c_dead = CounterMetricFamily(
            "nsq_channel_dead_lettered",
            "Messages moved to the dead-letter topic after --max-attempts",
            labels=c_labels,
        )
        c_expired = CounterMetricFamily(
            "nsq_channel_expired", "Messages dropped past their TTL", labels=c_labels
        )
        c_dropped = CounterMetricFamily(
            "nsq_channel_dropped", "Messages dropped by a drop-oldest bound", labels=c_labels
        )
        c_over = CounterMetricFamily(
            "nsq_channel_over_bound",
            "Messages taken back from consumers (REQ, timeout, disconnect) past a bound",
            labels=c_labels,
        )
        c_depth = GaugeMetricFamily(
            "nsq_channel_depth", "Messages queued (memory + disk)", labels=c_labels
        )
        c_backend = GaugeMetricFamily(
            "nsq_channel_backend_depth", "Messages queued on disk", labels=c_labels
        )
        c_in_flight = GaugeMetricFamily(
            "nsq_channel_in_flight", "Messages in flight", labels=c_labels
        )
        c_deferred = GaugeMetricFamily("nsq_channel_deferred", "Deferred messages", labels=c_labels)
        c_msgs = CounterMetricFamily(
            "nsq_channel_messages", "Messages put into the channel", labels=c_labels
        )
        c_requeued = CounterMetricFamily(
            "nsq_channel_requeued", "Messages requeued (REQ)", labels=c_labels
        )
        c_timed_out = CounterMetricFamily(
            "nsq_channel_timed_out", "Messages that timed out in flight", labels=c_labels
        )
        c_clients = GaugeMetricFamily("nsq_channel_clients", "Subscribed clients", labels=c_labels)
        c_paused = GaugeMetricFamily(
            "nsq_channel_paused", "1 if the channel is paused", labels=c_labels
        )
        t_e2e = Metric(
            "nsq_topic_e2e_processing_latency_seconds",
            "Publish-to-FIN latency quantiles over the window, merged over channels",
            "summary",
        )
        c_e2e = Metric(
            "nsq_channel_e2e_processing_latency_seconds",
            "Publish-to-FIN latency quantiles over the window",
            "summary",
        )
        for topic in sorted(nsqd.topics.values(), key=lambda t: t.name):
            tl = [topic.name]
            t_depth.add_metric(tl, topic.depth)
            t_backend.add_metric(tl, topic.queue.backend.depth())
            t_msgs.add_metric(tl, topic.message_count)
            t_bytes.add_metric(tl, topic.message_bytes)
            t_paused.add_metric(tl, int(topic.paused))
            t_channels.add_metric(tl, len(topic.channels))
            if topic.log is not None:
                t_log_earliest.add_metric(tl, topic.log.earliest)
                t_log_latest.add_metric(tl, topic.log.latest)
                t_log_bytes.add_metric(tl, topic.log.size)
                t_log_segments.add_metric(tl, topic.log.segment_count)
            if any(e2e_sink(ch) for ch in topic.channels.values()):
                _add_quantiles(t_e2e, {"topic": topic.name}, topic_e2e(nsqd, topic))
            for ch in sorted(topic.channels.values(), key=lambda c: c.name):
                cl = [topic.name, ch.name]
                c_depth.add_metric(cl, ch.depth)
                c_backend.add_metric(cl, ch.queue.backend.depth())
                c_in_flight.add_metric(cl, len(ch.in_flight))
                c_deferred.add_metric(cl, len(ch.deferred))
                c_msgs.add_metric(cl, ch.message_count)
                c_requeued.add_metric(cl, ch.requeue_count)
                c_timed_out.add_metric(cl, ch.timeout_count)
                c_clients.add_metric(cl, len(ch.clients))
                c_paused.add_metric(cl, int(ch.paused))
                if ch.screening or ch.max_depth or ch.max_bytes:
                    c_dead.add_metric(cl, ch.dead_letter_count)
                    c_expired.add_metric(cl, ch.expired_count)
                    c_dropped.add_metric(cl, ch.dropped_count)
                    c_over.add_metric(cl, ch.over_bound_count)
                if e2e_sink(ch) is not None:
                    labels = {"topic": topic.name, "channel": ch.name}
                    _add_quantiles(c_e2e, labels, channel_e2e(nsqd, ch))
        yield from (t_depth, t_backend, t_msgs, t_bytes, t_paused, t_channels, t_e2e)
        yield from (t_log_earliest, t_log_latest, t_log_bytes, t_log_segments)
        yield from (c_depth, c_backend, c_in_flight, c_deferred, c_msgs, c_requeued)
        yield from (c_timed_out, c_clients, c_paused, c_e2e, c_dead, c_expired, c_dropped)
        yield c_over


def _add_quantiles(metric: Metric, labels: dict[str, str], result: dict[str, object]) -> None:
    percentiles = result["percentiles"]
    assert isinstance(percentiles, list)
    for p in percentiles:
        metric.add_sample(metric.name, {**labels, "quantile": str(p["quantile"])}, p["value"] / 1e9)
    count = result["count"]
    assert isinstance(count, int)
    metric.add_sample(metric.name + "_count", labels, count)


def make_registry(nsqd: NSQDHost) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NSQCollector(nsqd))
    # The process, GC and platform collectors are stateless readers: share the defaults'.
    for collector in (PROCESS_COLLECTOR, GC_COLLECTOR, PLATFORM_COLLECTOR):
        registry.register(collector)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)
