"""``/stats``: nsqd's ``GetStats`` over the live objects, and its JSON and text forms.

Keys, key order and types are nsqd's (``nsqd/stats.go``, ``nsqd/client_v2.go``), so that Go
nsqadmin, nsq_stat and exporters read them unchanged. One deliberate difference: a client's
``pub_counts`` lists every topic it published to (nsqd shows at most one: README,
"Differences from nsqd").
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from ..core.e2e import E2ELatency, merged_result, nanoseconds_to_human
from ..internal.gotext import format_duration
from ..internal.version import version_string
from .host import NSQDHost, StatsClient

if TYPE_CHECKING:
    from ..core.channel import Channel
    from ..core.topic import Topic

Json = dict[str, Any]


def health(nsqd: NSQDHost) -> str:
    """nsqd's ``GetHealth``: ``OK`` or ``NOK - <last backend error>``."""
    return "OK" if nsqd.health_error is None else f"NOK - {nsqd.health_error}"


def e2e_sink(channel: Channel) -> E2ELatency | None:
    sink = channel.e2e_sink
    return sink if isinstance(sink, E2ELatency) else None


def _percentiles(nsqd: NSQDHost) -> list[float] | None:
    return nsqd.opts.e2e_processing_latency_percentiles or None


def channel_e2e(nsqd: NSQDHost, channel: Channel) -> Json:
    sink = e2e_sink(channel)
    return merged_result([sink] if sink else [], _percentiles(nsqd) if sink else None)


def topic_e2e(nsqd: NSQDHost, topic: Topic) -> Json:
    # nsqd: the merge of the channels' streams, or an empty result when none has one.
    sinks = [s for s in map(e2e_sink, topic.channels.values()) if s is not None]
    return merged_result(sinks, _percentiles(nsqd) if sinks else None)


def client_stats(client: StatsClient, topic_filter: str = "") -> Json:
    """nsqd's ``ClientV2Stats``; optional keys are left out when empty, as its omitempty."""
    stats: Json = {
        "client_id": client.client_id,
        "hostname": client.hostname,
        "version": "V2",
        "remote_address": client.remote_address,
        "state": int(client.state),
        "ready_count": client.rdy,
        "in_flight_count": client.in_flight_count,
        "message_count": client.message_count,
        "finish_count": client.finish_count,
        "requeue_count": client.requeue_count,
        "connect_ts": client.connect_ts,
        "sample_rate": client.sample_rate,
        "deflate": client.deflate,
        "snappy": client.snappy,
        "user_agent": client.user_agent,
    }
    if client.authed:
        stats["authed"] = True
    if client.auth_identity:
        stats["auth_identity"] = client.auth_identity
    if client.auth_identity_url:
        stats["auth_identity_url"] = client.auth_identity_url
    stats["topology_zone"] = client.topology_zone
    stats["topology_region"] = client.topology_region
    pub_counts = [
        {"topic": t, "count": n}
        for t, n in sorted(client.pub_counts.items())
        if not topic_filter or t == topic_filter
    ]
    if pub_counts:
        stats["pub_counts"] = pub_counts
    stats["tls"] = client.tls
    stats["tls_cipher_suite"] = client.tls_cipher_suite
    stats["tls_version"] = client.tls_version
    stats["tls_negotiated_protocol"] = client.tls_negotiated_protocol
    stats["tls_negotiated_protocol_is_mutual"] = client.tls_negotiated_protocol_is_mutual
    return stats


