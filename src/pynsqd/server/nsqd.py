"""The nsqd root object: options, topics, clients, listeners and the process lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import socket
import ssl
import time
from typing import TYPE_CHECKING, Any

from .. import NSQD_VERSION, __version__
from ..core.backend import BackendQueue, DummyBackend
from ..core.channel import Channel
from ..core.e2e import E2ELatency
from ..core.errors import QueueFull
from ..core.message import ENCODED_OVERHEAD, Message
from ..core.topic import Topic
from ..http.server import HTTPService
from ..internal import process
from ..internal.listener import SharedListener, format_address
from ..internal.names import is_ephemeral
from ..options import Options, node_id_for_storage
from ..protocol.identify import ProtocolConfig
from ..storage.atomic import remove_leftovers
from ..storage.diskqueue import DiskQueue
from ..storage.identity import storage_id
from ..storage.message_backend import DiskBackend
from ..storage.metadata import (
    DirLock,
    check_writable,
)
from ..storage.settings import SettingsStore
from . import tracing
from .auth import AuthClient, LogReadAuth
from .busypoll import BusyPoll
from .lifecycle import Lifecycles
from .lookup import Lookup
from .metadata import NodeMetadata
from .retention import Retention
from .tls import server_context
from .workers.lone import LoneProcess
from .workers.peers import Workers
from .workers.spec import WorkerSpec

if TYPE_CHECKING:
    from ..cluster.replicator import Replicator
    from .protocol_v2 import ClientV2

log = logging.getLogger("pynsqd")


def protocol_config(opts: Options) -> ProtocolConfig:
    """The protocol limits from the options, in the parser's units.

    Derived from the options table: a ``ProtocolConfig`` field ``x_ms`` is the duration option
    ``x`` in milliseconds, a field ``x`` the option ``x`` itself; what is not an option
    (``heartbeat_interval_ms``, ``output_buffer_size``, ``max_line_length``: nsqd's constants)
    keeps its default, and ``tls_required`` is the one value with a meaning of its own.
    """
    values: dict[str, Any] = {}
    for f in dataclasses.fields(ProtocolConfig):
        if f.name == "tls_required":
            values[f.name] = opts.tls_required != "false"
        elif f.name.endswith("_ms") and hasattr(opts, f.name[:-3]):
            values[f.name] = round(getattr(opts, f.name[:-3]) * 1000)
        elif hasattr(opts, f.name):
            values[f.name] = getattr(opts, f.name)
    return ProtocolConfig(**values)


class NSQD:
    def __init__(
        self,
        opts: Options,
        loop: asyncio.AbstractEventLoop | None = None,
        worker: WorkerSpec | None = None,
    ) -> None:
        self.opts = opts
        self.loop = loop or asyncio.get_running_loop()
        self.protocol_config = protocol_config(opts)
        self._tracing: tracing.Tracing | None = None
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, ClientV2] = {}
        self.start_time = int(time.time())
        self.exiting = False
        #: Why the node is not ready yet (``GET /ping``: ``NOK - starting (...)``); None once
        #: it serves on every worker and nsqlookupd lists it.
        self.starting: str | None = "opening its data"
        self.health_error: str | None = None
        self.tcp_server: asyncio.Server | SharedListener | None = None
        self.tcp_address = ""
        self.http: HTTPService | None = None
        self._link_server: asyncio.Server | SharedListener | None = None
        self.http_address = ""
        self._client_seq = 0
        self.data_path = opts.data_path or os.getcwd()
        #: The data directory's identity (``storage/identity.py``), read by start(); and this
        #: process's: two processes answering with one storage id share a copied directory.
        self.storage_id = ""
        self.instance = secrets.token_hex(8)
        self._disk_backends: dict[str, DiskBackend] = {}
        #: The other workers of ``--workers N`` (``server/workers/peers.py``); in a single
        #: process, none (``server/workers/lone.py``).
        self.workers: Workers | LoneProcess = (
            Workers(self, worker) if worker is not None else LoneProcess(self)
        )
        self.retention = Retention(
            opts,
            self.data_path,
            on_write=self._backend_written,
            on_error=self.set_health_error,
            exiting=lambda: self.exiting,
            placement=self.workers.placement,
        )
        #: Per-topic/channel lifecycle settings (pynsqd.settings.json); loaded by start().
        self.settings = SettingsStore(self.data_path, opts)
        #: Topics' and channels' lifecycle settings applied, and dead-lettering.
        self.lifecycle = Lifecycles(self.settings, self.get_topic, lambda: self.exiting)
        self._sync_timer: asyncio.TimerHandle | None = None
        self._dir_lock = DirLock(self.data_path)
        self.tls_context: ssl.SSLContext | None = None  # set by start(): --tls-cert/--tls-key
        self.busy_poll = BusyPoll(self.loop, self.opts.busy_poll)
        self.https_address = ""
        self.auth = AuthClient(opts) if opts.auth_http_addresses else None
        self.log_auth = LogReadAuth(self.auth) if self.auth is not None else None
        #: nsqd.dat: the topics and channels, and their paused flags.
        self.metadata = NodeMetadata(self.data_path, self.topics, lambda: self.exiting, self.loop)
        self.lookup = Lookup(self)
        #: Replicated topics (``cluster/``): None without --etcd-endpoints (no cost).
        self.replication: Replicator | None = None
        #: This process is a member of the cluster (``--etcd-endpoints``): a single process,
        #: or each worker of ``--workers N``, with its own node id (``--node-id`` + its
        #: index), its partitions, lease and checkpoints (``docs/replication.md``).
        self.cluster_member = bool(opts.etcd_endpoints)
        self.worker_index = self.workers.placement.index  # its index among them (0: one)
        #: Until the cluster's state is read, channels do not deliver and logs do not hand off
        #: (a replicated channel is restored from its checkpoint first).
        self._joining = self.cluster_member
        if worker is not None and worker.started:
            self.start_time = worker.started  # the node's, not this worker's (restarts)

    # -- topics and channels --------------------------------------------------------------

    @property
    def node_storage_id(self) -> str:
        """/info's ``storage_id``: the node's (``--workers``: one for every worker)."""
        return self.workers.storage_id(self.storage_id)

    def get_topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            topic = Topic(
                name,
                self,
                self.loop,
                node_id=self.opts.node_id,
                mem_queue_size=self.opts.mem_queue_size,
                backend=self._backend(name),
                ephemeral=is_ephemeral(name),
            )
            self.topics[name] = topic
            log.info("TOPIC(%s): created", name)
            if not topic.ephemeral:
                self.retention.attach(topic)
            self.lifecycle.apply_topic(topic)
            if self._joining and topic.log is not None:
                topic.hand_off.hold()
            self.lookup.topic_created(topic)
            if not self.metadata.loading:
                self.lookup.fetch_channels(topic)  # async: publishing is not held up
                self.workers.topic_created(name)
            if not topic.ephemeral:
                self.metadata.persist_soon()
        return topic

    def get_existing_topic(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def delete_existing_topic(self, name: str) -> bool:
        topic = self.topics.pop(name, None)
        if topic is None:
            return False
        log.info("TOPIC(%s): deleting", name)
        self.lookup.topic_deleted(topic)
        for ch in list(topic.channels.values()):
            self.workers.detach(ch)
        topic.close(delete=True)
        self._disk_backends.pop(name, None)
        self.retention.forget(name)
        if self.replication is not None:
            self.replication.topic_deleted(name)
        if not topic.ephemeral:
            self.metadata.persist()
        return True

    def make_channel(self, topic: Topic, name: str) -> Channel:
        # --mem-queue-size=0: every message is on disk until it is done with, in flight too.
        backend = self._backend(
            f"{topic.name}:{name}", keep_in_flight=self.opts.mem_queue_size == 0
        )
        ch = Channel(
            topic,
            name,
            self.loop,
            mem_queue_size=self.opts.mem_queue_size,
            backend=backend,
            max_msg_timeout=self.opts.max_msg_timeout,
            max_consumers=self.opts.max_channel_consumers,
            ephemeral=is_ephemeral(name),
            keeper=backend.journal if isinstance(backend, DiskBackend) else None,
        )
        log.info("TOPIC(%s): new channel(%s)", topic.name, name)
        self.lookup.channel_created(topic, name)
        if self.opts.e2e_processing_latency_percentiles:
            ch.e2e_sink = E2ELatency(
                self.opts.e2e_processing_latency_percentiles,
                self.opts.e2e_processing_latency_window_time,
            )
        self.lifecycle.apply_channel(topic.name, ch)
        ch.held = self._joining
        self.workers.attach(ch)
        if not self.metadata.loading:
            self.workers.channel_created(topic.name, name)
        if not ch.ephemeral:
            self.metadata.persist_soon()  # once the topic has added it
        return ch

    def channel_deleted(self, topic: Topic, channel: Channel) -> None:
        self.workers.detach(channel)
        self._disk_backends.pop(f"{topic.name}:{channel.name}", None)
        log.info("TOPIC(%s): deleted channel(%s)", topic.name, channel.name)
        self.lookup.channel_deleted(topic, channel.name)
        if not channel.ephemeral and not topic.exiting:
            self.metadata.persist()

    def topic_emptied_of_channels(self, topic: Topic) -> None:
        # An #ephemeral topic goes with its last channel.
        if self.topics.get(topic.name) is topic:
            self.delete_existing_topic(topic.name)

    def _backend(self, name: str, *, keep_in_flight: bool = False) -> BackendQueue:
        if is_ephemeral(name):
            return DummyBackend()
        opts = self.opts
        backend = DiskBackend(
            DiskQueue(
                name,
                self.data_path,
                max_bytes_per_file=opts.max_bytes_per_file,
                min_msg_size=ENCODED_OVERHEAD,
                # (a message with headers stores its block before its body)
                max_msg_size=opts.max_msg_size + ENCODED_OVERHEAD + 2 + opts.max_header_bytes,
                sync_every=opts.sync_every,
                sync_timeout=opts.sync_timeout,
                logger=log,
                background_sync=True,
            ),
            keep_in_flight=keep_in_flight,
        )
        backend.on_write = self._backend_written
        self._disk_backends[name] = backend
        return backend

    def _backend_written(self, err: OSError | None) -> None:
        # As nsqd: a failed disk write makes /ping unhealthy, the next good one heals it.
        if err is not None or self.health_error is not None:
            self.set_health_error(err)

    # -- message lifecycle (server/lifecycle.py) ------------------------------------------

    def dead_letter(
        self, topic: Topic, channel: Channel, msgs: list[Message]
    ) -> OSError | QueueFull | None:
        """The topic's hook for a channel's messages that used up their attempts."""
        return self.lifecycle.dead_letter(topic, channel, msgs)

    # -- replayable topics: the retained log (server/retention.py) ------------------------

    async def authorize_log_read(
        self, topic: str, secret: str, remote_ip: str, tls: bool
    ) -> str | None:
        """With ``--auth-http-address``, reading a log needs a secret the auth server grants
        ``subscribe`` on the topic: None if allowed, else the error token."""
        if self.log_auth is None:
            return None
        return await self.log_auth.authorize(topic, secret, remote_ip, tls)

    def serve_topic(self, name: str) -> Topic:
        return self.get_topic(name)

    def joined(self) -> None:
        """The cluster's state is read (and replicated channels restored): deliver."""
        self._joining = False
        for topic in list(self.topics.values()):
            for ch in topic.channels.values():
                if ch.held:
                    ch.held = False
                    ch.schedule_pump()
            topic.hand_off.release()

    def _sync_disk_queues(self) -> None:
        # go-diskqueue's syncTicker: every --sync-timeout, sync the queues that changed.
        now = self.loop.time()
        for name, backend in list(self._disk_backends.items()):
            try:
                backend.sync_if_due(now)
            except OSError as err:
                log.error("DISKQUEUE(%s): failed to sync - %s", name, err)
                self.set_health_error(err)
            bg_err = backend.take_sync_error()  # a background sync failed (already logged)
            if bg_err is not None:
                self.set_health_error(bg_err)
        # The logs after the channels' queues: a saved hand-off position follows what the
        # channels stored.
        self.retention.sync(self.topics)
        self._sync_timer = self.loop.call_later(self.opts.sync_timeout, self._sync_disk_queues)

    def _remove_leftovers(self) -> None:
        """Temporary files of atomic writes that a crash cut short, here and in the logs."""
        dirs = [self.data_path] + [
            os.path.join(self.data_path, e)
            for e in os.listdir(self.data_path)
            if e.endswith(".log") and os.path.isdir(os.path.join(self.data_path, e))
        ]
        for path in (p for d in dirs for p in remove_leftovers(d)):
            log.info("NSQ: removed %s, left by a write a crash cut short", path)

    # -- metadata (nsqd.dat: server/metadata.py) -------------------------------------------

    def metadata_changed(self) -> None:
        """A topic or channel was paused or unpaused (also the hook for the HTTP API)."""
        self.metadata.persist()

    # -- clients --------------------------------------------------------------------------

    def next_client_id(self) -> int:
        self._client_seq += 1
        return self._client_seq

    def add_client(self, client: ClientV2) -> None:
        self.clients[client.id] = client
        if not client.is_link:
            self.workers.client_count(1)

    def remove_client(self, client: ClientV2) -> None:
        gone = self.clients.pop(client.id, None) is not None
        if gone and not client.is_link:
            self.workers.client_count(-1)

    def set_health_error(self, err: BaseException | None) -> None:
        self.health_error = None if err is None else str(err)

    # -- nsqlookupd -----------------------------------------------------------------------

    def set_lookupd_addresses(self, addresses: list[str]) -> None:
        """Register with exactly these lookupds from now on (``PUT /config/...``)."""
        self.opts.lookupd_tcp_addresses = list(addresses)
        if not self.workers.is_lead:
            return  # worker 0 registers the node
        if not self.exiting and self.tcp_address:
            self.lookup.set_addresses(self.opts.lookupd_tcp_addresses)

    def lookupd_addresses_changed(self) -> None:
        """``opts.lookupd_tcp_addresses`` was set (the HTTP API's hook)."""
        self.set_lookupd_addresses(self.opts.lookupd_tcp_addresses)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        from .protocol_v2 import ClientV2
        from .workers.link import WorkerLink

        log.info("nsqd v%s (built w/pynsqd-%s)", NSQD_VERSION, __version__)
        self.tls_context = server_context(self.opts)  # raises TLSConfigError
        self._dir_lock.lock()  # raises DirLockError
        try:
            check_writable(self.data_path)  # raises DirLockError
            self.storage_id = storage_id(self.data_path)
            if self.opts.etcd_endpoints and self.opts.node_id_is_default:
                # Nodes sharing a host share a hostname: a replicated node's default id is
                # its data directory's.
                self.opts.node_id = node_id_for_storage(self.storage_id)
                log.info("ID: %d (from the data directory; --node-id sets it)", self.opts.node_id)
            else:
                log.info("ID: %d", self.opts.node_id)
            # --otel-*: messages with a traceparent header traced (raises RuntimeError)
            self._tracing = tracing.start(self.opts, self.opts.node_id)
            self._remove_leftovers()
            self.lifecycle.load()
            self.metadata.load(self.get_topic, self.retention.found)
            self.metadata.persist()
            self.retention.rewinds.resume(self.retention.logs, self.topics)
            # A replicated node binds its sockets (their addresses go into its cluster record)
            # but takes no connection until it has joined: a publish can never be answered
            # before the node knows whether its partition is still its own.
            serve = not self.cluster_member
            # --workers: a worker of a replicated node takes its peers' links once joined.
            self._link_server = await self.workers.listen(
                "link", lambda: WorkerLink(self), "", serve=serve
            )
            self.tcp_server = await self.workers.listen(
                "tcp", lambda: ClientV2(self), self.opts.tcp_address, serve=serve
            )
            assert self.tcp_server is not None
        except BaseException:
            for topic in list(self.topics.values()):
                with contextlib.suppress(OSError):
                    topic.close(delete=False)
            self._dir_lock.unlock()
            tracing.stop(self._tracing)
            raise
        sock = self.tcp_server.sockets[0]
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.tcp_address = format_address(sock)
        if serve:
            log.info("TCP: listening on %s", self.tcp_address)
        self.http = HTTPService(self)
        try:
            await self.http.start(serve=serve)  # HTTP API and statsd
        except BaseException:
            await self._stop_after_failed_start()
            raise
        self.http_address = self.http.address
        if self.tls_context is not None and self.opts.https_address:
            try:
                await self.http.start_https(self.opts.https_address, self.tls_context, serve=serve)
            except BaseException:
                await self._stop_after_failed_start()
                raise
            self.https_address = self.http.https_address
        self._sync_timer = self.loop.call_later(self.opts.sync_timeout, self._sync_disk_queues)
        if self.cluster_member:
            from ..cluster.replicator import Replicator  # only a replicated node pays for it

            self.replication = Replicator(self)
            try:
                await self.replication.start()
            except BaseException:
                with contextlib.suppress(Exception):
                    await self.replication.abort()
                self.replication = None
                await self._stop_after_failed_start()
                raise
            try:
                if self._link_server is not None:
                    await self._link_server.start_serving()
                await self.tcp_server.start_serving()
                log.info("TCP: listening on %s", self.tcp_address)
                await self.http.serve()
            except BaseException:
                await self.stop()
                raise
        # Ready once registered with nsqlookupd (--workers: worker 0 registers once every
        # worker serves).
        self.workers.started(self.lookup)

    def ready(self) -> None:
        """Serving, and at every nsqlookupd (or it failed to answer): ``/ping`` says OK."""
        self.starting = None

    async def _clients_closed(self) -> None:
        """Until every closing client's transport has closed (at most about a second)."""
        for _ in range(100):
            if not self.clients:
                return
            await asyncio.sleep(0.01)

    async def _stop_after_failed_start(self) -> None:
        """A start that failed says one thing, its FATAL line (``internal/process.py``): the
        closing of what it had opened is done without its INFO lines."""
        level = log.level
        log.setLevel(max(level, logging.WARNING))
        try:
            await self.stop()
        finally:
            log.setLevel(level)

    async def stop(self) -> None:
        """nsqd's Exit: close listeners and clients, then flush every queue to its backend."""
        if self.exiting:
            return
        self.exiting = True
        if self.replication is not None:
            await self.replication.stop()
        await self.workers.stop()
        if self._link_server is not None:
            self._link_server.close()
        await self.lookup.close()
        if self.tcp_server is not None:
            log.info("TCP: closing %s", self.tcp_address)
            self.tcp_server.close()
        if self.http is not None:
            await self.http.stop()
        if self.auth is not None:
            await self.auth.close()
        for client in list(self.clients.values()):
            client.close_for_exit()
        # Let the transports finish closing, so every client's in-flight messages are back.
        await self._clients_closed()
        # A client that does not read cannot hold shutdown: drop what it has not taken.
        for client in list(self.clients.values()):
            client.abort()
        await self._clients_closed()
        if self._sync_timer is not None:
            self._sync_timer.cancel()
        self.metadata.close()
        self.metadata.persist()
        for topic in list(self.topics.values()):
            # A failure is logged by the topic; the other topics must still be flushed.
            with contextlib.suppress(Exception):
                topic.close(delete=False)
        self.retention.close_replicas()
        self._dir_lock.unlock()
        tracing.stop(self._tracing)  # what the exporters hold, flushed
        if self.tcp_server is not None:
            await self.tcp_server.wait_closed()
        log.info("NSQ: bye")


def run(opts: Options, worker: WorkerSpec | None = None) -> int:
    """Run nsqd until SIGTERM or SIGINT; the console script's body (one worker's, with
    ``worker``)."""
    return process.run(lambda loop: NSQD(opts, loop, worker), "nsqd", log)
