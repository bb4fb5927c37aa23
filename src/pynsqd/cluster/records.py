"""Every value pynsqd keeps in etcd, and where: the key layout and one record per value, each
with its encoding, declared once. No I/O.

Keys under ``<K> = /pynsqd/<cluster-name>``:

============================================  =====================  ==========================
key                                           record                 written by
============================================  =====================  ==========================
``nodes/<id>`` (under the node's lease)       ``NodeRecord``         the node (``membership``)
``topics/<topic>``                            ``ReplicationSettings``  ``POST /topic/replication``
``parts/<topic>/<origin>/assignment``         ``Assignment``         the origin, once
``parts/<topic>/<origin>/isr``                ``InSync``             the partition's leader
``parts/<topic>/<origin>/leader`` (lease)     ``Leadership``         the leader (its epoch is
                                                                     the key's mod_revision)
``parts/<topic>/<origin>/channels/<holder>``  ``ChannelCheckpoint``  the holder; an adopter
                                              or ``Tombstone``       writes the tombstone
``secret``                                    ``ClusterSecret``      the first node to join
============================================  =====================  ==========================

A value that does not decode raises ``RecordError`` (a ``ValueError``): ``ClusterState.parse``
logs and skips it, so one bad key never stops a node from reading the rest.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from .settings import ReplicationSettings, SettingsError

__all__ = [
    "Assignment",
    "ChannelCheckpoint",
    "ClusterSecret",
    "ClusterState",
    "InSync",
    "Keys",
    "Leadership",
    "Member",
    "NodeRecord",
    "PartKey",
    "PartRecords",
    "RecordError",
    "Stored",
    "Tombstone",
    "decode_checkpoint",
    "decode_settings",
]

#: An in-sync member: (node id, storage id). A node that comes back with an empty data
#: directory has a new storage id, so it is not taken for the member it was.
Member = tuple[int, str]
#: A partition: (topic, origin node id).
PartKey = tuple[str, int]

T = TypeVar("T")


class KeyValue(Protocol):
    """A key as etcd answers it (``cluster/etcd.py``'s ``KeyValue``)."""

    @property
    def key(self) -> str: ...
    @property
    def value(self) -> bytes: ...
    @property
    def mod_revision(self) -> int: ...
    @property
    def lease(self) -> int: ...


class RecordError(ValueError):
    """A value in etcd that is not the record its key declares."""


@dataclass(frozen=True)
class Keys:
    """The cluster's key layout in etcd."""

    prefix: str

    def node(self, node_id: int) -> str:
        return f"{self.prefix}/nodes/{node_id}"

    def topic(self, topic: str) -> str:
        return f"{self.prefix}/topics/{topic}"

    def part(self, topic: str, origin: int, what: str) -> str:
        """``what``: assignment, isr or leader."""
        return f"{self.prefix}/parts/{topic}/{origin}/{what}"

    def checkpoint(self, topic: str, origin: int, holder: int) -> str:
        return self.part(topic, origin, f"channels/{holder}")

    def secret(self) -> str:
        return f"{self.prefix}/secret"

    def moves_partitions(self, key: str, deleted: bool, version: int) -> bool:
        """Whether a change of ``key`` (seen by a watch) may change what a node does with a
        partition, so that the cluster is read again at once: a leader, an in-sync set or an
        assignment written or gone, a topic's settings, a node joining (version 1) or leaving
        (deleted). Not a beat (a node's key re-written), a channels' checkpoint or the secret:
        those change every few seconds and wait for the next tick."""
        if not key.startswith(self.prefix + "/"):
            return False
        kind, _, rest = key[len(self.prefix) + 1 :].partition("/")
        if kind == "parts":
            return rest.rsplit("/", 1)[-1] in ("leader", "isr", "assignment")
        if kind == "nodes":
            return deleted or version == 1
        return kind == "topics"


@dataclass(frozen=True)
class Stored(Generic[T]):
    """A decoded record with what etcd said of its key (the txn guards use the revision)."""

    key: str
    value: T
    mod_revision: int
    lease: int = 0


def _doc(raw: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise RecordError(f"{what}: not JSON ({err})") from None
    if not isinstance(doc, dict):
        raise RecordError(f"{what}: not a JSON object")
    return doc


def _encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


@dataclass(frozen=True)
class NodeRecord:
    """``nodes/<id>``: a live node, how the others reach it, and which data directory it has."""

    id: int
    storage: str
    http: str
    tcp: str = ""
    data_path: str = ""
    #: ``--host-label``: copies of a partition go to distinct hosts first ("": unknown).
    host: str = ""
    #: Its worker's index on its node (``--workers``; 0: one process): a partition's copies
    #: go to the same worker index of other nodes first (``plan.rendezvous``).
    worker: int = 0

    def encode(self) -> bytes:
        return _encode(
            {
                "id": self.id,
                "storage": self.storage,
                "http": self.http,
                "tcp": self.tcp,
                "data_path": self.data_path,
                "host": self.host,
                "worker": self.worker,
            }
        )

    @classmethod
    def decode(cls, raw: bytes) -> NodeRecord:
        doc = _doc(raw, "node")
        try:
            return cls(
                int(doc["id"]),
                str(doc.get("storage", "")),
                str(doc.get("http", "")),
                str(doc.get("tcp", "")),
                str(doc.get("data_path", "")),
                str(doc.get("host", "")),
                int(doc.get("worker", 0)),
            )
        except (KeyError, TypeError, ValueError) as err:
            raise RecordError(f"node: {err!r}") from None


@dataclass(frozen=True)
class Assignment:
    """``parts/<topic>/<origin>/assignment``: the nodes holding a copy, the origin first."""

    replicas: tuple[int, ...]

    def encode(self) -> bytes:
        return _encode({"replicas": list(self.replicas)})

    @classmethod
    def decode(cls, raw: bytes) -> Assignment:
        doc = _doc(raw, "assignment")
        try:
            return cls(tuple(int(n) for n in doc.get("replicas", [])))
        except (TypeError, ValueError) as err:
            raise RecordError(f"assignment: {err!r}") from None


@dataclass(frozen=True)
class InSync:
    """``parts/<topic>/<origin>/isr``: the in-sync set, as (node id, storage id) pairs."""

    members: tuple[Member, ...]

    def encode(self) -> bytes:
        return _encode({"isr": [list(m) for m in self.members]})

    @classmethod
    def decode(cls, raw: bytes) -> InSync:
        doc = _doc(raw, "isr")
        try:
            return cls(tuple((int(n), str(s)) for n, s in doc.get("isr", [])))
        except (TypeError, ValueError) as err:
            raise RecordError(f"isr: {err!r}") from None


@dataclass(frozen=True)
class Leadership:
    """``parts/<topic>/<origin>/leader``, under the leader's lease: who leads and where its
    followers fetch. The key's mod_revision is the leader's epoch."""

    node: int
    http: str

    def encode(self) -> bytes:
        return _encode({"node": self.node, "http": self.http})

    @classmethod
    def decode(cls, raw: bytes) -> Leadership:
        doc = _doc(raw, "leader")
        try:
            return cls(int(doc["node"]), str(doc.get("http", "")))
        except (KeyError, TypeError, ValueError) as err:
            raise RecordError(f"leader: {err!r}") from None


@dataclass(frozen=True)
class ChannelCheckpoint:
    """``parts/<topic>/<origin>/channels/<holder>``: the holder's channel windows of the
    partition (``DoneWindow.encode`` documents, by channel name); for the holder's own
    partition, its log's hand-off position; ``clean`` after a clean stop."""

    node: int
    storage: str
    clean: bool
    channels: dict[str, Any] = field(default_factory=dict)
    handed: int | None = None

    def encode(self) -> bytes:
        doc: dict[str, Any] = {
            "node": self.node,
            "storage": self.storage,
            "clean": self.clean,
            "channels": dict(sorted(self.channels.items())),
        }
        if self.handed is not None:
            doc["handed"] = self.handed
        return _encode(doc)


@dataclass(frozen=True)
class ClusterSecret:
    """``secret``: what a node's replica fetches carry to the leader (``X-Nsq-Replica-Secret``)
    in place of a client's auth secret, when nodes have ``--auth-http-address``. Whoever can
    read the cluster's keys in etcd is a member anyway."""

    token: str

    def encode(self) -> bytes:
        return _encode({"token": self.token})

    @classmethod
    def decode(cls, raw: bytes) -> ClusterSecret:
        token = _doc(raw, "secret").get("token")
        if not isinstance(token, str) or len(token) < 32:
            raise RecordError("secret: no token")
        return cls(token)


@dataclass(frozen=True)
class Tombstone:
    """In place of a holder's checkpoint: ``adopted_by`` took over its channels of the
    partition (``channels``: their names), and has everything below ``end``. The names are
    what a later adopter goes by when the origin took its partition back and died before it
    wrote a checkpoint of its own: that adopter may hold no window of the partition (None:
    a tombstone written before the names were kept)."""

    node: int
    adopted_by: int
    end: int
    channels: tuple[str, ...] | None = None

    def encode(self) -> bytes:
        doc: dict[str, Any] = {"node": self.node, "adopted_by": self.adopted_by, "end": self.end}
        if self.channels is not None:
            doc["channels"] = list(self.channels)
        return _encode(doc)


def decode_checkpoint(raw: bytes) -> ChannelCheckpoint | Tombstone:
    doc = _doc(raw, "checkpoint")
    try:
        if "adopted_by" in doc:
            names = doc.get("channels")
            if names is not None and (
                not isinstance(names, list) or not all(isinstance(n, str) for n in names)
            ):
                raise RecordError("checkpoint: channels of a tombstone is not a list of names")
            return Tombstone(
                int(doc.get("node", -1)),
                int(doc["adopted_by"]),
                int(doc.get("end", 0)),
                None if names is None else tuple(names),
            )
        channels = doc.get("channels", {})
        if not isinstance(channels, dict):
            raise RecordError("checkpoint: channels is not an object")
        handed = doc.get("handed")
        return ChannelCheckpoint(
            int(doc.get("node", -1)),
            str(doc.get("storage", "")),
            bool(doc.get("clean", False)),
            channels,
            handed if isinstance(handed, int) else None,
        )
    except (TypeError, ValueError) as err:
        if isinstance(err, RecordError):
            raise
        raise RecordError(f"checkpoint: {err!r}") from None


def decode_settings(raw: bytes) -> ReplicationSettings:
    """``topics/<topic>``: raises ``RecordError``."""
    try:
        return ReplicationSettings.decode(raw)
    except (SettingsError, ValueError) as err:
        raise RecordError(f"settings: {err}") from None


@dataclass
class PartRecords:
    """A partition's own keys, as one read found them (None: absent or unreadable)."""

    assignment: Stored[Assignment] | None = None
    isr: Stored[InSync] | None = None
    leader: Stored[Leadership] | None = None


@dataclass
class ClusterState:
    """One read of the cluster's keys, decoded."""

    nodes: dict[int, NodeRecord] = field(default_factory=dict)
    #: Each node's beat: its registration key's revision (re-written every beat).
    beats: dict[int, int] = field(default_factory=dict)
    settings: dict[str, ReplicationSettings] = field(default_factory=dict)
    parts: dict[PartKey, PartRecords] = field(default_factory=dict)
    #: Each holder's channel checkpoint (or the tombstone of its adoption), by partition.
    checkpoints: dict[PartKey, dict[int, Stored[ChannelCheckpoint | Tombstone]]] = field(
        default_factory=dict
    )
    #: Keys that did not decode: (key, mod_revision, why).
    unreadable: list[tuple[str, int, str]] = field(default_factory=list)

    def hosts(self) -> dict[int, str]:
        """Each live node's host label (``--host-label``)."""
        return {n: rec.host for n, rec in self.nodes.items()}

    def lanes(self) -> dict[int, int]:
        """Each live node's worker index on its node (``NodeRecord.worker``)."""
        return {n: rec.worker for n, rec in self.nodes.items()}

    @classmethod
    def parse(cls, keys: Keys, kvs: Iterable[KeyValue]) -> ClusterState:
        state = cls()
        for kv in kvs:
            parts = kv.key[len(keys.prefix) + 1 :].split("/")
            try:
                state._add(parts, kv)
            except ValueError as err:  # RecordError, or a key whose node id is not a number
                state.unreadable.append((kv.key, kv.mod_revision, str(err)))
        return state

    def _add(self, parts: list[str], kv: KeyValue) -> None:
        if parts[0] == "nodes" and len(parts) == 2:
            self.nodes[int(parts[1])] = NodeRecord.decode(kv.value)
            self.beats[int(parts[1])] = kv.mod_revision
        elif parts[0] == "topics" and len(parts) == 2:
            self.settings[parts[1]] = decode_settings(kv.value)
        elif parts[0] == "parts" and len(parts) == 4:
            rec = self.parts.setdefault((parts[1], int(parts[2])), PartRecords())
            if parts[3] == "assignment":
                rec.assignment = Stored(kv.key, Assignment.decode(kv.value), kv.mod_revision)
            elif parts[3] == "isr":
                rec.isr = Stored(kv.key, InSync.decode(kv.value), kv.mod_revision)
            elif parts[3] == "leader":
                rec.leader = Stored(kv.key, Leadership.decode(kv.value), kv.mod_revision, kv.lease)
        elif parts[0] == "parts" and len(parts) == 5 and parts[3] == "channels":
            part = (parts[1], int(parts[2]))
            value = decode_checkpoint(kv.value)
            self.checkpoints.setdefault(part, {})[int(parts[4])] = Stored(
                kv.key, value, kv.mod_revision
            )

    def live(self, member: Member) -> bool:
        """A registered node with that storage (a node back with an empty disk is not)."""
        info = self.nodes.get(member[0])
        return info is not None and info.storage == member[1]
