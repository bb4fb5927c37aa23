"""nsqd's HTTP listener: aiohttp's low-level server on nsqd's own event loop.

nsqd's routes on the shared ``Router`` (``router.py``), plus ``/config/:opt`` and the
``--tls-required`` gate. The service also runs the statsd task, so nsqd has one object to
start and stop for everything in this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from typing import TYPE_CHECKING, Any

from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse

from ..internal import debug
from ..internal.httpapi import Params
from ..internal.listener import SharedListener, format_address, split_host_port
from ..internal.memstats import install_gc_timer
from ..internal.router import (
    V1_HEADER,
    Handler,
    Methods,
    Router,
    sync_handler,
    text_response,
)
from ..log import LOGGER_NAME
from .api import API
from .host import NSQDHost
from .lifecycle import LifecycleAPI
from .peek import PeekAPI
from .replication import ReplicationAPI
from .statsd import StatsdPusher

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

log = logging.getLogger(LOGGER_NAME)

#: Admin calls that ``--workers`` makes on every worker (their POST, and PUT /config/:opt).
FANNED = frozenset(
    {
        "/topic/create",
        "/topic/delete",
        "/topic/empty",
        "/topic/pause",
        "/topic/unpause",
        "/channel/create",
        "/channel/delete",
        "/channel/empty",
        "/channel/pause",
        "/channel/unpause",
        "/topic/config",
        "/channel/config",
        "/topic/retention",
    }
)
#: Calls about a topic's log that ``--workers`` has the worker that keeps it answer.
ROUTED = frozenset(
    {
        "/topic/offsets",
        "/topic/log",
        "/topic/retention",
        "/topic/reader",
        "/channel/rewind",
        "/channel/create",
    }
)
#: ... and, on a replicated node, the calls about the cluster: by the member (worker) they
#: are about (``server/workers/members.py``).
ON_MEMBER = frozenset({"/info", "/topic/replication", "/topic/replicate"})


class HTTPService(Router):
    """The HTTP API on ``--http-address`` plus the statsd task."""

    def __init__(self, nsqd: NSQDHost) -> None:
        super().__init__(log)
        self.nsqd = nsqd
        self.api = api = API(nsqd)
        self.registry: CollectorRegistry | None = None  # made by the first scrape
        self.https_address = ""
        self._https_server: asyncio.Server | SharedListener | None = None
        self._admin: asyncio.Server | SharedListener | None = None  # --workers: its own socket
        self._statsd_task: asyncio.Task[None] | None = None
        add = self.add
        add("GET", "/ping", "plain", api.ping)
        add("GET", "/info", "v1", api.info)
        add("POST", "/pub", "v1", api.pub)
        add("POST", "/mpub", "v1", api.mpub)
        add("GET", "/stats", "v1", api.stats)
        add("POST", "/topic/create", "v1", api.topic_create)
        add("POST", "/topic/delete", "v1", api.topic_delete)
        add("POST", "/topic/empty", "v1", api.topic_empty)
        add("POST", "/topic/pause", "v1", api.topic_pause)
        add("POST", "/topic/unpause", "v1", api.topic_unpause)
        add("POST", "/channel/create", "v1", api.channel_create)
        add("POST", "/channel/delete", "v1", api.channel_delete)
        add("POST", "/channel/empty", "v1", api.channel_empty)
        add("POST", "/channel/pause", "v1", api.channel_pause)
        add("POST", "/channel/unpause", "v1", api.channel_unpause)
        replay = api.replay
        add("GET", "/topic/offsets", "v1", replay.offsets)
        add("GET", "/topic/log", "v1", replay.read)
        add("POST", "/topic/retention", "v1", replay.retention)
        add("POST", "/topic/reader", "v1", replay.reader)
        add("POST", "/channel/rewind", "v1", replay.rewind)
        replication = self.replication_api = ReplicationAPI(nsqd)
        add("GET", "/topic/replication", "v1", replication.get)
        add("POST", "/topic/replication", "v1", replication.set)
        add("GET", "/topic/replicate", "v1", replication.replicate)
        peek = PeekAPI(nsqd)
        add("GET", "/channel/peek", "v1", peek.channel)
        add("GET", "/topic/peek", "v1", peek.topic)
        lifecycle = LifecycleAPI(nsqd)
        add("GET", "/topic/config", "v1", lifecycle.get_topic)
        add("POST", "/topic/config", "v1", lifecycle.set_topic)
        add("GET", "/channel/config", "v1", lifecycle.get_channel)
        add("POST", "/channel/config", "v1", lifecycle.set_channel)
        add("GET", "/metrics", "raw", self._metrics)
        self.add_pprof_routes("/debug/pprof/")
        add("GET", "/debug/pprof/profile", "raw", self._profile)
        add("PUT", "/debug/setblockrate", "plain", sync_handler(lambda r, p: debug.setblockrate(p)))
        add("POST", "/debug/freememory", "plain", sync_handler(lambda r, p: debug.freememory()))

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, *, serve: bool = True) -> None:
        """Bind --http-address and start statsd; with ``serve`` False the socket is bound
        (its address known) but takes no connection until ``serve`` (a replicated node joins
        its cluster in between)."""
        install_gc_timer()
        opts = self.nsqd.opts
        workers = self.nsqd.workers
        # --workers: the node's socket, shared by its workers, and this one's own.
        self._web = web = self.web_server(self.nsqd.loop)
        self._admin = await workers.listen("admin", web, "", serve=serve)
        self._server = await workers.listen("http", web, opts.http_address, serve=serve)
        if self._server is not None:
            self.address = format_address(self._server.sockets[0])
            if serve:
                log.info("HTTP: listening on %s", self.address)
        if opts.statsd_address:
            self._statsd_task = self.nsqd.loop.create_task(StatsdPusher(self.nsqd).run())

    async def start_https(
        self, address: str, ssl_context: ssl.SSLContext, *, serve: bool = True
    ) -> None:
        """The same API over TLS on --https-address; nsqd starts it when TLS is configured."""
        if self._web is None:
            self._web = self.web_server(self.nsqd.loop)
        self._https_server = await self.nsqd.workers.listen(
            "https", self._web, address, ssl_context, serve=serve
        )
        assert self._https_server is not None
        self.https_address = format_address(self._https_server.sockets[0])
        if serve:
            log.info("HTTPS: listening on %s", self.https_address)

    async def serve(self) -> None:
        """Take connections on the sockets ``start`` and ``start_https`` bound unserved."""
        if self._admin is not None and not self._admin.is_serving():
            await self._admin.start_serving()
        if self._server is not None and not self._server.is_serving():
            await self._server.start_serving()
            log.info("HTTP: listening on %s", self.address)
        if self._https_server is not None and not self._https_server.is_serving():
            await self._https_server.start_serving()
            log.info("HTTPS: listening on %s", self.https_address)

    async def stop(self) -> None:
        if self._https_server is not None:
            log.info("HTTPS: closing %s", self.https_address)
            self._https_server.close()
        if self._server is not None:
            log.info("HTTP: closing %s", self.address)
            self._server.close()
        if self._admin is not None:
            self._admin.close()
        if self._statsd_task is not None:
            self._statsd_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._statsd_task
            self._statsd_task = None
        await self.replication_api.close()
        if self._web is not None:
            await self._web.shutdown(1.0)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self._https_server is not None:
            await self._https_server.wait_closed()
            self._https_server = None

    # -- requests -------------------------------------------------------------------------

    def gate(self, request: BaseRequest) -> StreamResponse | None:
        if self.nsqd.workers.admin.on_admin_socket(request):
            return None  # another worker, or a client's call it passed on (checked there)
        if self.nsqd.opts.tls_required == "true" and not request.secure:
            # nsqd's plain-HTTP gate under --tls-required=true.
            port = _https_port(self.https_address or self.nsqd.opts.https_address)
            resp = Response(status=403, text=f'{{"message": "TLS_REQUIRED", "https_port": {port}}}')
            resp.headers[V1_HEADER[0]] = V1_HEADER[1]
            return resp
        return None

    def find_route(self, path: str) -> Methods | None:
        methods = self.routes.get(path)
        config = False
        if methods is None and path.startswith("/config/") and "/" not in path[8:] and path[8:]:
            handler = self._config_handler(path[8:])
            methods = {"GET": ("v1", handler), "PUT": ("v1", handler)}
            config = True
        workers = self.nsqd.workers
        if methods is not None and (config or path in FANNED):
            # --workers: an admin call is made on every worker, answered once.
            methods = {
                m: (kind, workers.admin.fanned(h) if m in ("POST", "PUT") else h)
                for m, (kind, h) in methods.items()
            }
        if methods is not None and path in ROUTED:
            # ... and one about a topic's log by the worker that keeps it (then fanned).
            methods = {m: (kind, workers.admin.routed(h)) for m, (kind, h) in methods.items()}
        if methods is not None and path in ON_MEMBER:
            methods = {m: (kind, workers.admin.on_member(h)) for m, (kind, h) in methods.items()}
        return methods

    def _config_handler(self, opt: str) -> Handler:
        async def handler(request: BaseRequest, params: Params) -> Any:
            return await self.api.config(request, params, opt)

        return handler

    async def _metrics(self, request: BaseRequest, params: Params) -> StreamResponse:
        # prometheus_client (5.5 MiB) is imported by the first scrape, not by every server.
        from . import metrics

        if self.registry is None:
            self.registry = metrics.make_registry(self.nsqd)
        body = metrics.render(self.registry)
        # --workers: the node's figures, every worker's summed.
        others = await self.nsqd.workers.admin.peer_answers(request, "/metrics")
        if others is not None:
            body = metrics.merge_metrics([body, *others])
        resp = Response(status=200, body=body)
        resp.headers["Content-Type"] = metrics.CONTENT_TYPE
        return resp

    async def _profile(self, request: BaseRequest, params: Params) -> StreamResponse:
        return text_response(await debug.profile(params))


def _https_port(address: str) -> int:
    try:
        return split_host_port(address)[1]
    except ValueError:
        return 0
