"""What nsqadmin shows, shaped from the nodes' ``/stats`` answers: no I/O (``cluster.py``
fetches them), tested on answers alone."""

from __future__ import annotations

from typing import Any

from ..client.cluster import CHANNEL_COUNTERS as COUNTERS

#: What the topic page shows of each copy of a replicated partition (``/api/topics/<t>``:
#: ``copies``), with the value a node too old to report it gets.
_COPY_KEYS: dict[str, Any] = {
    "partition": 0,
    "role": "",
    "earliest": 0,
    "latest": 0,
    "committed": 0,
    "bytes": 0,
    "segments": 0,
}


def _copy_order(copy: dict[str, Any]) -> tuple[int, bool, str]:
    """By partition, its leader's copy first, then by node."""
    return copy["partition"], copy["role"] != "leader", copy["node"]


def topic_view(name: str, stats: dict[str, Any], errors: list[str]) -> dict[str, Any] | None:
    """``/api/topics/<name>``: the topic summed over the nodes that have it (None: none has
    it)."""
    nodes: list[dict[str, Any]] = []
    channels: dict[str, dict[str, Any]] = {}
    partitions: dict[int, dict[str, Any]] = {}
    #: A replicated topic: every copy of every partition, on whichever node holds it.
    copies: list[dict[str, Any]] = []
    readers: dict[tuple[str, Any], dict[str, Any]] = {}
    for node, s in stats.items():
        for t in s.get("topics") or []:
            if t["topic_name"] != name:
                continue
            chans = t.get("channels") or []
            row = {
                "node": node,
                "depth": t.get("depth", 0),
                "backend_depth": t.get("backend_depth", 0),
                "message_count": t.get("message_count", 0),
                "message_bytes": t.get("message_bytes", 0),
                "channels": len(chans),
                "in_flight_count": sum(c.get("in_flight_count", 0) for c in chans),
                "deferred_count": sum(c.get("deferred_count", 0) for c in chans),
                "paused": t.get("paused"),
            }
            if "log" in t:
                row["log"] = t["log"]
            nodes.append(row)
            # A replicated topic: each partition as the node leading it reports it.
            parts = (t.get("replication") or {}).get("partitions") or []
            for part in parts:
                if part.get("role") == "leader":
                    partitions[part["partition"]] = {**part, "node": node}
                copies.append({k: part.get(k, v) for k, v in _COPY_KEYS.items()} | {"node": node})
            # Readers that keep their own offsets (a Spark query), per partition or log.
            logged = t.get("log") or {}
            found = (
                [(p["partition"], r) for p in parts for r in p.get("readers") or []]
                # --workers: each worker's log is a partition of the node's.
                or [
                    (p["partition"], r)
                    for p in logged.get("partitions") or []
                    for r in p.get("readers") or []
                ]
                or [("", r) for r in logged.get("readers") or []]
            )
            for p, r in found:  # each reader's freshest report of each partition, or log
                key = (r["reader"], p if p != "" else f"log of {node}")
                seen = readers.get(key)
                if seen is None or r.get("updated", 0) > seen.get("updated", 0):
                    readers[key] = {**r, "node": node, "partition": p}
            for c in t.get("channels") or []:
                agg = channels.setdefault(
                    c["channel_name"],
                    {
                        "channel": c["channel_name"],
                        **dict.fromkeys(COUNTERS, 0),
                        "clients": 0,
                        "paused": False,
                    },
                )
                for k in COUNTERS:
                    agg[k] += c.get(k, 0)
                agg["clients"] += len(c.get("clients") or [])
                agg["paused"] = agg["paused"] or bool(c.get("paused"))
    if not nodes:
        return None
    # A replicated topic: what was published is its partitions' committed offsets, whoever
    # leads them now (a dead node's own count is gone with it).
    published = sum(p.get("committed", 0) for p in partitions.values())
    return {
        "topic": name,
        "depth": sum(n["depth"] for n in nodes),
        "message_count": published or sum(n["message_count"] for n in nodes),
        "paused": any(n["paused"] for n in nodes),
        "nodes": nodes,
        "channels": [channels[c] for c in sorted(channels)],
        "partitions": [partitions[p] for p in sorted(partitions)],
        "copies": sorted(copies, key=_copy_order),
        "readers": [readers[k] for k in sorted(readers, key=lambda k: (k[0], str(k[1])))],
        "errors": errors,
    }


def channel_view(
    topic: str, name: str, stats: dict[str, Any], errors: list[str]
) -> dict[str, Any] | None:
    """``/api/topics/<topic>/<name>``: the channel summed over the nodes."""
    nodes: list[dict[str, Any]] = []
    clients: list[dict[str, Any]] = []
    for node, s in stats.items():
        for t in s.get("topics") or []:
            if t["topic_name"] != topic:
                continue
            for c in t.get("channels") or []:
                if c["channel_name"] != name:
                    continue
                nodes.append(
                    {
                        "node": node,
                        **{k: c.get(k, 0) for k in COUNTERS},
                        "clients": len(c.get("clients") or []),
                        "paused": c.get("paused"),
                        "e2e": c.get("e2e_processing_latency"),
                        "lifecycle": c.get("lifecycle"),
                    }
                )
                for cl in c.get("clients") or []:
                    clients.append({"node": node, **cl})
    if not nodes:
        return None
    return {
        "topic": topic,
        "channel": name,
        **{k: sum(n[k] for n in nodes) for k in COUNTERS},
        "paused": any(n["paused"] for n in nodes),
        "nodes": nodes,
        "clients": clients,
        "errors": errors,
    }


def node_view(name: str, s: dict[str, Any], errors: list[str]) -> dict[str, Any]:
    """``/api/nodes/<name>``: one nsqd's topics, channels and clients, from its ``/stats``."""
    topics, channels, clients = [], [], []
    for t in s.get("topics") or []:
        chans = t.get("channels") or []
        topics.append(
            {
                "topic": t["topic_name"],
                "depth": t.get("depth", 0),
                "backend_depth": t.get("backend_depth", 0),
                "message_count": t.get("message_count", 0),
                "channels": len(chans),
                "paused": bool(t.get("paused")),
                "log": t.get("log"),
            }
        )
        for c in chans:
            channels.append(
                {
                    "topic": t["topic_name"],
                    "channel": c["channel_name"],
                    **{k: c.get(k, 0) for k in COUNTERS},
                    "clients": len(c.get("clients") or []),
                    "paused": bool(c.get("paused")),
                }
            )
            for cl in c.get("clients") or []:
                clients.append({"topic": t["topic_name"], "channel": c["channel_name"], **cl})
    return {
        "node": name,
        "version": s.get("version", ""),
        "health": s.get("health", ""),
        "start_time": s.get("start_time", 0),
        "topics": topics,
        "channels": channels,
        "clients": clients,
        "errors": errors,
    }
