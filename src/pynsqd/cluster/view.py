"""The cluster as this node last read it: what the replicator's parts share.

Theory of operation. The replicator (``cluster/replicator.py``) owns one ``ClusterView`` and
is its only writer: it replaces ``state`` at each read of the cluster (``_refresh``), sets
``ready`` once it has joined, and adds and removes the partitions this node holds. Its parts
(``Leading``, ``Checkpoints``, ``PublishGate``) read it. Each of them was once given the same
references and lambdas one by one; now "which partitions, which members are live, has this
node joined" has this one home.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..core.topic import Topic
from ..options import Options
from .membership import Membership
from .partition import Member, Partition
from .records import ClusterState, PartKey

__all__ = ["ClusterView"]


class ClusterView:
    def __init__(self, member: Membership, topics: Mapping[str, Topic]) -> None:
        self.member = member
        self.topics = topics
        #: The partitions this node holds a copy of, by (topic, origin).
        self.partitions: dict[PartKey, Partition] = {}
        #: The cluster's keys as the last read found them (``Replicator._refresh``).
        self.state = ClusterState()
        #: The cluster has been read once: until then no retained topic is known
        #: unreplicated (``PublishGate.gate``).
        self.ready = False

    @property
    def node_id(self) -> int:
        return self.member.node_id

    @property
    def opts(self) -> Options:
        return self.member.opts

    def live(self, member: Member) -> bool:
        """A registered node with that storage (``ClusterState.live``)."""
        return self.state.live(member)

    def registered(self, node: int) -> bool:
        """Whether a node id is registered at all (whatever its storage)."""
        return node in self.state.nodes
