"""Replicated topics: this node's membership in the cluster, its partitions and their fetches.

Theory of operation (``docs/replication.md``; the rules themselves are ``cluster/partition.py``'s).

- **Membership.** At start the node takes a lease (``--etcd-lease-ttl``) and registers
  ``<K>/nodes/<node-id>`` under it with a create-only txn: a second node with the same id is
  refused with one line. The previous incarnation of this node (same data directory and storage
  id) is replaced at once: its lease is revoked, which also drops the leaderships it held, so a
  restart fails over at once instead of after the TTL. A keepalive every TTL/3 refreshes the lease;
  when it cannot, the node stops committing (``lease_alive``), and once etcd says the
  lease is gone it takes a new one and registers again.
- **The plan.** Every ``TICK`` seconds one range read of ``<K>/`` gives nodes, topics' settings
  and partitions; ``_reconcile`` brings each partition this node holds a copy of to what etcd
  says: leader (fsync, commit, in-sync set changes), follower (a fetch task at the leader's
  epoch), or candidate (a leaderless partition whose in-sync set holds this node: it campaigns
  after a delay by rank, the origin first).
- **The data path** is ``GET /topic/log`` with ``replica``/``epoch``/``last_epoch``: the
  leader's side is ``serve_fetch`` (checks the epoch, records the acknowledgement, long-polls
  at the end of the log), the follower's is ``_follow`` (checks every CRC, appends verbatim,
  fsyncs, asks again).
- **Publishing.** ``gate`` gives the protocol the origin partition of a replicated topic: a
  publish to a partition another node leads is refused; with ``acks=all`` its OK waits for the
  high watermark (``wait``), or ``E_PUB_FAILED`` after ``--replication-timeout``.

Keys under ``<K> = /pynsqd/<cluster-name>``: ``nodes/<id>`` (lease), ``topics/<topic>``
(settings), ``parts/<topic>/<origin>/{assignment,isr,leader}`` (leader: lease).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from ..core.topic import Topic
from ..internal.httpapi import HTTPError
from ..options import Options
from ..storage.atomic import write_atomic
from ..storage.durable import fsync_close
from ..storage.epochs import EpochHistory
from ..storage.topiclog import TopicLog
from .etcd import Compare, EtcdClient, EtcdError, KeyValue, delete_op, put_op, range_op
from .partition import Member, Partition, Role, Waiter
from .settings import ReplicationSettings, SettingsError

__all__ = ["PublishRefused", "ReplicaHost", "Replicator"]

log = logging.getLogger("pynsqd")

#: Seconds between two reads of the cluster's state in etcd.
TICK = 0.25
#: A leaderless partition's in-sync members campaign after rank times this (the origin first).
RANK_DELAY = 0.4
#: How long a follower's fetch waits at the end of the leader's log for new records (ms).
FETCH_WAIT_MS = 500
FETCH_MAX_BYTES = 4 << 20
#: The file naming this data directory's storage: a node back with an empty disk is new.
STORAGE_ID_FILE = "cluster.id"


class PublishRefused(Exception):
    """A publish this node cannot take for a replicated topic (the reason is the message)."""


class ReplicaHost(Protocol):
    """What replication needs of nsqd."""

    @property
    def opts(self) -> Options: ...
    @property
    def topics(self) -> Mapping[str, Topic]: ...
    @property
    def data_path(self) -> str: ...
    @property
    def http_address(self) -> str: ...
    @property
    def tcp_address(self) -> str: ...

    def topic_log(self, name: str) -> TopicLog | None: ...
    def open_replica_log(self, topic: str, origin: int) -> TopicLog: ...


@dataclass
class _State:
    """One read of the cluster's keys."""

    nodes: dict[int, dict[str, Any]] = field(default_factory=dict)
    settings: dict[str, ReplicationSettings] = field(default_factory=dict)
    parts: dict[tuple[str, int], dict[str, KeyValue]] = field(default_factory=dict)


def _storage_id(data_path: str) -> str:
    path = os.path.join(data_path, STORAGE_ID_FILE)
    try:
        with open(path) as f:
            value = f.read().strip()
        if value:
            return value
    except FileNotFoundError:
        pass
    value = secrets.token_hex(8)
    write_atomic(path, value.encode())
    return value


