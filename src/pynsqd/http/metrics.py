"""``GET /metrics``: Prometheus text exposition (nsqio/nsq#732; README, "Differences from nsqd").

A custom collector reads the live topics, channels and clients at scrape time (nothing is
counted on the message path); prometheus_client's own collectors add the process, GC and
platform metrics, and its ``generate_latest`` writes the text format.

Names follow Prometheus conventions: an ``nsq_`` namespace, ``_total`` on counters, base units
(seconds) for latencies, and labels for topic and channel names.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

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


Value = Callable[[Any], float]
Family = tuple[str, str, type[GaugeMetricFamily] | type[CounterMetricFamily], Value]
G, C = GaugeMetricFamily, CounterMetricFamily

#: Every topic's families: (name, help, kind, value).
TOPIC_FAMILIES: tuple[Family, ...] = (
    ("nsq_topic_depth", "Messages queued (memory + disk)", G, lambda t: t.depth),
    ("nsq_topic_backend_depth", "Messages queued on disk", G, lambda t: t.queue.backend.depth()),
    ("nsq_topic_messages", "Messages published", C, lambda t: t.message_count),
    ("nsq_topic_message_bytes", "Message body bytes published", C, lambda t: t.message_bytes),
    (
        "nsq_topic_duplicates",
        "Idempotent publishes answered OK without a new record (already in the log)",
        C,
        lambda t: t.duplicate_count,
    ),
    ("nsq_topic_paused", "1 if the topic is paused", G, lambda t: int(t.paused)),
    ("nsq_topic_channels", "Channels of the topic", G, lambda t: len(t.channels)),
)
#: A replayable topic's log (the value is read from ``topic.log``).
LOG_FAMILIES: tuple[Family, ...] = (
    (
        "nsq_topic_log_earliest_offset",
        "Oldest retained offset of a replayable topic",
        G,
        lambda log: log.earliest,
    ),
    (
        "nsq_topic_log_latest_offset",
        "Next offset to be written to a replayable topic's log",
        G,
        lambda log: log.latest,
    ),
    ("nsq_topic_log_bytes", "Bytes in a replayable topic's log", G, lambda log: log.size),
    (
        "nsq_topic_log_segments",
        "Segment files of a replayable topic's log",
        G,
        lambda log: log.segment_count,
    ),
)
#: Each partition of a replicated topic this node holds a copy of (``cluster/``; the value is
#: read from ``Replicator.describe``'s entry; label ``role``: leader, follower or none).
PARTITION_FAMILIES: tuple[Family, ...] = (
    (
        "nsq_partition_leader",
        "Node id leading the partition (-1: none known)",
        G,
        lambda p: p["leader"],
    ),
    (
        "nsq_partition_epoch",
        "The partition's leader epoch (an etcd revision)",
        G,
        lambda p: p["epoch"],
    ),
    ("nsq_partition_in_sync", "Members of the partition's in-sync set", G, lambda p: len(p["isr"])),
    (
        "nsq_partition_committed_offset",
        "The partition's high watermark: offsets below it are committed",
        G,
        lambda p: p["committed"],
    ),
    (
        "nsq_partition_latest_offset",
        "Next offset of this node's copy of the partition",
        G,
        lambda p: p["latest"],
    ),
)
#: Every channel's families.
CHANNEL_FAMILIES: tuple[Family, ...] = (
    ("nsq_channel_depth", "Messages queued (memory + disk)", G, lambda c: c.depth),
    ("nsq_channel_backend_depth", "Messages queued on disk", G, lambda c: c.queue.backend.depth()),
    ("nsq_channel_in_flight", "Messages in flight", G, lambda c: len(c.in_flight)),
    ("nsq_channel_deferred", "Deferred messages", G, lambda c: len(c.deferred)),
    ("nsq_channel_messages", "Messages put into the channel", C, lambda c: c.message_count),
    ("nsq_channel_requeued", "Messages requeued (REQ)", C, lambda c: c.requeue_count),
    ("nsq_channel_timed_out", "Messages that timed out in flight", C, lambda c: c.timeout_count),
    ("nsq_channel_clients", "Subscribed clients", G, lambda c: len(c.clients)),
    ("nsq_channel_paused", "1 if the channel is paused", G, lambda c: int(c.paused)),
)
#: A channel's message lifecycle, once it has one (max attempts, TTL or a bound).
LIFECYCLE_FAMILIES: tuple[Family, ...] = (
    (
        "nsq_channel_dead_lettered",
        "Messages moved to the dead-letter topic after --max-attempts",
        C,
        lambda c: c.screen.dead_letter_count,
    ),
    ("nsq_channel_expired", "Messages dropped past their TTL", C, lambda c: c.screen.expired_count),
    (
        "nsq_channel_dropped",
        "Messages dropped by a drop-oldest bound",
        C,
        lambda c: c.bounds.dropped_count,
    ),
    (
        "nsq_channel_over_bound",
        "Messages taken back from consumers (REQ, timeout, disconnect) past a bound",
        C,
        lambda c: c.bounds.over_bound_count,
    ),
)

#: A replicated topic's channel (``cluster/checkpoints.py``).
REPLICATED_FAMILIES: tuple[Family, ...] = (
    (
        "nsq_channel_superseded",
        "Messages not delivered because another node took over their partition's channel state",
        C,
        lambda c: c.stale_count,
    ),
)


Families = list[tuple[GaugeMetricFamily | CounterMetricFamily, Value]]


def _families(table: tuple[Family, ...], labels: list[str]) -> Families:
    return [(kind(name, text, labels=labels), value) for name, text, kind, value in table]


class NSQCollector:
    """Topic, channel and client metrics of one nsqd, from the tables above."""

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
        topic_fams = _families(TOPIC_FAMILIES, ["topic"])
        log_fams = _families(LOG_FAMILIES, ["topic"])
        channel_fams = _families(CHANNEL_FAMILIES, ["topic", "channel"])
        lifecycle_fams = _families(LIFECYCLE_FAMILIES, ["topic", "channel"])
        replicated_fams = _families(REPLICATED_FAMILIES, ["topic", "channel"])
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
            for fam, value in topic_fams:
                fam.add_metric(tl, value(topic))
            if topic.log is not None:
                for fam, value in log_fams:
                    fam.add_metric(tl, value(topic.log))
            if any(e2e_sink(ch) for ch in topic.channels.values()):
                _add_quantiles(t_e2e, {"topic": topic.name}, topic_e2e(nsqd, topic))
            for ch in sorted(topic.channels.values(), key=lambda c: c.name):
                cl = [topic.name, ch.name]
                for fam, value in channel_fams:
                    fam.add_metric(cl, value(ch))
                if ch.screen.on or ch.bounds.on:
                    for fam, value in lifecycle_fams:
                        fam.add_metric(cl, value(ch))
                if ch.windows is not None:
                    for fam, value in replicated_fams:
                        fam.add_metric(cl, value(ch))
                if e2e_sink(ch) is not None:
                    labels = {"topic": topic.name, "channel": ch.name}
                    _add_quantiles(c_e2e, labels, channel_e2e(nsqd, ch))
        part_fams = _families(PARTITION_FAMILIES, ["topic", "partition", "role"])
        lag = GaugeMetricFamily(
            "nsq_partition_follower_lag",
            "Leader: records a follower has yet to acknowledge",
            labels=["topic", "partition", "follower"],
        )
        by_reader = ["topic", "partition", "reader"]
        committed = GaugeMetricFamily(
            "nsq_log_reader_committed_offset",
            "A reader that keeps its own offsets (a Spark query): the offset it committed",
            labels=by_reader,
        )
        behind_by = GaugeMetricFamily(
            "nsq_log_reader_lag",
            "A reader's records not yet committed (latest - committed)",
            labels=by_reader,
        )
        replication = nsqd.replication
        now = time.time()
        for name in sorted(nsqd.topics):
            parts = replication.describe(name) if replication is not None else []
            for part in parts:
                pl = [name, str(part["partition"]), part["role"]]
                for fam, value in part_fams:
                    fam.add_metric(pl, value(part))
                for follower, behind in sorted(part["follower_lag"].items()):
                    lag.add_metric([name, str(part["partition"]), follower], behind)
            kept = nsqd.retention.get(name)
            # --workers: this worker's log is a partition of the node's, named by its node id.
            own = str(nsqd.opts.node_id) if nsqd.workers.placement.count > 1 else ""
            readers = [(str(p["partition"]), r) for p in parts for r in p["readers"]] or [
                (own, r) for r in (kept.readers.describe(kept.visible, now) if kept else [])
            ]
            for partition, r in readers:
                committed.add_metric([name, partition, str(r["reader"])], r["committed"])
                behind_by.add_metric([name, partition, str(r["reader"])], r["lag"])
        for fams in (
            topic_fams,
            log_fams,
            channel_fams,
            lifecycle_fams,
            replicated_fams,
            part_fams,
        ):
            yield from (fam for fam, _ in fams)
        yield from (lag, committed, behind_by, t_e2e, c_e2e)


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


# -- a node of several workers (``--workers``) ---------------------------------------------

#: Samples that are the same kind of fact on every worker: not summed.
_COMBINE: dict[str, Callable[[list[float]], float]] = {
    "nsq_build_info": max,
    "nsq_healthy": min,
    "nsq_start_time_seconds": min,
    "nsq_topics": max,
    "process_start_time_seconds": min,
    "python_info": max,
}


class _Merged:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def merge_metrics(texts: list[bytes]) -> bytes:
    """Every worker's ``/metrics`` → the node's: each sample (name and labels) summed over
    the workers, except facts that are the same on each (build info, health: the worst,
    start time: the first) and quantiles (the highest)."""
    from prometheus_client.parser import text_string_to_metric_families

    order: list[str] = []
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]] = {}
    for text in texts:
        for fam in text_string_to_metric_families(text.decode("utf-8", "replace")):
            if fam.name not in families:
                families[fam.name] = Metric(fam.name, fam.documentation, fam.type)
                values[fam.name] = {}
                order.append(fam.name)
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                values[fam.name].setdefault(key, []).append(s.value)
    merged = []
    for name in order:
        fam = families[name]
        for (sample, labels), vs in values[name].items():
            how = _COMBINE.get(sample) or _COMBINE.get(name)
            if how is None:
                how = max if any(k == "quantile" for k, _ in labels) else sum
            fam.add_sample(sample, dict(labels), how(vs))
        merged.append(fam)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Merged(merged))
    return generate_latest(registry)