def channel_stats(
    nsqd: NSQDHost, channel: Channel, include_clients: bool, topic_filter: str = ""
) -> Json:
    clients: list[Json] | None = None
    if include_clients:
        clients = [
            client_stats(cast("StatsClient", c), topic_filter) for c in channel.clients.values()
        ]
    stats: Json = {
        "channel_name": channel.name,
        "depth": channel.depth,
        "backend_depth": channel.queue.backend.depth(),
        "in_flight_count": len(channel.in_flight),
        "deferred_count": len(channel.deferred),
        "message_count": channel.message_count,
        "requeue_count": channel.requeue_count,
        "timeout_count": channel.timeout_count,
        "client_count": len(channel.clients),
        "clients": clients,
        "paused": channel.paused,
        "e2e_processing_latency": channel_e2e(nsqd, channel),
        # pynsqd's own, after nsqd's keys: messages held in memory past --mem-queue-size
        # because a disk write failed
        "overflow_count": channel.queue.overflow_count,
    }
    if channel.windows is not None:  # a replicated topic's channel (docs/replication.md)
        stats["replicated"] = {
            "windows": {
                str(origin): {"low": w.low, "end": w.end, "done_ranges": len(w.done)}
                for origin, w in sorted(channel.windows.items())
            },
            "superseded_count": channel.stale_count,
        }
    screen, bounds = channel.screen, channel.bounds
    if (
        screen.on
        or bounds.on
        or screen.dead_letter_count
        or screen.expired_count
        or bounds.dropped_count
        or bounds.over_bound_count
    ):  # pynsqd's message lifecycle, shown once it is in use
        stats["lifecycle"] = {
            "max_attempts": screen.max_attempts,
            "msg_ttl": format_duration(screen.msg_ttl_ns / 1e9),
            "max_depth": bounds.max_depth,
            "max_bytes": bounds.max_bytes,
            "bound_policy": bounds.policy,
            "dead_letter_count": screen.dead_letter_count,
            "dead_letter_failed_count": screen.dead_letter_failed_count,
            "expired_count": screen.expired_count,
            "dropped_count": bounds.dropped_count,
            "over_bound_count": bounds.over_bound_count,
        }
    return stats


def topic_stats(nsqd: NSQDHost, topic: Topic, channels: list[Json]) -> Json:
    stats: Json = {
        "topic_name": topic.name,
        "channels": channels,
        "depth": topic.depth,
        "backend_depth": topic.queue.backend.depth(),
        "message_count": topic.message_count,
        "message_bytes": topic.message_bytes,
        "paused": topic.paused,
        "e2e_processing_latency": topic_e2e(nsqd, topic),
    }
    if topic.max_depth or topic.dropped_count:  # pynsqd: a bound on the topic's own backlog
        stats["lifecycle"] = {
            "max_depth": topic.max_depth,
            "bound_policy": topic.bound_policy,
            "dropped_count": topic.dropped_count,
        }
    if topic.log is not None:  # pynsqd: a replayable topic (absent otherwise, as in nsqd)
        stats["log"] = {
            "earliest_offset": topic.log.earliest,
            "latest_offset": topic.log.latest,
            "bytes": topic.log.size,
            "segments": topic.log.segment_count,
            # Idempotent publishes answered OK without a new record (core/dedup.py).
            "duplicate_count": topic.duplicate_count,
        }
        kept = nsqd.retention.get(topic.name)
        if kept is not None:  # readers that keep their own offsets (a Spark query): their lag
            stats["log"]["readers"] = kept.readers.describe(kept.visible, time.time())
        if nsqd.workers.placement.count > 1 and topic.kept_by is None:
            # --workers: this worker's log is a partition of the node's (``merge_stats``).
            stats["log"]["partition"] = nsqd.opts.node_id
        replication = nsqd.replication
        settings = replication.settings_for(topic.name) if replication is not None else None
        if replication is not None and settings is not None and settings.replicated:
            stats["replication"] = {
                **dataclasses.asdict(settings),
                "partitions": replication.describe(topic.name),
            }
    return stats


def get_stats(
    nsqd: NSQDHost, topic_name: str = "", channel_name: str = "", include_clients: bool = True
) -> tuple[list[Json] | None, list[Json] | None]:
    """nsqd's ``GetStats``: (topics, producers), sorted by name.

    An unknown topic gives (None, None): ``"topics": null``. An unknown channel drops its
    topic. ``producers`` is None unless clients are included and some connection published.
    """
    if not topic_name:
        topics = list(nsqd.topics.values())
    elif topic_name in nsqd.topics:
        topics = [nsqd.topics[topic_name]]
    else:
        return None, None
    out: list[Json] = []
    for topic in sorted(topics, key=lambda t: t.name):
        if not channel_name:
            channels = list(topic.channels.values())
        elif channel_name in topic.channels:
            channels = [topic.channels[channel_name]]
        else:
            continue
        channel_list = [
            channel_stats(nsqd, ch, include_clients, topic_name)
            for ch in sorted(channels, key=lambda c: c.name)
        ]
        out.append(topic_stats(nsqd, topic, channel_list))
    producers: list[Json] | None = None
    if include_clients:
        found = [client_stats(c) for c in nsqd.clients.values() if c.pub_counts]
        producers = found or None
    return out, producers


# -- a node of several workers (``--workers``) ---------------------------------------------

#: The user agent of a connection between workers (``server/workers/dial.py``): not a client.
_LINK_AGENT_PREFIX = "pynsqd-worker-link/"


