"""What a node says of the partitions it holds (``/stats``, ``/topic/replication``,
``/metrics``): each partition's role, epoch, in-sync set, commit point, followers' lag and its
channels' checkpoints as etcd held them at the last read. No I/O: from the replicator's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .partition import Partition, Role
from .records import ClusterState, PartKey, Tombstone


def describe(
    topic: str,
    partitions: Mapping[PartKey, Partition],
    state: ClusterState,
    now: float,
    holder: int,
) -> list[dict[str, Any]]:
    """For ``/stats`` and ``/topic/config``: every partition of ``topic`` this node holds
    (``now``: the wall clock, for its readers; ``holder``: this member's node id, which a
    node of several workers names each copy by)."""
    out = []
    for (name, origin), p in sorted(partitions.items()):
        if name != topic:
            continue
        lags = {
            str(m[0]): max(p.log.latest - a, 0) for m, a in p.acks.items() if p.role is Role.LEADER
        }
        out.append(
            {
                "partition": origin,
                "node_id": holder,
                "role": p.role.value,
                "leader": p.leader,
                "epoch": p.epoch,
                "isr": [m[0] for m in p.isr],
                "replicas": p.replicas,
                "committed": p.hw,
                "earliest": p.log.earliest,
                "latest": p.log.latest,
                "bytes": p.log.size,
                "segments": p.log.segment_count,
                "follower_lag": lags,
                "checkpoints": checkpoints(state, name, origin),
                # Readers of this copy that keep their own offsets (``storage/readers.py``).
                "readers": p.log.readers.describe(p.log.visible, now),
            }
        )
    return out


def checkpoints(state: ClusterState, topic: str, origin: int) -> dict[str, Any]:
    """The channel checkpoints of a partition as etcd held them at the last tick, by holder:
    each channel's first pending offset, its end (None: open) and its out-of-order ranges;
    or whom an adopted one went to."""
    out: dict[str, Any] = {}
    for holder, stored in sorted(state.checkpoints.get((topic, origin), {}).items()):
        doc = stored.value
        if isinstance(doc, Tombstone):
            out[str(holder)] = {"adopted_by": doc.adopted_by, "end": doc.end}
            continue
        out[str(holder)] = {
            name: {
                "low": w.get("low"),
                "end": w.get("end"),
                "done_ranges": len(w["done"]),
                "attempts_kept": len(w.get("attempts", {})),
                "attempts_max": max(w.get("attempts", {}).values(), default=0),
                "deferred_kept": len(w.get("due", {})),
            }
            for name, w in doc.channels.items()
            if isinstance(w, dict) and isinstance(w.get("done"), list)
        }
    return out


def offline(isr: tuple[int, ...], lost: str) -> str:
    """Why a leaderless partition waits: no member of its in-sync set that may lead is alive
    (this copy is outside the set, or lost the offsets ``lost``)."""
    why = (
        f"this copy lost offsets {lost} and fetches them from the next leader"
        if lost
        else "this copy, not in it, may lack acknowledged records"
    )
    members = list(isr)
    return f"no member of its in-sync set {members} that may lead is alive; it waits ({why})"
