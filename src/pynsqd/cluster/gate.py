"""Before a publish to a retained topic: may this node take it, and must its OK wait for a commit?

Theory of operation (``docs/replication.md``, "Joining" and "Take-back"). ``PublishGate.gate``
answers for every PUB, MPUB and DPUB (``server/protocol_v2.py``) and HTTP publish
(``http/api.py``) of a node with ``--etcd-endpoints``, from the cluster's state as the last read
found it: a topic that is not replicated goes through untouched (False); a replicated one's
OK waits for its records to commit (True; ``Replicator.wait``); its first publish also waits
for its partition's placement. A new retained topic under ``--replicas`` gets the flags'
settings written to etcd (create-only), so it is replicated from its first publish. While
another node serves this node's partition (this node came back and is taking it back), a
publish waits (``NotYetWritable``, then ``when_writable``): the plan's next read wakes it once
the partition is this node's again (``wake_writable``), or it fails after
``--replication-timeout`` naming what it waited for. A client sees a slow OK, as from a node
that commits slowly, never a refusal only a replicated node gives. (A first version of this
wait lost acknowledged deliveries in the replicated channels' kill test; the cause was an
adopter that skipped an origin killed right after its take-back, fixed in
``checkpoints.py``'s ``_adopt_after_take_back``.)
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from ..core.errors import NotYetWritable, PublishRefused
from ..core.topic import Topic
from ..log import LOGGER_NAME
from ..storage.topiclog import TopicLog
from .etcd import Compare, EtcdError, put_op
from .partition import Partition
from .settings import ReplicationSettings
from .view import ClusterView

__all__ = ["NotYetWritable", "PublishGate", "PublishRefused"]

log = logging.getLogger(LOGGER_NAME)

PartitionKey = tuple[str, int]


Waiter = tuple[Callable[[str | None], None], asyncio.TimerHandle]


class PublishGate:
    """The publish side of a replicated node: the gate, the waits for a take-back, and the
    flags' default settings for new topics."""

    def __init__(
        self,
        view: ClusterView,
        defaults: ReplicationSettings,
        *,
        retained: Callable[[str], TopicLog | None],
        track: Callable[[Topic], None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.view = view
        self.node_id = view.node_id
        self.defaults = defaults
        self._retained = retained
        self._track = track
        self._spawn = spawn
        #: Topics whose default settings (``--replicas``) are being written to etcd.
        self._writing_defaults: set[str] = set()
        #: ``--replication-timeout``: the longest a publish waits for a take-back.
        self.timeout = view.opts.replication_timeout
        #: Publishes waiting for this node's partition of a topic to be its own again.
        self._unwritable: dict[str, list[Waiter]] = {}
        #: When the first of a topic's waiting publishes came.
        self._since: dict[str, float] = {}

    def gate(self, topic: str) -> bool:
        """Before a publish to ``topic``: whether its OK must wait for the records to commit
        (``Replicator.committed``/``wait``). Raises ``PublishRefused`` when this node cannot
        take it; ``NotYetWritable`` when it must wait (another node serves its partition
        while it catches up to take it back: ``when_writable``)."""
        retained = self._retained(topic) is not None
        if not self.view.ready and retained:
            # Not reached from the network (nsqd takes no connection before it has joined);
            # a guard: a retained topic may be replicated, and an OK now would promise what
            # no replica holds.
            raise PublishRefused("this node has not joined the cluster yet", "NOT_JOINED")
        state = self.view.state
        settings = state.settings.get(topic)
        if settings is None and self.defaults.replicated and retained and topic in self.view.topics:
            # A new retained topic under --replicas: replicated from its first publish (its
            # settings go to etcd now; the publish waits for its partition's placement).
            settings = self.defaults
            self.write_defaults(topic)
        if settings is None or not settings.replicated:
            return False
        t = self.view.topics.get(topic)
        if t is not None and t.origin is None:
            self._track(t)  # before its first replicated publish takes IDs
        p = self.view.partitions.get((topic, self.node_id))
        if p is None:
            if (topic, self.node_id) in state.parts:
                # The partition lives on elsewhere (this node lost its disk, or the topic):
                # this log is about to be cut back to the leader's.
                raise PublishRefused(
                    f"this node's partition of {topic} is held elsewhere; it is copying it back",
                    "PARTITION_ELSEWHERE",
                )
            # The topic's first replicated publish: it waits for its partition's placement,
            # and nothing from here on is handed to channels before it commits.
            tlog = self._retained(topic)
            if tlog is not None:
                Partition.hold_unplaced(tlog)
        elif not p.writable:
            raise NotYetWritable(topic)
        return True

    def when_writable(self, topic: str, done: Callable[[str | None], None]) -> None:
        """After ``NotYetWritable``: ``done(None)`` once this node's partition of ``topic`` may
        take publishes again (it took it back; the publish goes through ``gate`` again), or
        ``done(reason)`` after ``--replication-timeout`` (or when nsqd stops)."""
        timeout = self.timeout

        def timed_out() -> None:
            waiters = self._unwritable.get(topic, [])
            if entry in waiters:
                waiters.remove(entry)
            if not waiters:
                self._unwritable.pop(topic, None)
                self._since.pop(topic, None)
            p = self.view.partitions.get((topic, self.node_id))
            leader = f"node {p.leader}" if p is not None and p.leader >= 0 else "another node"
            done(
                f"{leader} served this node's partition of {topic} for all of "
                f"--replication-timeout={timeout:g}s while this node caught up to take it back"
            )

        loop = asyncio.get_running_loop()
        handle = loop.call_later(timeout, timed_out)
        entry = (done, handle)
        waiters = self._unwritable.setdefault(topic, [])
        if not waiters:
            self._since[topic] = loop.time()
        waiters.append(entry)

    def wake_writable(self, why: str | None = None) -> None:
        """Publishes waiting for their partition whose partition can take them now (or all
        of them, with ``why``: nsqd stops), in the order they came."""
        for topic in list(self._unwritable):
            p = self.view.partitions.get((topic, self.node_id))
            if why is None and p is not None and not p.writable:
                continue
            waiters = self._unwritable.pop(topic)
            since = self._since.pop(topic, None)
            if why is None and since is not None:
                log.info(
                    "CLUSTER: partition %s/%d: %d publish(es) waited %.0f ms for the take-back",
                    topic,
                    self.node_id,
                    len(waiters),
                    (asyncio.get_running_loop().time() - since) * 1000,
                )
            for done, handle in waiters:
                handle.cancel()
                done(why)

    def write_defaults(self, topic: str) -> None:
        """``--replicas`` and the other flags' settings for a retained topic that has none in
        etcd, written once (create-only: a ``POST /topic/replication`` or another node's
        write wins); the next read of the cluster places its partitions."""
        if topic in self._writing_defaults:
            return
        self._writing_defaults.add(topic)

        async def write() -> None:
            key = self.view.member.keys.topic(topic)
            try:
                await self.view.member.etcd.txn(
                    [Compare(key, "CREATE", "EQUAL", 0)], [put_op(key, self.defaults.encode())]
                )
                log.info(
                    "CLUSTER: topic %s replicated with the flags' settings (replicas %d)",
                    topic,
                    self.defaults.replicas,
                )
            except EtcdError as err:
                log.warning("CLUSTER: topic %s: writing its settings failed - %s", topic, err)
            finally:
                self._writing_defaults.discard(topic)

        self._spawn(write())
