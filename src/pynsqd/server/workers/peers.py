"""One worker of ``nsqd --workers N``: its share of the host's sockets and its peers.

Theory of operation. The supervisor (``supervisor.py``) binds the node's addresses once
(``--tcp-address``, ``--http-address``, ``--https-address``) and each worker's two private unix
sockets (``<data-path>/worker-<i>/link.sock`` for links, ``admin.sock`` for HTTP between
workers), then starts the workers with those descriptors and a ``WorkerSpec`` in the
environment. Every worker accepts on the shared sockets, one connection per wake-up, so
connections spread over the workers that are free to take them, and a worker that dies leaves
the listening socket open: what arrives while it restarts waits in the kernel's queue.

A worker is an nsqd of its own (its data directory, node id, topics, channels) with three
additions, here and in ``relay.py`` and ``admin.py``: a channel with consumers pulls what the
other workers' copies hold (relay), an admin call made to one worker is made to every worker and
answered once (``fanned``), and ``/stats`` answers for the node (``combine_stats``). A topic
made by a publish on one worker is made on the others too (so nsqlookupd, which only worker 0
registers with, and ``/stats`` list it); a channel made by a SUB is made on the others before
the SUB is answered (``channel_created``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import ssl
import urllib.parse
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from ...core.lending import Lending
from ...internal.listener import SharedListener
from ...internal.names import is_ephemeral
from .admin import AdminLinks
from .forward import Done, Forwarder
from .lone import LoneProcess, Registrar, WorkerNode
from .placement import Placement
from .relay import Relay
from .spec import ConnectionCounts, WorkerSpec

if TYPE_CHECKING:
    from ...core.channel import Channel


log = logging.getLogger("pynsqd")


def inherited_socket(fd: int) -> socket.socket:
    return socket.socket(fileno=fd)


class Workers(LoneProcess):
    """This worker's view of the others (``nsqd.workers``; ``lone.LoneProcess`` without
    ``--workers``)."""

    def __init__(self, nsqd: WorkerNode, spec: WorkerSpec) -> None:
        super().__init__(nsqd)
        self.spec = spec
        self.index = spec.index
        self.opts = nsqd.opts
        self.loop = nsqd.loop
        #: Channels made here being made on the other workers (``channel_created``).
        self._made: dict[tuple[str, str], asyncio.Future[None]] = {}
        #: Where a topic is kept (``placement.py``).
        self.placement = Placement(spec.index, spec.count, clustered=bool(self.opts.etcd_endpoints))
        #: HTTP between the workers (``admin.py``).
        self.admin: AdminLinks = AdminLinks(
            self.opts,
            self.index,
            spec.admins,
            clustered=self.placement.clustered,
            kept=self._kept_by,
            storage=spec.storage,
        )
        self._tasks: set[asyncio.Task[Any]] = set()
        self._alive_fd = spec.fds.get("alive", -1)
        self._clients = 0
        self._counts = ConnectionCounts(spec.counts, spec.count) if spec.counts else None
        if self._counts is not None:
            self._counts.set(self.index, 0)
        self.forwarder = Forwarder(self)
        #: The sockets this worker accepts on (its copies of the supervisor's).
        self._listeners: list[SharedListener] = []

    def _kept_by(self, name: str) -> int | None:
        """The worker that keeps topic ``name`` when another (a bounded topic; on a replicated
        node, a retained one): ``Topic.kept_by``; None for a topic this worker does not have."""
        topic = self.nsqd.topics.get(name)
        return topic.kept_by if topic is not None else None

    @property
    def is_lead(self) -> bool:
        """Worker 0 registers the node with nsqlookupd."""
        return self.index == 0

    def peers(self) -> list[int]:
        return [i for i in range(self.spec.count) if i != self.index]

    def link_path(self, peer: int) -> str:
        return self.spec.links[peer]

    def forward(self, peer: int, command: bytes, done: Done) -> None:
        self.forwarder.send(peer, command, done)

    def storage_id(self, own: str) -> str:
        """The node's storage id (``/info``): the supervisor's directory's, for every worker."""
        return self.spec.storage or own

    # -- sockets --------------------------------------------------------------------------

    def _shared(
        self, name: str, factory: Callable[[], asyncio.BaseProtocol], context: ssl.SSLContext | None
    ) -> SharedListener | None:
        fd = self.spec.fds.get(name)
        if fd is None:
            return None
        # The node's TCP port: a worker with more than its share of clients lets the others
        # take the next one (HTTP's connections are short-lived: taken as they come).
        admit = self.admit if name == "tcp" and self._counts is not None else None
        listener = SharedListener(self.loop, inherited_socket(fd), factory, context, admit)
        self._listeners.append(listener)
        return listener

    # -- clients spread over the workers --------------------------------------------------

    def client_count(self, delta: int) -> None:
        """A client connection of this worker opened (+1) or closed (-1)."""
        self._clients += delta
        if self._counts is not None:
            self._counts.set(self.index, self._clients)

    def admit(self) -> bool:
        """Whether this worker takes the next connection: it holds no more than one more than
        the least loaded live worker (a worker that is down counts as full)."""
        assert self._counts is not None
        return self._clients <= self._counts.least_but(self.index) + 1

    def started(self, lookup: Registrar) -> None:
        """Serving: tell the supervisor, hear from it when every worker serves (``s``: worker 0
        registers the node with nsqlookupd, then says so) and when the node is ready (``R``),
        and stop when it goes (its end of a pipe closes)."""
        self.nsqd.starting = "not every worker serves yet"
        self._report("serving")
        go = self.spec.fds.get("go")
        if go is None:  # not started by a supervisor
            self.nsqd.ready()
        else:
            os.set_blocking(go, False)
            self.loop.add_reader(go, self._told, go, lookup)
        if self._alive_fd >= 0:
            self.loop.add_reader(self._alive_fd, self._supervisor_gone)

    def _report(self, what: str) -> None:
        ready = self.spec.fds.get("ready")
        if ready is not None:
            with contextlib.suppress(OSError):
                os.write(ready, b"%d %s\n" % (self.index, what.encode()))

    def _told(self, fd: int, lookup: Registrar) -> None:
        try:
            data = os.read(fd, 64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.loop.remove_reader(fd)
            return
        for word in data:
            if word == ord("s") and self.is_lead:
                lookup.register(self.opts.lookupd_tcp_addresses, lambda: self._report("registered"))
            elif word == ord("R"):
                self.nsqd.ready()

    def _supervisor_gone(self) -> None:
        try:
            data = os.read(self._alive_fd, 64)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            return
        self.loop.remove_reader(self._alive_fd)
        log.error("WORKERS: the supervisor is gone; stopping")
        # The node's ports go first, so that an nsqd started in its place can bind them while
        # this one flushes (as a killed nsqd's ports are free at once).
        for listener in self._listeners:
            listener.close()
        os.kill(os.getpid(), signal.SIGTERM)

    # -- channels -------------------------------------------------------------------------

    def attach(self, channel: Channel) -> None:
        """A new channel pulls from the other workers while it has consumers."""
        channel.lending = Lending(Relay(self, channel))

    @staticmethod
    def detach(channel: Channel) -> None:
        lending = channel.lending
        if lending is not None and isinstance(lending.demand, Relay):
            lending.demand.close()

    # -- topics and channels made here are made on every worker ---------------------------

    def topic_created(self, name: str) -> None:
        if name in self.admin.quiet:
            return
        self._spawn(
            self.admin.fan_out("POST", "/topic/create?topic=" + urllib.parse.quote(name), b"")
        )

    def channel_created(self, topic: str, channel: str) -> None:
        """A channel made here (a SUB, a link's SUB) is made on every other worker, so that
        what is published through any of them after the SUB's OK is the channel's; the SUB
        waits for it (``subscribed``). An #ephemeral channel reaches the others
        through the links alone (made everywhere, it would outlive its consumers there)."""
        if topic in self.admin.quiet or is_ephemeral(channel):
            return
        key = (topic, channel)
        done: asyncio.Future[None] = self.loop.create_future()
        self._made[key] = done
        query = urllib.parse.urlencode({"topic": topic, "channel": channel})

        async def announce() -> None:
            try:
                await asyncio.wait_for(
                    self.admin.fan_out("POST", f"/channel/create?{query}", b""), 5.0
                )
            except TimeoutError:
                log.warning(
                    "WORKERS: channel %s:%s not made on every worker in 5s; going on",
                    topic,
                    channel,
                )
            finally:
                if self._made.get(key) is done:
                    del self._made[key]
                if not done.done():
                    done.set_result(None)

        self._spawn(announce())

    def subscribed(self, channel: Channel) -> asyncio.Future[Any] | None:
        """What a SUB to ``channel`` here waits for before its OK: the channel made on every
        worker (``channel_created``), and its links told what the others hold
        (``Relay.synced``). None: nothing to wait for."""
        waits = [self._made.get((channel.topic.name, channel.name))]
        lending = channel.lending
        if lending is not None and isinstance(lending.demand, Relay):
            waits.append(lending.demand.synced())
        pending = [w for w in waits if w is not None and not w.done()]
        return asyncio.gather(*pending) if pending else None

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- stop -----------------------------------------------------------------------------

    async def stop(self) -> None:
        if self._alive_fd >= 0:
            with contextlib.suppress(ValueError, OSError):
                self.loop.remove_reader(self._alive_fd)
        for topic in list(self.nsqd.topics.values()):
            for ch in list(topic.channels.values()):
                self.detach(ch)
        for task in list(self._tasks):
            task.cancel()
        self.forwarder.close()
        await self.admin.close()