def _is_link(client: Json) -> bool:
    return str(client.get("user_agent", "")).startswith(_LINK_AGENT_PREFIX)


#: How ``_add_into`` joins a key's two values (lists of channels, clients; a replication).
_Lists = dict[str, Callable[[Any, Any], Any]]


def _add_into(into: Json, other: Json, lists: _Lists, *, counts_only: bool = False) -> None:
    """``other``'s figures added into ``into``: numbers summed (in a nested object such as
    ``lifecycle``, only counts: its settings are the same on every worker), lists by
    ``lists``, anything else kept from the first."""
    for key, value in other.items():
        if key in lists:
            into[key] = lists[key](into.get(key) or [], value or [])
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            into[key] = dict(into[key])
            _add_into(into[key], value, {}, counts_only=True)
        elif isinstance(value, int) and not isinstance(value, bool):
            if isinstance(into.get(key), int) and (not counts_only or key.endswith("count")):
                into[key] += value
        elif key not in into:
            into[key] = value


def by_partition(copies: Iterable[Json]) -> list[Json]:
    """A node's copies of partitions (each named by its member, ``node_id``), in order."""
    return sorted(copies, key=lambda q: (q["partition"], q.get("node_id", 0)))


def _merge_replication(a: Json, b: Json) -> Json:
    """A replicated topic's copies on a node whose workers are members: every worker's."""
    if not a:
        return b
    return dict(a, partitions=by_partition([*a.get("partitions", ()), *b.get("partitions", ())]))


def _merge_channels(a: list[Json], b: list[Json]) -> list[Json]:
    by = {c["channel_name"]: c for c in a}
    for c in b:
        if c["channel_name"] in by:
            _add_into(by[c["channel_name"]], c, {"clients": lambda x, y: x + y})
        else:
            by[c["channel_name"]] = dict(c)
    return [by[k] for k in sorted(by)]


#: A log's figures that the node's answer sums over its partitions.
_LOG_SUMS = ("earliest_offset", "latest_offset", "bytes", "segments", "duplicate_count")


def _merge_logs(logs: list[Json]) -> Json:
    """A topic's ``log`` for the node: one worker's as it is (a topic one worker keeps), or,
    when each worker's log is a partition (``partition``), their sums and each partition."""
    partitioned = sorted((lg for lg in logs if "partition" in lg), key=lambda lg: lg["partition"])
    if not partitioned:
        return logs[0]
    out: Json = {key: sum(int(lg.get(key, 0)) for lg in partitioned) for key in _LOG_SUMS}
    out["partitions"] = partitioned
    return out


def merge_stats(
    parts: list[tuple[list[Json] | None, list[Json] | None]],
) -> tuple[list[Json] | None, list[Json] | None]:
    """Every worker's ``get_stats`` → the node's: counts summed per topic and channel (by
    name), clients and producers listed together; the workers' links to each other are not
    clients, and what they hold in flight is counted once, where it is delivered. A channel is
    listed once every worker has it (a SUB's channel is being made on the others: until then a
    message published through one of them would not be its, so the node does not have it yet;
    nsqd lists a channel that takes every later message)."""
    topics: dict[str, Json] = {}
    producers: list[Json] = []
    seen_topics = False
    holders: dict[tuple[str, str], int] = {}
    logs: dict[str, list[Json]] = {}
    for part_topics, part_producers in parts:
        if part_topics is not None:
            seen_topics = True
        for t in part_topics or []:
            t = dict(t, channels=[dict(c) for c in t.get("channels") or []])
            name = t["topic_name"]
            if "log" in t:
                logs.setdefault(name, []).append(t.pop("log"))
            for c in t["channels"]:
                key = (name, c["channel_name"])
                holders[key] = holders.get(key, 0) + 1
            if name in topics:
                _add_into(
                    topics[name],
                    t,
                    {"channels": _merge_channels, "replication": _merge_replication},
                )
            else:
                t["channels"] = _merge_channels([], t["channels"])
                topics[name] = t
        producers.extend(p for p in part_producers or [] if not _is_link(p))
    for name, kept in logs.items():
        topics[name]["log"] = _merge_logs(kept)
    for t in topics.values():
        t["channels"] = [
            c for c in t["channels"] if holders[(t["topic_name"], c["channel_name"])] == len(parts)
        ]
        for c in t["channels"]:
            clients = c.get("clients")
            if clients:
                links = [x for x in clients if _is_link(x)]
                c["clients"] = [x for x in clients if not _is_link(x)]
                c["in_flight_count"] = max(
                    0, c["in_flight_count"] - sum(x.get("in_flight_count", 0) for x in links)
                )
    if not seen_topics:
        return None, None
    return [topics[k] for k in sorted(topics)], producers or None


