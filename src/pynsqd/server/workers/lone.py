"""The other workers when there are none: one nsqd process, without ``--workers``.

``nsqd.workers`` is never None. In a single process it is a ``LoneProcess``: nsqd, its
connections and its HTTP API speak to the other workers the same way at any worker count, and
here each answer is what a lone nsqd does (it listens on its own addresses, keeps every topic's
log, makes admin calls here alone, answers ``/stats`` for itself). ``peers.Workers`` is a
``LoneProcess`` whose answers the other workers change; ``listen`` is the one place a worker or
a lone process gets a listening socket. Nothing here is asked of another process.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ...internal.listener import SharedListener, listen
from .placement import Placement

if TYPE_CHECKING:
    from aiohttp.web import StreamResponse
    from aiohttp.web_request import BaseRequest

    from ...core.channel import Channel
    from ...core.topic import Topic
    from ...options import Options
    from .admin import AdminLinks


class WorkerNode(Protocol):
    """What a worker's part needs of its nsqd (``server/nsqd.NSQD``)."""

    opts: Options
    loop: asyncio.AbstractEventLoop
    #: Why ``/ping`` does not say OK yet (None: ready).
    starting: str | None

    @property
    def topics(self) -> dict[str, Topic]: ...
    def ready(self) -> None: ...


class Registrar(Protocol):
    """The node's registration with nsqlookupd (``server/lookup.Lookup``)."""

    def register(self, addresses: list[str], then: Callable[[], None]) -> None: ...


Handler = Callable[..., Any]
Json = dict[str, Any]


async def own_listener(
    loop: asyncio.AbstractEventLoop,
    factory: Callable[[], asyncio.BaseProtocol],
    address: str,
    ssl_context: ssl.SSLContext | None,
    *,
    serve: bool,
) -> asyncio.Server | None:
    """A socket of this process's own on ``address`` ("": none); ``serve`` False binds it
    (its address is known) and takes no connection until its ``start_serving``."""
    if not address:
        return None
    return await listen(loop, factory, address, ssl=ssl_context, start_serving=serve)


class LoneAdmin:
    """HTTP between the workers, with none: every call is made here alone."""

    @staticmethod
    def on_admin_socket(request: BaseRequest) -> bool:
        return False

    @staticmethod
    def fanned(handler: Handler) -> Handler:
        return handler

    routed = on_member = fanned

    @staticmethod
    async def peer_answers(request: BaseRequest, path_qs: str) -> list[bytes] | None:
        return None

    @staticmethod
    async def unhealthy_peers(request: BaseRequest) -> list[tuple[int, str]]:
        return []

    @staticmethod
    async def combine_stats(
        request: BaseRequest, topics: list[Json] | None, producers: list[Json] | None
    ) -> tuple[list[Json] | None, list[Json] | None]:
        return topics, producers

    @staticmethod
    async def proxy(peer: int, request: BaseRequest, body: bytes | None) -> StreamResponse:
        raise AssertionError("a lone process keeps every topic: nothing is passed on")


class LoneProcess:
    """``nsqd.workers`` in a single process; ``peers.Workers``, with ``--workers N``, is one
    too, with the answers the other workers change."""

    def __init__(self, nsqd: WorkerNode) -> None:
        self.nsqd = nsqd
        #: Every topic is kept here: a node of one worker.
        self.placement = Placement()
        self.admin: LoneAdmin | AdminLinks = LoneAdmin()

    @property
    def is_lead(self) -> bool:
        """This process registers with nsqlookupd, and is the node's member of a cluster."""
        return True

    def storage_id(self, own: str) -> str:
        """The node's storage id (``/info``): this process's directory's."""
        return own

    async def listen(
        self,
        name: str,
        factory: Callable[[], asyncio.BaseProtocol],
        address: str,
        ssl_context: ssl.SSLContext | None = None,
        *,
        serve: bool,
    ) -> SharedListener | asyncio.Server | None:
        """The socket ``name`` (tcp, http, https; link and admin between workers) on its
        flag's ``address`` ("": none), or the node's, which the supervisor bound once
        (``_shared``); ``serve`` False: no connection is taken until its
        ``start_serving``."""
        shared = self._shared(name, factory, ssl_context)
        if shared is None:
            return await own_listener(self.nsqd.loop, factory, address, ssl_context, serve=serve)
        if serve:
            await shared.start_serving()
        return shared

    def _shared(
        self, name: str, factory: Callable[[], asyncio.BaseProtocol], context: ssl.SSLContext | None
    ) -> SharedListener | None:
        """A socket the supervisor bound for every worker (none: a lone process)."""
        return None

    def started(self, lookup: Registrar) -> None:
        """Serving: ready once nsqlookupd has it (or failed to answer)."""
        self.nsqd.starting = "registering with nsqlookupd"
        lookup.register(self.nsqd.opts.lookupd_tcp_addresses, self.nsqd.ready)

    # Topics, channels and clients concern no other process.
    def topic_created(self, name: str) -> None:
        pass

    def channel_created(self, topic: str, channel: str) -> None:
        pass

    def attach(self, channel: Channel) -> None:
        pass

    def detach(self, channel: Channel) -> None:
        pass

    def client_count(self, delta: int) -> None:
        pass

    def subscribed(self, channel: Channel) -> asyncio.Future[Any] | None:
        return None

    def forward(self, peer: int, command: bytes, done: Callable[[bytes, bool], None]) -> None:
        raise AssertionError("a lone process keeps every topic: nothing is forwarded")

    async def stop(self) -> None:
        pass
