"""Where a topic is kept across the workers of a node (``--workers``): the one writer of
``Topic.kept_by``.

Theory of operation. A retained topic is every worker's: each worker appends the publishes
its connections take to its own log of it, a partition named by the worker's node id
(``--node-id`` + its index), so appends, fsyncs and reads of one topic run on every core;
offsets are per partition, and the node's HTTP answers name the partitions
(``AdminLinks.routed``). An identified publish (a producer id and sequence) is made by its
producer's home worker (``home``: a hash of the producer id), so a producer's sequence lives
in one partition and a retry that reconnects to another worker meets the same dedup index.

A bounded topic that keeps no log (a bound on it or on a channel) is one worker's, so that
its bound is the node's: that worker is the topic's keeper (``keeper``: a hash of the name).
On a replicated node (``--etcd-endpoints``) every worker is a member of the cluster with its
own node id, so a retained topic is a partition per worker there too, each replicated on its
own (``cluster/``). Every other worker sets ``kept_by`` to the
keeper and passes the topic's publishes there (``core/publish.Forward``). One process is a
node of one worker (``Placement()``): every topic is its own. No I/O: the caller says
whether the topic retains.
"""

from __future__ import annotations

import zlib

from ...core.topic import Topic


class Placement:
    """Where this worker's topics are kept."""

    def __init__(self, index: int = 0, count: int = 1, *, clustered: bool = False) -> None:
        self.index = index
        self.count = count
        #: A replicated node (``--etcd-endpoints``): each worker is a member of the cluster.
        self.clustered = clustered

    def keeper(self, topic: str) -> int:
        """The worker that keeps ``topic`` when it is bounded (and keeps no log)."""
        return zlib.crc32(topic.encode()) % self.count

    def elsewhere(self, topic: str) -> int | None:
        """``keeper`` when it is another worker (None: this one)."""
        keeper = self.keeper(topic)
        return None if keeper == self.index else keeper

    def home(self, producer: bytes) -> int | None:
        """The worker that makes ``producer``'s identified publishes when it is another one
        (None: this one)."""
        if self.count == 1:
            return None
        home = zlib.crc32(producer) % self.count
        return None if home == self.index else home

    def place(self, topic: Topic, *, retained: bool) -> None:
        """Where ``topic`` lives now that it does (or does not) retain a log, by its bounds:
        with its keeper if it is bounded and keeps no log, else here: a retained topic is a
        partition per worker, bounded or not (its backlog is its log's, which retention
        bounds; a bound on it holds in each partition). Messages a worker held before stay
        there, delivered as before."""
        kept = topic.bounded and not retained
        topic.kept_by = self.elsewhere(topic.name) if kept else None