# -- the text form ------------------------------------------------------------------------


def _rfc3339(ts: float) -> str:
    text = datetime.fromtimestamp(ts).astimezone().isoformat(timespec="seconds")
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def _e2e_text(result: Json) -> str:
    return ", ".join(nanoseconds_to_human(p["value"]) for p in result["percentiles"] or [])


def _client_text(c: Json, now: float) -> str:
    """nsqd's ``ClientV2Stats.String``: a producer line or a consumer line."""
    connected = format_duration(max(0, int(now - c["connect_ts"])))
    port = c["remote_address"].rpartition(":")[2]
    ident = f"{c['hostname']}:{port} {c['user_agent']}"
    pub_counts = c.get("pub_counts")
    if pub_counts:
        total = sum(p["count"] for p in pub_counts)
        topics = ",".join(f"{p['topic']}={p['count']}" for p in pub_counts)
        return (
            f"[{c['version']} {ident:<21}] msgs: {total:<8} topics: {topics} connected: {connected}"
        )
    return (
        f"[{c['version']} {ident:<21}] state: {c['state']} inflt: {c['in_flight_count']:<4} "
        f"rdy: {c['ready_count']:<4} fin: {c['finish_count']:<8} "
        f"re-q: {c['requeue_count']:<8} msgs: {c['message_count']:<8} connected: {connected}"
    )


def print_stats(
    version: str,
    topics: list[Json] | None,
    producers: list[Json] | None,
    memory: dict[str, int] | None,
    health_text: str,
    start_time: float,
) -> str:
    """nsqd's ``printStats``."""
    now = time.time()
    w: list[str] = [
        f"{version}\n",
        f"start_time {_rfc3339(start_time)}\n",
        f"uptime {format_duration(now - start_time)}\n",
        f"\nHealth: {health_text}\n",
    ]
    if memory is not None:
        w.append("\nMemory:\n")
        w.extend(f"   {key:<25}\t{value}\n" for key, value in memory.items())
    w.append("\nTopics: None\n" if not topics else "\nTopics:")
    for t in topics or []:
        prefix = "*P " if t["paused"] else "   "
        w.append(
            f"\n{prefix}[{t['topic_name']:<15}] depth: {t['depth']:<5} "
            f"be-depth: {t['backend_depth']:<5} msgs: {t['message_count']:<8} "
            f"e2e%: {_e2e_text(t['e2e_processing_latency'])}\n"
        )
        if "log" in t:
            lg = t["log"]
            w.append(
                f"      log: offsets {lg['earliest_offset']}-{lg['latest_offset']} "
                f"bytes: {lg['bytes']} segments: {lg['segments']}\n"
            )
        if "replication" in t:
            rp = t["replication"]
            w.append(
                f"      replication: replicas {rp['replicas']} min_insync {rp['min_insync']} "
                f"acks {rp['acks']} durability {rp['durability']}\n"
            )
            for p in rp["partitions"]:
                lag = " ".join(f"{k}:{v}" for k, v in sorted(p["follower_lag"].items()))
                w.append(
                    f"        partition {p['partition']}: {p['role']} leader {p['leader']} "
                    f"epoch {p['epoch']} isr {p['isr']} committed {p['committed']} "
                    f"latest {p['latest']}{' lag ' + lag if lag else ''}\n"
                )
        for c in t["channels"]:
            prefix = "   *P " if c["paused"] else "      "
            w.append(
                f"{prefix}[{c['channel_name']:<25}] depth: {c['depth']:<5} "
                f"be-depth: {c['backend_depth']:<5} inflt: {c['in_flight_count']:<4} "
                f"def: {c['deferred_count']:<4} re-q: {c['requeue_count']:<5} "
                f"timeout: {c['timeout_count']:<5} msgs: {c['message_count']:<8} "
                f"e2e%: {_e2e_text(c['e2e_processing_latency'])}\n"
            )
            for client in c["clients"] or []:
                w.append(f"        {_client_text(client, now)}\n")
    if not producers:
        w.append("\nProducers: None\n")
    else:
        w.append("\nProducers:\n")
        w.extend(f"   {_client_text(p, now)}\n" for p in producers)
    return "".join(w)


def stats_version() -> str:
    """``nsqd v1.3.0 (built w/pynsqd-0.1.0)``, the first line of the text form."""
    return version_string()
