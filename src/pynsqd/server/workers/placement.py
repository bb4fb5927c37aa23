"""Where a topic is kept across the workers of a node (``--workers``): the one writer of
``Topic.kept_by``.

Theory of operation. A retained topic's log is one worker's, so that its offsets, rewinds,
dedup index and retention are those of one log, as with one process; a bounded topic (a bound on
it or on a channel) is one worker's too, so that its bound is the node's. That worker is the
topic's keeper (``keeper``: a hash of the name; on a replicated node worker 0, the cluster's
member, keeps them all: any retained topic may be replicated, its settings are in etcd, which
only worker 0 reads, and its partition is the node's one log of it). Every other worker sets
``kept_by`` to it and passes the topic's publishes there (``core/publish.Forward``). A plain
topic is every worker's own (``kept_by`` None). One process is a node of one worker
(``Placement()``): every topic is its own. No I/O: the caller says whether the topic retains.
"""

from __future__ import annotations

import zlib

from ...core.topic import Topic


class Placement:
    """Where this worker's topics are kept."""

    def __init__(self, index: int = 0, count: int = 1, *, clustered: bool = False) -> None:
        self.index = index
        self.count = count
        #: A replicated node (``--etcd-endpoints``): worker 0 is its member of the cluster.
        self.clustered = clustered

    def keeper(self, topic: str) -> int:
        """The worker that keeps ``topic`` when it retains a log or is bounded."""
        if self.clustered:
            return 0
        return zlib.crc32(topic.encode()) % self.count

    def elsewhere(self, topic: str) -> int | None:
        """``keeper`` when it is another worker (None: this one)."""
        keeper = self.keeper(topic)
        return None if keeper == self.index else keeper

    def place(self, topic: Topic, *, retained: bool) -> None:
        """Where ``topic`` lives now that it does (or does not) retain a log, by its bounds:
        with its keeper if it retains or is bounded, else here. Messages a worker held before
        stay there, delivered as before."""
        topic.kept_by = self.elsewhere(topic.name) if retained or topic.bounded else None