def _rendezvous(topic: str, origin: int, nodes: list[int], count: int) -> list[int]:
    """The origin, then the ``count - 1`` other live nodes with the highest hash for it."""

    def weight(n: int) -> bytes:
        return hashlib.sha256(f"{topic}/{origin}/{n}".encode()).digest()

    others = sorted((n for n in nodes if n != origin), key=weight, reverse=True)
    return [origin, *others[: count - 1]]


class Replicator:
    def __init__(self, host: ReplicaHost, *, now: Callable[[], float] = time.monotonic) -> None:
        self.host = host
        opts = host.opts
        self.opts = opts
        self.node_id = opts.node_id
        self.prefix = f"/pynsqd/{opts.cluster_name}"
        self.etcd = EtcdClient(opts.etcd_endpoints)
        self.ttl = int(opts.etcd_lease_ttl)
        self.now = now
        self.storage = _storage_id(host.data_path)
        self.me: Member = (self.node_id, self.storage)
        self.lease = 0
        #: Until when the lease is known to live (monotonic): commits stop after it.
        self.lease_until = 0.0
        self.state = _State()
        self.defaults = ReplicationSettings(
            opts.replicas,
            opts.replication_min_insync or opts.replicas // 2 + 1,
            opts.replication_acks,
            opts.replication_durability,
        )
        #: The partitions this node holds a copy of, by (topic, origin).
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._fetchers: dict[tuple[str, int], tuple[int, asyncio.Task[None]]] = {}
        self._syncing: set[tuple[str, int]] = set()
        self._sync_again: set[tuple[str, int]] = set()
        self._appended: dict[tuple[str, int], asyncio.Event] = {}
        self._leaderless_since: dict[tuple[str, int], float] = {}
        self._tasks: list[asyncio.Task[None]] = []
        #: Publishes to a replicated topic whose partition is not placed yet, by topic.
        self._pending: dict[str, list[Waiter]] = {}
        self._session: aiohttp.ClientSession | None = None
        self._closing = False
        #: The cluster's state has been read once: until then no retained topic is known
        #: unreplicated (``gate``).
        self.ready = False

    # -- lifecycle ------------------------------------------------------------------------

    def _info(self) -> bytes:
        return json.dumps(
            {
                "id": self.node_id,
                "storage": self.storage,
                "http": self._http(),
                "tcp": self.host.tcp_address,
                "data_path": os.path.abspath(self.host.data_path),
            }
        ).encode()

    def _http(self) -> str:
        opts = self.opts
        port = opts.broadcast_http_port or int(self.host.http_address.rpartition(":")[2] or 0)
        host = self.host.http_address.rpartition(":")[0]
        if host in ("", "0.0.0.0", "[::]"):
            host = opts.broadcast_address
        return f"{host}:{port}"

    async def start(self) -> None:
        """Join the cluster. Raises ``RuntimeError`` with the one line to show."""
        try:
            await self.etcd.wait_ready(10.0)
        except EtcdError as err:
            raise RuntimeError(f"--etcd-endpoints: {err}") from None
        await self._register()
        await self._refresh()
        self.ready = True
        self._tasks.append(asyncio.create_task(self._keepalive_loop()))
        self._tasks.append(asyncio.create_task(self._tick_loop()))
        log.info(
            "CLUSTER(%s): node %d joined (etcd %s, lease TTL %ds)",
            self.opts.cluster_name,
            self.node_id,
            ",".join(self.etcd.endpoints),
            self.ttl,
        )

    async def _register(self) -> None:
        key = f"{self.prefix}/nodes/{self.node_id}"
        self.lease = await self.etcd.grant(self.ttl)
        self.lease_until = self.now() + self.ttl - 0.5
        result = await self.etcd.txn(
            [Compare(key, "CREATE", "EQUAL", 0)],
            [put_op(key, self._info(), self.lease)],
            [range_op(key)],
        )
        if result.succeeded:
            return
        held = result.ranges[0][0] if result.ranges and result.ranges[0] else None
        other = json.loads(held.value) if held is not None else {}
        if held is not None and other.get("storage") == self.storage:
            # This node's previous life (killed): its lease goes now, with its leaderships.
            await self.etcd.revoke(held.lease)
            again = await self.etcd.txn(
                [Compare(key, "CREATE", "EQUAL", 0)], [put_op(key, self._info(), self.lease)]
            )
            if again.succeeded:
                log.info("CLUSTER: node %d replaced its previous registration", self.node_id)
                return
        await self.etcd.revoke(self.lease)
        raise RuntimeError(
            f"--node-id={self.node_id} is already in cluster {self.opts.cluster_name!r} "
            f"(node at {other.get('http', '?')}, data path {other.get('data_path', '?')}); "
            "every node needs its own --node-id"
        )

    async def stop(self) -> None:
        """Leave: fail waiting publishes, stop fetching, give up the lease (its leaderships
        go with it, so followers take over at once)."""
        self._closing = True
        for tasks in (self._tasks, [t for _, t in self._fetchers.values()]):
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t
        for p in self.partitions.values():
            p.fail_waiters("nsqd is exiting")
        if self.lease:
            with contextlib.suppress(EtcdError):
                await self.etcd.revoke(self.lease)
        await self.etcd.close()
        if self._session is not None:
            await self._session.close()

    async def _keepalive_loop(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            sent = self.now()
            try:
                ttl = await self.etcd.keepalive(self.lease)
            except EtcdError as err:
                log.warning("CLUSTER: lease keepalive failed - %s", err)
                continue
            if ttl > 0:
                self.lease_until = sent + ttl - 0.5
                continue
            log.error("CLUSTER: lease %x expired; stepping down and registering again", self.lease)
            self.lease_until = 0.0
            for p in self.partitions.values():
                if p.role is Role.LEADER:
                    p.step_down("the node's etcd lease expired")
            try:
                await self._register()
            except (EtcdError, RuntimeError) as err:
                log.error("CLUSTER: failed to register again - %s", err)

    @property
    def lease_alive(self) -> bool:
        """Whether the lease is known to live now (not as of the last keepalive: a process
        resumed after a pause longer than the TTL must not act on what waited in its sockets)."""
        return self.now() < self.lease_until

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK)
            try:
                await self._refresh()
            except EtcdError as err:
                log.warning("CLUSTER: failed to read the cluster's state - %s", err)
            except Exception:
                log.exception("CLUSTER: internal error")

    # -- the plan -------------------------------------------------------------------------

    async def _refresh(self) -> None:
        kvs, _ = await self.etcd.get_prefix(self.prefix + "/")
        state = _State()
        for kv in kvs:
            parts = kv.key[len(self.prefix) + 1 :].split("/")
            try:
                if parts[0] == "nodes" and len(parts) == 2:
                    state.nodes[int(parts[1])] = kv.json()
                elif parts[0] == "topics" and len(parts) == 2:
                    state.settings[parts[1]] = ReplicationSettings.decode(kv.value)
                elif parts[0] == "parts" and len(parts) == 4:
                    state.parts.setdefault((parts[1], int(parts[2])), {})[parts[3]] = kv
            except (ValueError, SettingsError) as err:
                log.error("CLUSTER: ignoring unreadable key %s - %s", kv.key, err)
        self.state = state
        for topic, settings in state.settings.items():
            if settings.replicated and (topic, self.node_id) not in state.parts:
                await self._create_own(topic, settings)
        for (topic, origin), keys in state.parts.items():
            await self._reconcile(topic, origin, keys)

    async def _create_own(self, topic: str, settings: ReplicationSettings) -> None:
        """This node's own partition of a replicated topic it retains: placed and led by it."""
        if topic not in self.host.topics or self.host.topic_log(topic) is None:
            return
        base = f"{self.prefix}/parts/{topic}/{self.node_id}"
        replicas = _rendezvous(topic, self.node_id, sorted(self.state.nodes), settings.replicas)
        if len(replicas) < settings.replicas:
            log.warning(
                "CLUSTER: topic %s wants %d replicas, %d nodes are live: placing on %s",
                topic,
                settings.replicas,
                len(self.state.nodes),
                replicas,
            )
        await self.etcd.txn(
            [Compare(f"{base}/assignment", "CREATE", "EQUAL", 0)],
            [
                put_op(f"{base}/assignment", json.dumps({"replicas": replicas}).encode()),
                put_op(f"{base}/isr", json.dumps({"isr": [list(self.me)]}).encode()),
            ],
        )

    def _partition(self, topic: str, origin: int, replicas: list[int]) -> Partition | None:
        key = (topic, origin)
        p = self.partitions.get(key)
        if p is not None:
            p.replicas = replicas
            p.settings = self.state.settings.get(topic, p.settings)
            return p
        if origin == self.node_id:
            tlog = self.host.topic_log(topic)
            if tlog is None:
                return None
        else:
            tlog = self.host.open_replica_log(topic, origin)
        p = Partition(
            topic,
            origin,
            self.me,
            tlog,
            EpochHistory(tlog.directory),
            self.state.settings.get(topic, self.defaults),
        )
        p.replicas = replicas
        p.waiters.extend(self._pending.pop(topic, []) if origin == self.node_id else [])
        self._appended[key] = asyncio.Event()
        tlog.on_append = lambda: self._on_append(key)
        if origin != self.node_id:
            tlog.committed = 0
        self.partitions[key] = p
        log.info("CLUSTER: partition %s: holding a copy (replicas %s)", p.name, replicas)
        return p

    async def _reconcile(self, topic: str, origin: int, keys: dict[str, KeyValue]) -> None:
        if "assignment" not in keys:
            return
        replicas = [int(n) for n in keys["assignment"].json().get("replicas", [])]
        if self.node_id not in replicas:
            return
        p = self._partition(topic, origin, replicas)
        if p is None:
            return
        isr_kv = keys.get("isr")
        if isr_kv is not None:
            p.isr = [(int(n), str(s)) for n, s in isr_kv.json().get("isr", [])]
            p.isr_revision = isr_kv.mod_revision
        key = (topic, origin)
        leader = keys.get("leader")
        if leader is None:
            if p.role is Role.LEADER:
                p.step_down("its leadership key is gone (lease lapsed)")
            self._stop_fetch(key)
            p.role, p.leader = Role.NONE, -1
            since = self._leaderless_since.setdefault(key, self.now())
            if self.me in p.isr:
                rank = 0 if p.is_origin else 1 + p.isr.index(self.me)
                if self.now() - since >= rank * RANK_DELAY:
                    await self._campaign(p)
            return
        self._leaderless_since.pop(key, None)
        info = leader.json()
        mine = int(info.get("node", -1)) == self.node_id
        if mine and leader.mod_revision == p.epoch and p.role is Role.LEADER:
            await self._lead(p)
            return
        if mine:
            # A leadership this node no longer serves (a registration since): give it up.
            with contextlib.suppress(EtcdError):
                await self.etcd.txn(
                    [Compare(leader.key, "MOD", "EQUAL", leader.mod_revision)],
                    [delete_op(leader.key)],
                )
            return
        if p.role is not Role.FOLLOWER or p.epoch != leader.mod_revision:
            log.info(
                "CLUSTER: partition %s: following node %s at epoch %d",
                p.name,
                info.get("node"),
                leader.mod_revision,
            )
            p.follow(int(info["node"]), str(info["http"]), leader.mod_revision)
        # Every tick: a fetch stopped by a take-back that failed, or one that died, starts again.
        self._start_fetch(p)
        if p.is_origin and self.me in p.isr and p.leader_latest == p.log.latest:
            await self._take_back(p, leader)

    async def _campaign(self, p: Partition) -> None:
        base = f"{self.prefix}/parts/{p.topic}/{p.origin}"
        if not self.lease_alive:
            return
        value = json.dumps({"node": self.node_id, "http": self._http()}).encode()
        result = await self.etcd.txn(
            [
                Compare(f"{base}/leader", "CREATE", "EQUAL", 0),
                Compare(f"{base}/isr", "MOD", "EQUAL", p.isr_revision),
            ],
            [put_op(f"{base}/leader", value, self.lease)],
        )
        if result.succeeded:
            self._became_leader(p, result.revision)

    async def _take_back(self, p: Partition, leader: KeyValue) -> None:
        """The origin, caught up and in sync with a takeover leader (which never appends),
        leads its partition again: offsets go on from the same end."""
        base = f"{self.prefix}/parts/{p.topic}/{p.origin}"
        value = json.dumps({"node": self.node_id, "http": self._http()}).encode()
        self._stop_fetch((p.topic, p.origin))
        result = await self.etcd.txn(
            [
                Compare(leader.key, "MOD", "EQUAL", leader.mod_revision),
                Compare(f"{base}/isr", "MOD", "EQUAL", p.isr_revision),
            ],
            [put_op(f"{base}/leader", value, self.lease)],
        )
        if result.succeeded:
            self._became_leader(p, result.revision)
        else:
            p.role = Role.NONE  # the next tick follows whoever leads now

    def _became_leader(self, p: Partition, epoch: int) -> None:
        p.become_leader(epoch, self.now())
        p.leader_http = self._http()
        log.info(
            "CLUSTER: partition %s: leader at epoch %d, offsets %d-%d, in sync %s",
            p.name,
            epoch,
            p.log.earliest,
            p.log.latest,
            [m[0] for m in p.isr],
        )
        self._kick_sync(p)
        self._advance(p)

    async def _lead(self, p: Partition) -> None:
        new = p.isr_change(self.now(), self.opts.replica_lag_max, self._live)
        if new is not None:
            base = f"{self.prefix}/parts/{p.topic}/{p.origin}"
            result = await self.etcd.txn(
                [Compare(f"{base}/leader", "MOD", "EQUAL", p.epoch)],
                [put_op(f"{base}/isr", json.dumps({"isr": [list(m) for m in new]}).encode())],
            )
            if not result.succeeded:
                p.step_down("superseded while changing the in-sync set")
                return
            log.info(
                "CLUSTER: partition %s: in sync %s -> %s",
                p.name,
                [m[0] for m in p.isr],
                [m[0] for m in new],
            )
            p.isr, p.isr_revision = new, result.revision
        self._kick_sync(p)
        self._advance(p)

    def _live(self, member: Member) -> bool:
        """A registered node with that storage (a node back with an empty disk is not)."""
        info = self.state.nodes.get(member[0])
        return info is not None and info.get("storage") == member[1]

    def _advance(self, p: Partition) -> None:
        p.lease_ok = self.lease_alive
        if not p.advance():
            return
        event = self._appended.get((p.topic, p.origin))
        if event is not None:
            event.set()  # the followers' waiting fetches answer with the new HW
        if p.is_origin:
            topic = self.host.topics.get(p.topic)
            if topic is not None and topic.log is p.log:
                topic.schedule_drain()

    # -- the leader's fsync (group commit) -------------------------------------------------

    def _on_append(self, key: tuple[str, int]) -> None:
        event = self._appended.get(key)
        if event is not None:
            event.set()
        p = self.partitions.get(key)
        if p is not None and p.role is Role.LEADER:
            self._kick_sync(p)
            if p.settings.durability == "pagecache":
                self._advance(p)

    def _kick_sync(self, p: Partition) -> None:
        key = (p.topic, p.origin)
        if p.settings.durability != "fsync" or p.log.synced >= p.log.latest:
            return
        if key in self._syncing:
            self._sync_again.add(key)
            return
        self._syncing.add(key)
        asyncio.get_running_loop().create_task(self._sync(p))

    async def _sync(self, p: Partition) -> None:
        key = (p.topic, p.origin)
        loop = asyncio.get_running_loop()
        try:
            while True:
                self._sync_again.discard(key)
                job = p.log.fsync_fd()
                if job is None:
                    break
                fd, end = job
                try:
                    await loop.run_in_executor(None, fsync_close, fd)
                except OSError as err:
                    log.error("CLUSTER: partition %s: fsync failed - %s", p.name, err)
                    break
                p.log.synced_to(end)
                if p.role is Role.LEADER:
                    self._advance(p)
                if key not in self._sync_again:
                    break
        finally:
            self._syncing.discard(key)

    # -- publishing -----------------------------------------------------------------------

    def gate(self, topic: str) -> bool:
        """Before a publish to ``topic``: whether its OK must wait for the records to commit
        (``committed``/``wait``). Raises ``PublishRefused`` when another node leads this node's
        partition (it is catching up before it takes it back)."""
        if not self.ready and self.host.topic_log(topic) is not None:
            # Joining (the listeners open before etcd is read): a retained topic may be
            # replicated, and an OK now would promise what no replica holds.
            raise PublishRefused("this node is still joining the cluster")
        settings = self.state.settings.get(topic)
        if settings is None or not settings.replicated:
            return False
        p = self.partitions.get((topic, self.node_id))
        if p is not None and not p.writable:
            raise PublishRefused(
                f"node {p.leader} serves this node's partition of {topic} while it catches up"
            )
        return True

    def committed(self, topic: str, end: int) -> bool:
        """Whether a publish ending at ``end`` may be answered now."""
        p = self.partitions.get((topic, self.node_id))
        if p is None:
            return False
        return p.hw >= end or (p.settings.acks == "leader" and p.role is Role.LEADER)

    def wait(self, topic: str, end: int, done: Callable[[str | None], None]) -> None:
        """Call ``done(None)`` once offsets below ``end`` are committed, ``done(reason)`` when
        they could not be in ``--replication-timeout`` (they may still be)."""
        p = self.partitions.get((topic, self.node_id))
        # Waiting for the partition to be placed (its first publish), else for the HW.
        queue = p.waiters if p is not None else self._pending.setdefault(topic, [])
        settled = False

        def settle(why: str | None) -> None:
            nonlocal settled
            if not settled:
                settled = True
                handle.cancel()
                done(why)

        def timed_out() -> None:
            part = self.partitions.get((topic, self.node_id))
            for q in (queue, part.waiters if part is not None else []):
                if waiter in q:
                    q.remove(waiter)
            hw = part.hw if part is not None else 0
            settle(f"replication timeout (committed below {hw}, this publish ends at {end})")

        handle = asyncio.get_running_loop().call_later(self.opts.replication_timeout, timed_out)
        waiter = Waiter(end, settle)
        queue.append(waiter)

    # -- the leader's side of a fetch -------------------------------------------------------

    async def serve_fetch(
        self, topic: str, origin: int, params: Callable[[str], str | None]
    ) -> tuple[TopicLog, dict[str, str]]:
        """A follower's ``GET /topic/log``: checks its epoch, records its acknowledgement,
        waits up to ``wait_ms`` at the end of the log. Raises ``HTTPError``."""
        p = self.partitions.get((topic, origin))
        if p is None or p.role is not Role.LEADER:
            raise HTTPError(409, "NOT_LEADER", {"epoch": p.epoch if p else 0})
        try:
            replica = int(params("replica") or "")
            epoch = int(params("epoch") or "")
            offset = int(params("offset") or "")
            last_epoch = int(params("last_epoch") or "0")
            wait_ms = min(int(params("wait_ms") or "0"), 5000)
        except ValueError:
            raise HTTPError(400, "INVALID_ARG_REPLICA") from None
        storage = params("storage") or ""
        if epoch != p.epoch:
            if epoch > p.epoch:
                p.step_down(f"a follower knows a later epoch ({epoch})")
            raise HTTPError(409, "EPOCH_MISMATCH", {"epoch": p.epoch})
        end = p.end_for(last_epoch)
        if offset > end:
            raise HTTPError(409, "TRUNCATE", {"truncate_to": end, "epoch": p.epoch})
        if offset < p.log.earliest:
            # Retention here removed what the follower needs next: it starts again from here.
            raise HTTPError(409, "RESET", {"start": p.log.earliest, "epoch": p.epoch})
        member = (replica, storage)
        p.fetched(member, offset, self.now())
        self._advance(p)
        if offset >= p.log.latest and wait_ms:
            event = self._appended[(topic, origin)]
            event.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_ms / 1000):
                    await event.wait()
        headers = {
            "X-Nsq-High-Watermark": str(p.hw),
            "X-Nsq-Epoch": str(p.epoch),
            "X-Nsq-Epochs": json.dumps(p.history.entries),
        }
        return p.log, headers

    def read_log(self, topic: str, origin: int) -> TopicLog | None:
        """A partition's log for plain readers (``partition=`` on ``/topic/log``)."""
        p = self.partitions.get((topic, origin))
        return p.log if p is not None else None

    # -- the follower's side --------------------------------------------------------------

    def _start_fetch(self, p: Partition) -> None:
        key = (p.topic, p.origin)
        running = self._fetchers.get(key)
        if running is not None and running[0] == p.epoch and not running[1].done():
            return
        self._stop_fetch(key)
        self._fetchers[key] = (p.epoch, asyncio.create_task(self._follow_logged(p, p.epoch)))

    async def _follow_logged(self, p: Partition, epoch: int) -> None:
        try:
            await self._follow(p, epoch)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # logged; the next tick starts the fetch again
            log.error("CLUSTER: partition %s: fetching stopped - %s", p.name, err)

    def _stop_fetch(self, key: tuple[str, int]) -> None:
        running = self._fetchers.pop(key, None)
        if running is not None:
            running[1].cancel()

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=FETCH_WAIT_MS / 1000 + 5)
            )
        return self._session

    async def _follow(self, p: Partition, epoch: int) -> None:
        """Fetch from the leader of ``epoch`` until it is no longer the leader."""
        tlog = p.log
        loop = asyncio.get_running_loop()
        failures = 0
        while p.role is Role.FOLLOWER and p.epoch == epoch and not self._closing:
            query = {
                "topic": p.topic,
                "partition": str(p.origin),
                "offset": str(tlog.latest),
                "replica": str(self.node_id),
                "storage": self.storage,
                "epoch": str(epoch),
                "last_epoch": str(p.history.last_epoch),
                "wait_ms": str(FETCH_WAIT_MS),
                "max_bytes": str(FETCH_MAX_BYTES),
            }
            try:
                async with self._get_session().get(
                    f"http://{p.leader_http}/topic/log", params=query
                ) as resp:
                    body = await resp.read()
                    headers = resp.headers
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning(
                        "CLUSTER: partition %s: fetch from %s failed - %s",
                        p.name,
                        p.leader_http,
                        err,
                    )
                await asyncio.sleep(min(0.05 * failures, 0.5))
                continue
            failures = 0
            if status == 409:
                doc = json.loads(body or b"{}")
                if doc.get("message") == "TRUNCATE":
                    to = int(doc["truncate_to"])
                    tlog.truncate(to)
                    p.history.truncate(to)
                    continue
                if doc.get("message") == "RESET":
                    start = int(doc["start"])
                    log.warning(
                        "CLUSTER: partition %s: %s no longer has offset %d; copying from %d",
                        p.name,
                        p.leader_http,
                        tlog.latest,
                        start,
                    )
                    tlog.restart_at(start)
                    p.history.truncate(-1)
                    continue
                await asyncio.sleep(TICK)  # not (or no longer) the leader: the plan decides
                continue
            if status != 200:
                log.warning(
                    "CLUSTER: partition %s: fetch answered %d %s", p.name, status, body[:200]
                )
                await asyncio.sleep(0.5)
                continue
            if p.role is not Role.FOLLOWER or p.epoch != epoch:
                return
            try:
                if body:
                    tlog.append_raw(body)
                entries = [(int(e), int(s)) for e, s in json.loads(headers["X-Nsq-Epochs"])]
                p.history.copy_from(entries, tlog.latest)
            except ValueError as err:
                log.error(
                    "CLUSTER: partition %s: records from %s refused - %s",
                    p.name,
                    p.leader_http,
                    err,
                )
                await asyncio.sleep(0.5)
                continue
            if p.settings.durability == "fsync":
                job = tlog.fsync_fd()
                if job is not None:
                    await loop.run_in_executor(None, fsync_close, job[0])
                    tlog.synced_to(job[1])
            p.leader_latest = int(headers.get("X-Nsq-Latest", "-1"))
            p.hw = max(p.hw, min(int(headers.get("X-Nsq-High-Watermark", "0")), tlog.latest))
            tlog.committed = p.hw
            tlog.handed = tlog.latest

    # -- settings and state ---------------------------------------------------------------

    async def set_settings(
        self, topic: str, get: Callable[[str], str | None]
    ) -> ReplicationSettings:
        """``POST /topic/replication``: kept in etcd for every node. Raises SettingsError or
        EtcdError."""
        base = self.state.settings.get(topic, self.defaults)
        settings = ReplicationSettings.parse(get, base)
        await self.etcd.put(f"{self.prefix}/topics/{topic}", settings.encode())
        await self._refresh()
        return settings

    def settings_for(self, topic: str) -> ReplicationSettings | None:
        return self.state.settings.get(topic)

    def describe(self, topic: str) -> list[dict[str, Any]]:
        """For ``/stats`` and ``/topic/config``: every partition of ``topic`` this node holds."""
        out = []
        for (name, origin), p in sorted(self.partitions.items()):
            if name != topic:
                continue
            lags = {
                str(m[0]): max(p.log.latest - a, 0)
                for m, a in p.acks.items()
                if p.role is Role.LEADER
            }
            out.append(
                {
                    "partition": origin,
                    "role": p.role.value,
                    "leader": p.leader,
                    "epoch": p.epoch,
                    "isr": [m[0] for m in p.isr],
                    "replicas": p.replicas,
                    "committed": p.hw,
                    "latest": p.log.latest,
                    "follower_lag": lags,
                }
            )
        return out
