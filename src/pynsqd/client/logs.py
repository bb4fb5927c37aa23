"""A replayable topic's logs across a cluster: which logs there are, and reading a range of one
with failover between the copies that serve it. Blocking (``cluster.py``'s HTTP side), no
threads, no logging configuration: it runs where its caller does (the Spark connector's
driver and executors, the tools).

Theory of operation. Each nsqd with the topic retained has a log, keyed by the node's storage
id (``/topic/offsets``: ``storage_id``, whatever address reached it). A replicated topic's
node answers with the partitions it holds a copy of (``partitions``, ``cluster``, ``node_id``)
and names the cluster's other nodes (``nodes``): ``survey_logs`` asks them too, and keys each
partition ``<cluster>/<origin node id>``, readable from the copies its leader counts in sync
(the leader first) up to the highest committed offset. ``read_range`` reads ``[start, end)`` of
one log: a node that does not answer (restarting) is tried again after the other copies, for
``retry_timeout``; a copy that has not yet learnt that the range is committed, or lost the
partition, passes to the next; records retention removed go to ``on_pruned`` (the caller
skips them or raises); a node that answers with another log than the one planned is an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ..protocol.log_record import LogRecord
from .cluster import LogChunk, LogOffsetOutOfRange, NodeHTTPError, read_log, topic_offsets
from .errors import NsqError
from .options import ClientOptions

__all__ = [
    "LogIdentityError",
    "NodeLog",
    "RangeUnreadable",
    "read_range",
    "survey_logs",
]

#: At most this much of a log in one ``GET /topic/log``.
READ_BYTES = 16 << 20


class LogIdentityError(RuntimeError):
    """Two nsqd processes answer with one storage id (a copied data directory), or the node
    at an address is no longer the log a range was planned on."""


class RangeUnreadable(RuntimeError):
    """A range of a log could not be read within the retry time."""


@dataclass(frozen=True)
class NodeLog:
    """One log of the topic, as a survey found it. ``key`` is its identity: a node's storage
    id (``storage/identity.py``), whatever address reached it (from a node too old to say,
    the address); for a replicated topic, the partition (``<cluster>/<origin node id>``),
    which ``replicas`` serve (in-sync copies, the leader first), each read with
    ``partition=``."""

    key: str
    address: str
    earliest: int
    latest: int
    instance: str = ""
    partition: int | None = None
    replicas: tuple[str, ...] = ()
    #: Other names of this log: the storage id of the worker whose partition it is (a
    #: ``--workers`` node), under which an older version's reader keyed it.
    aliases: tuple[str, ...] = ()


def survey_logs(
    topic: str,
    addresses: Iterable[str],
    opts: ClientOptions,
    *,
    strict: bool = False,
    warn: Callable[[str], None] = lambda _: None,
) -> dict[str, NodeLog]:
    """Each log of ``topic`` the addresses serve, by identity: two addresses reaching one
    process count once (the first), two processes answering with one storage id are refused
    (``LogIdentityError``); a replicated topic's partitions, each with the copies that can
    serve it. A node that cannot be asked (down, restarting) is ``warn``ed and left out,
    unless ``strict`` (then what it raised)."""
    found: dict[str, NodeLog] = {}
    copies: dict[str, list[tuple[str, int, dict[str, Any]]]] = {}
    todo = list(dict.fromkeys(addresses))
    for address in todo:
        try:
            doc = topic_offsets(address, topic, opts)
            held = doc.get("partitions")
            if isinstance(held, list) and doc.get("cluster") is not None:
                # The cluster's other nodes hold copies too: asked as well (one given node
                # is enough to find them all; one that is down is passed over).
                nodes = doc.get("nodes")
                if isinstance(nodes, dict):
                    todo += [a for a in nodes.values() if isinstance(a, str) and a not in todo]
                # Its own log is its own partition: keyed, like every copy, by partition.
                # (A node of several workers names the member holding each copy.)
                for q in held:
                    key = f"{doc['cluster']}/{int(q['partition'])}"
                    holder = int(q.get("node_id", doc["node_id"]))
                    copies.setdefault(key, []).append((address, holder, q))
                continue
            here = NodeLog(
                str(doc.get("storage_id") or address),
                address,
                int(doc["earliest"]),
                int(doc["latest"]),
                str(doc.get("instance") or ""),
            )
        except (NsqError, ConnectionError, ValueError, KeyError, TypeError) as e:
            if strict:
                raise
            warn(str(e))
            continue
        seen = found.get(here.key)
        if seen is None:
            found[here.key] = here
        elif seen.instance != here.instance:
            raise LogIdentityError(
                f"nsqd {seen.address} and {here.address} both answer with storage id "
                f"{here.key} but are different processes (a copied data directory?): give "
                f"each node its own --data-path"
            )
    for key, entries in copies.items():
        found[key] = _partition(key, entries)
    return found


def _partition(key: str, entries: list[tuple[str, int, dict[str, Any]]]) -> NodeLog:
    """A replicated partition from the copies found: readable up to the highest committed
    offset (the leader's), from the copies its leader counts in sync (all found, when the
    leader is not among them: it is down, or being replaced), the leader first."""
    leaders = [e for e in entries if e[2].get("role") == "leader"]
    leader = max(leaders, key=lambda e: int(e[2].get("epoch", 0))) if leaders else None
    isr = {int(n) for n in leader[2].get("isr", [])} if leader is not None else None
    usable = [e for e in entries if isr is None or e[1] in isr] or entries
    usable.sort(key=lambda e: (e is not leader, -int(e[2]["committed"])))
    return NodeLog(
        key,
        usable[0][0],
        max(int(e[2]["earliest"]) for e in usable),
        max(int(e[2]["committed"]) for e in usable),
        partition=int(usable[0][2]["partition"]),
        replicas=tuple(dict.fromkeys(e[0] for e in usable)),
        aliases=tuple(
            dict.fromkeys(str(e[2]["storage_id"]) for e in entries if e[2].get("storage_id"))
        ),
    )


def _retrying(
    address: str, key: str, topic: str, what: str, timeout: float, backoff: float
) -> Iterator[float]:
    """Yields before each try of a read (the time waited so far); raises RangeUnreadable
    once ``timeout`` is spent. The caller breaks out when a try succeeds."""
    began = time.monotonic()
    wait = backoff
    tries = 0
    while True:
        yield time.monotonic() - began
        tries += 1
        spent = time.monotonic() - began
        if spent + wait > timeout:
            raise RangeUnreadable(
                f"nsqd {address} (storage {key}) topic {topic}: {what} unreadable after "
                f"{tries} tries in {spent:.1f}s"
            )
        time.sleep(wait)
        wait = min(wait * 2, 2.0)


def read_range(
    topic: str,
    node: str,
    start: int,
    end: int,
    opts: ClientOptions,
    *,
    key: str = "",
    replicas: tuple[str, ...] = (),
    partition: int | None = None,
    retry_timeout: float = 60.0,
    retry_backoff: float = 0.1,
    on_pruned: Callable[[str, int, int], None] | None = None,
    warn: Callable[[str], None] = lambda _: None,
) -> Iterator[LogRecord]:
    """Records ``[start, end)`` of one log, read at ``node`` or, for a replicated partition,
    at the first of ``replicas`` that has them committed. Offsets retention removed before
    they were read go to ``on_pruned(address, first, end)`` (which raises to stop; without
    one, ``LogOffsetOutOfRange`` is raised) and are skipped. Raises ``RangeUnreadable`` after
    ``retry_timeout`` seconds of tries, ``LogIdentityError`` when ``key`` (a storage id) is no
    longer the log at ``node``."""
    candidates = list(dict.fromkeys([node, *replicas]))
    offset = start
    while offset < end:
        what = f"offsets {offset}-{end - 1}"
        chunk: LogChunk | None = None
        errors: list[str] = []
        for waited in _retrying(node, key or node, topic, what, retry_timeout, retry_backoff):
            if errors:
                warn(
                    f"nsqd {node} topic {topic}: {what}: retrying ({waited:.1f}s so far) - "
                    + "; ".join(errors)
                )
            errors = []
            for i, address in enumerate(candidates):
                last = i == len(candidates) - 1
                try:
                    got = read_log(
                        address,
                        topic,
                        offset,
                        opts,
                        max_messages=end - offset,
                        max_bytes=READ_BYTES,
                        partition=partition,
                    )
                except ConnectionError as e:
                    errors.append(str(e))
                    continue
                except NodeHTTPError as e:
                    if e.status < 500 and partition is None:
                        raise
                    errors.append(str(e))  # a copy that lost the partition: another has it
                    continue
                except LogOffsetOutOfRange as e:
                    if e.earliest <= offset or not last:
                        if not last:  # (pruned here: another copy may still have them)
                            errors.append(str(e))
                            continue
                        raise
                    if on_pruned is None:
                        raise
                    on_pruned(address, offset, min(e.earliest, end))
                    offset = e.earliest
                    break
                if partition is not None and got.next <= offset:
                    # This copy has not learnt yet that the range is committed: another may.
                    errors.append(f"nsqd {address} has committed less than offset {offset + 1}")
                    continue
                chunk = got
                if i:  # the copies that failed go last for the next chunks (a paused one
                    # would cost a timeout each time)
                    candidates = candidates[i:] + candidates[:i]
                break
            if chunk is not None or not errors:
                break
        if chunk is None:
            continue  # records skipped (pruned): from the new offset
        planned = partition is None and key and key != node  # on a storage id: check it
        if planned and chunk.storage_id and chunk.storage_id != key:
            raise LogIdentityError(
                f"nsqd {node} topic {topic}: the node there now has storage id "
                f"{chunk.storage_id}, the range was planned on {key}"
            )
        if chunk.first > offset:  # a gap the node skipped (records lost to damage, or pruned)
            warn(
                f"nsqd {node} topic {topic}: offsets {offset}-{min(chunk.first, end) - 1} are "
                "not in the log; skipped"
            )
        for r in chunk.records:
            if r.offset >= end:
                return
            yield r
        if chunk.next <= offset:
            return  # the node has nothing more (retention moved past, or caught up)
        offset = chunk.next
