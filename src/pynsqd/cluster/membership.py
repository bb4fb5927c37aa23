"""This node in the cluster: its lease, its registration, its storage id, and the key layout.

Theory of operation. At start the node takes a lease (``--etcd-lease-ttl``) and registers
``<K>/nodes/<node-id>`` under it with a create-only txn: a second node with the same id is refused
with one line. The previous incarnation of this node (same data directory and storage id) is
replaced at once: its lease is revoked, which also drops the leaderships it held, so a restart
fails over at once instead of after the TTL. A keepalive every TTL/3 refreshes the lease (in a task
of its own: a slow write never holds it up; counted from the last one sent, so a late answer
does not delay the next); when it cannot, the node stops committing
(``lease_alive`` is judged when it is used), and once etcd says the lease is gone it steps down
(``on_expired``), takes a new lease and registers again. Every ``BEAT`` the node re-writes its
registration (a txn guarded by its lease): the key's revision moves, and the others place new
copies only on nodes whose beat they saw lately (a killed node stays registered until its lease
lapses).

The keys and their records are declared in ``cluster/records.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable

from ..log import LOGGER_NAME
from ..options import Options
from ..storage.identity import storage_id
from .etcd import Compare, EtcdClient, EtcdError, put_op, range_op
from .records import ClusterSecret, Keys, Member, NodeRecord, RecordError

__all__ = ["BEAT", "Membership"]

log = logging.getLogger(LOGGER_NAME)

#: Seconds between two beats (re-writes of this node's registration).
BEAT = 0.5


class Membership:
    """The lease and registration of this node (``node_id``, ``storage``), and how the others
    reach it (``http``)."""

    def __init__(
        self,
        opts: Options,
        data_path: str,
        http_address: str,
        tcp_address: str,
        *,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        worker: int = 0,
    ) -> None:
        self.opts = opts
        #: Its worker's index on its node (``--workers``): registered, for placement.
        self.worker = worker
        self.node_id = opts.node_id
        self.keys = Keys(f"/pynsqd/{opts.cluster_name}")
        self.etcd = EtcdClient(opts.etcd_endpoints)
        self.ttl = int(opts.etcd_lease_ttl)
        self.now = now
        #: How the refresh and beat loops wait (a test's clock moves without real time).
        self.sleep = sleep
        self.data_path = data_path
        self.storage = storage_id(data_path)
        self.me: Member = (self.node_id, self.storage)
        self.http = _advertised(opts, http_address)
        self.tcp = tcp_address
        #: Copies of a partition go to distinct hosts first (``cluster/plan.py``).
        self.host_label = opts.host_label or socket.gethostname()
        self.lease = 0
        #: Until when the lease is known to live (monotonic): commits stop after it.
        self.lease_until = 0.0
        #: The cluster's secret (``ClusterSecret``): this node's replica fetches carry it.
        self.secret = ""

    @property
    def lease_alive(self) -> bool:
        """Whether the lease is known to live now (not as of the last keepalive: a process
        resumed after a pause longer than the TTL must not act on what waited in its sockets)."""
        return self.now() < self.lease_until

    def _info(self) -> bytes:
        return NodeRecord(
            self.node_id,
            self.storage,
            self.http,
            self.tcp,
            os.path.abspath(self.data_path),
            self.host_label,
            self.worker,
        ).encode()

    async def register(self) -> None:
        """Take a lease and register under it. Raises ``RuntimeError`` (a duplicate node id)
        or ``EtcdError``."""
        key = self.keys.node(self.node_id)
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
        other: NodeRecord | None = None
        if held is not None:
            try:
                other = NodeRecord.decode(held.value)
            except RecordError:
                other = NodeRecord(self.node_id, "", "")
        if held is not None and other is not None and self._previous_life(other):
            # This node's previous life (killed, perhaps with its disk): its lease goes now,
            # with its leaderships.
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
            f"(node at {other.http if other else '?'}, data path "
            f"{other.data_path if other else '?'}); "
            "every node needs its own --node-id"
        )

    def is_replica(self, secret: str) -> bool:
        """Whether a fetch stream's ``REPLICA_SECRET_HEADER`` is the cluster's secret (one of
        its nodes is fetching: no client auth applies)."""
        mine = self.secret
        return bool(mine) and hmac.compare_digest(secret.encode(), mine.encode())

    async def load_secret(self) -> None:
        """The cluster's secret: made by the first node that joins (a create-only txn: two
        first nodes agree on one), read by every other. Raises ``EtcdError``."""
        key = self.keys.secret()
        mine = ClusterSecret(secrets.token_hex(32))
        result = await self.etcd.txn(
            [Compare(key, "CREATE", "EQUAL", 0)], [put_op(key, mine.encode())], [range_op(key)]
        )
        if result.succeeded:
            self.secret = mine.token
            return
        held = result.ranges[0][0] if result.ranges and result.ranges[0] else None
        try:
            if held is None:
                raise RecordError("secret: missing")
            self.secret = ClusterSecret.decode(held.value).token
        except RecordError as err:
            raise EtcdError(f"the cluster's secret key {key} is unreadable - {err}") from None

    def _previous_life(self, other: NodeRecord) -> bool:
        """Whether a registration of this node id is this node's own, from before a restart:
        the same storage, or the same host and data path with a new storage (the disk was lost
        or replaced; two live processes on one host cannot share a data path: it is locked)."""
        if other.storage == self.storage:
            return True
        host = other.http.rpartition(":")[0]
        same_place = host == self.http.rpartition(":")[0] and other.data_path == os.path.abspath(
            self.data_path
        )
        if same_place:
            log.warning(
                "CLUSTER: node %d is back with a new data directory (storage %s, was %s): "
                "it joins as a new member and copies its partitions again",
                self.node_id,
                self.storage,
                other.storage,
            )
        return same_place

    async def beat(self) -> None:
        """Re-write the registration, while it is this lease's: its revision changes, and the
        others see this node alive (``Plan.placeable``). Raises ``EtcdError``."""
        key = self.keys.node(self.node_id)
        await self.etcd.txn(
            [Compare(key, "LEASE", "EQUAL", self.lease)], [put_op(key, self._info(), self.lease)]
        )

    async def keepalive_loop(self, on_expired: Callable[[], None]) -> None:
        """Refresh the lease every TTL/3 and beat every ``BEAT``, each in its own task: a beat
        is a write, which etcd answers after its fsync, and a slow disk there must not hold up
        the lease's refresh (which it answers without one). ``on_expired`` (step down) when
        etcd says the lease is gone, then register again."""
        beats = asyncio.create_task(self._beat_loop())
        try:
            await self._refresh_loop(on_expired)
        finally:
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats

    async def _beat_loop(self) -> None:
        while True:
            await self.sleep(min(BEAT, self.ttl / 3))
            if self.lease_alive:
                with contextlib.suppress(EtcdError):  # the keepalive says what is wrong
                    await self.beat()

    async def _refresh_loop(self, on_expired: Callable[[], None]) -> None:
        # Every TTL/3 from the last refresh *sent*, as etcd's own client keeps its stream: were
        # it TTL/3 after the answer, an answer late by a loaded etcd or node would push the next
        # refresh back by as much, and two such in a row outlast what the lease is known to live
        # (the send + TTL - 0.5 s). An answer later than TTL/3 sends the next one at once.
        sent = self.now()
        while True:
            await self.sleep(sent + self.ttl / 3 - self.now())
            sent = self.now()
            try:
                ttl = await self.etcd.keepalive(self.lease)
            except EtcdError as err:
                if not err.unreachable:  # an outage is said by the client, once
                    log.warning("CLUSTER: lease keepalive failed - %s", err)
                continue
            if ttl > 0:
                self.lease_until = sent + ttl - 0.5
                continue
            log.error("CLUSTER: lease %x expired; stepping down and registering again", self.lease)
            self.lease_until = 0.0
            on_expired()
            try:
                await self.register()
            except (EtcdError, RuntimeError) as err:
                log.error("CLUSTER: failed to register again - %s", err)

    async def leave(self) -> None:
        """Give up the lease (the leaderships under it go with it) and close the client."""
        if self.lease:
            try:
                await self.etcd.revoke(self.lease)
            except EtcdError as err:
                log.warning("CLUSTER: could not give up the lease - %s", err)
        await self.etcd.close()


def _advertised(opts: Options, http_address: str) -> str:
    """The HTTP address the other nodes fetch from."""
    port = opts.broadcast_http_port or int(http_address.rpartition(":")[2] or 0)
    host = http_address.rpartition(":")[0]
    if host in ("", "0.0.0.0", "[::]"):
        host = opts.broadcast_address
    return f"{host}:{port}"
