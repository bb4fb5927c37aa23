"""nsqlookupd's HTTP API (``nsqlookupd/http.go``) on aiohttp's low-level server.

Same router rules and envelopes as nsqd's API (``pynsqd.http.server``): exact paths, 405
``METHOD_NOT_ALLOWED`` for a known path with another method, 404 ``NOT_FOUND`` otherwise; V1
routes answer JSON (or an empty body for ``None``) with ``X-NSQ-Content-Type``, errors as
``{"message": TOKEN}``; ``/ping`` is plain text. Parameters come only from the query string.
Go's map order is random; lists here are sorted so that answers are stable.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web_server
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse

from .. import NSQD_VERSION
from ..http import debug
from ..http.api import HTTPError, Params
from ..http.server import TEXT_TYPE, respond_plain, respond_v1
from ..protocol.names import is_valid_name
from ..server.listener import format_address, listen
from .registration_db import Registration, filter_by_active

if TYPE_CHECKING:
    import asyncio

    from .nsqlookupd import NSQLookupd

log = logging.getLogger("pynsqd.lookupd")

Kind = Literal["v1", "plain", "raw"]
Handler = Callable[[BaseRequest, Params], Awaitable[Any]]


def _topic_channel_args(params: Params) -> tuple[str, str]:
    """``http_api.GetTopicChannelArgs``."""
    topic = params.get("topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(topic):
        raise HTTPError(400, "INVALID_ARG_TOPIC")
    channel = params.get("channel")
    if channel is None:
        raise HTTPError(400, "MISSING_ARG_CHANNEL")
    if not is_valid_name(channel):
        raise HTTPError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


def _topic_arg(params: Params) -> str:
    topic = params.checked().get("topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    return topic


def _text_response(text: str) -> Response:
    resp = Response(status=200, body=text.encode())
    resp.headers["Content-Type"] = TEXT_TYPE
    return resp


class LookupdHTTP:
    def __init__(self, lookupd: NSQLookupd) -> None:
        self.lookupd = lookupd
        self.db = lookupd.db
        self.address = ""
        self._web: web_server.Server | None = None
        self._server: asyncio.Server | None = None
        self.routes: dict[str, dict[str, tuple[Kind, Handler]]] = {}
        add = self._add
        add("GET", "/ping", "plain", self.ping)
        add("GET", "/info", "v1", self.info)
        add("GET", "/debug", "v1", self.debug)
        add("GET", "/lookup", "v1", self.lookup)
        add("GET", "/topics", "v1", self.topics)
        add("GET", "/channels", "v1", self.channels)
        add("GET", "/nodes", "v1", self.nodes)
        add("POST", "/topic/create", "v1", self.topic_create)
        add("POST", "/topic/delete", "v1", self.topic_delete)
        add("POST", "/channel/create", "v1", self.channel_create)
        add("POST", "/channel/delete", "v1", self.channel_delete)
        add("POST", "/topic/tombstone", "v1", self.topic_tombstone)
        add("GET", "/debug/pprof", "raw", _text(lambda r, p: debug.index()))
        add("GET", "/debug/pprof/cmdline", "raw", _text(lambda r, p: debug.cmdline()))
        add("GET", "/debug/pprof/symbol", "raw", _text(lambda r, p: debug.symbol(r.method)))
        add("POST", "/debug/pprof/symbol", "raw", _text(lambda r, p: debug.symbol(r.method)))
        add("GET", "/debug/pprof/heap", "raw", _text(lambda r, p: debug.heap()))
        add("GET", "/debug/pprof/goroutine", "raw", _text(lambda r, p: debug.goroutine()))
        add("GET", "/debug/pprof/block", "raw", _text(lambda r, p: debug.block()))
        add("GET", "/debug/pprof/threadcreate", "raw", _text(lambda r, p: debug.threadcreate()))

    def _add(self, method: str, path: str, kind: Kind, handler: Handler) -> None:
        self.routes.setdefault(path, {})[method] = (kind, handler)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, address: str) -> None:
        loop = self.lookupd.loop
        self._web = web_server.Server(self._handle, loop=loop, access_log=None, lingering_time=1.0)
        self._server = await listen(loop, self._web, address)
        self.address = format_address(self._server.sockets[0])
        log.info("HTTP: listening on %s", self.address)

    async def stop(self) -> None:
        if self._server is not None:
            log.info("HTTP: closing %s", self.address)
            self._server.close()
        if self._web is not None:
            await self._web.shutdown(1.0)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    # -- requests -------------------------------------------------------------------------

    async def _handle(self, request: BaseRequest) -> StreamResponse:
        started = time.perf_counter()
        resp = await self._dispatch(request)
        elapsed = (time.perf_counter() - started) * 1e6
        log.info(
            "%d %s %s (%s) %.3fµs",
            resp.status,
            request.method,
            request.raw_path,
            request.remote,
            elapsed,
        )
        return resp

    async def _dispatch(self, request: BaseRequest) -> StreamResponse:
        methods = self.routes.get(request.path)
        if methods is None:
            return respond_v1(404, "NOT_FOUND")
        route = methods.get(request.method)
        if route is None:
            resp = respond_v1(405, "METHOD_NOT_ALLOWED")
            resp.headers["Allow"] = ", ".join(sorted(methods))
            return resp
        kind, handler = route
        params = Params(request.rel_url.raw_query_string)
        try:
            data = await handler(request, params)
        except HTTPError as err:
            if kind == "plain":
                return respond_plain(err.code, err.text)
            return respond_v1(err.code, err.text)
        except Exception:
            log.exception("HTTP: internal error in %s %s", request.method, request.path)
            return respond_v1(500, "INTERNAL_ERROR")
        if kind == "v1":
            return respond_v1(200, data)
        if kind == "plain":
            return respond_plain(200, data)
        assert isinstance(data, StreamResponse)
        return data

    # -- handlers -------------------------------------------------------------------------

    async def ping(self, request: BaseRequest, params: Params) -> Any:
        return "OK"

    async def info(self, request: BaseRequest, params: Params) -> Any:
        return {"version": NSQD_VERSION}

    async def topics(self, request: BaseRequest, params: Params) -> Any:
        return {"topics": [r.key for r in self.db.find_registrations("topic", "*", "")]}

    async def channels(self, request: BaseRequest, params: Params) -> Any:
        topic = _topic_arg(params)
        regs = self.db.find_registrations("channel", topic, "*")
        return {"channels": [r.subkey for r in regs]}

    async def lookup(self, request: BaseRequest, params: Params) -> Any:
        topic = _topic_arg(params)
        if not self.db.find_registrations("topic", topic, ""):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        opts = self.lookupd.opts
        channels = [r.subkey for r in self.db.find_registrations("channel", topic, "*")]
        producers = filter_by_active(
            self.db.find_producers("topic", topic, ""),
            opts.inactive_producer_timeout,
            opts.tombstone_lifetime,
        )
        return {"channels": channels, "producers": [p.peer_info.as_json() for p in producers]}

    async def nodes(self, request: BaseRequest, params: Params) -> Any:
        opts = self.lookupd.opts
        db = self.db
        # tombstoned nodes are listed, with a flag per topic
        clients = filter_by_active(
            db.find_producers("client", "", ""), opts.inactive_producer_timeout, 0
        )
        nodes = []
        for client in clients:
            peer = client.peer_info
            topics = [r.key for r in db.lookup_registrations(peer.id) if r.category == "topic"]
            tombstones = []
            for t in topics:
                producer = db.registrations.get(Registration("topic", t, ""), {}).get(peer.id)
                tombstoned = producer is not None and producer.is_tombstoned(
                    opts.tombstone_lifetime
                )
                tombstones.append(tombstoned)
            node = peer.as_json()
            node["tombstones"] = tombstones
            node["topics"] = topics
            nodes.append(node)
        return {"producers": nodes}

    async def debug(self, request: BaseRequest, params: Params) -> Any:
        data: dict[str, list[dict[str, Any]]] = {}
        for r, producers in self.db.registrations.items():
            for p in producers.values():
                peer = p.peer_info
                data.setdefault(f"{r.category}:{r.key}:{r.subkey}", []).append(
                    {
                        "id": peer.id,
                        "hostname": peer.hostname,
                        "broadcast_address": peer.broadcast_address,
                        "tcp_port": peer.tcp_port,
                        "http_port": peer.http_port,
                        "version": peer.version,
                        "topology_zone": peer.topology_zone,
                        "topology_region": peer.topology_region,
                        "last_update": peer.last_update_ns,
                        "tombstoned": p.tombstoned,
                        "tombstoned_at": p.tombstoned_at_ns,
                    }
                )
        return dict(sorted(data.items()))

    async def topic_create(self, request: BaseRequest, params: Params) -> Any:
        topic = _topic_arg(params)
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration("topic", topic, ""))
        return None

    async def topic_delete(self, request: BaseRequest, params: Params) -> Any:
        topic = _topic_arg(params)
        for r in self.db.find_registrations("channel", topic, "*"):
            log.info("DB: removing channel(%s) from topic(%s)", r.subkey, topic)
            self.db.remove_registration(r)
        for r in self.db.find_registrations("topic", topic, ""):
            log.info("DB: removing topic(%s)", topic)
            self.db.remove_registration(r)
        return None

    async def topic_tombstone(self, request: BaseRequest, params: Params) -> Any:
        topic = _topic_arg(params)
        node = params.get("node")
        if node is None:
            raise HTTPError(400, "MISSING_ARG_NODE")
        log.info("DB: setting tombstone for producer@%s of topic(%s)", node, topic)
        for p in self.db.find_producers("topic", topic, ""):
            peer = p.peer_info
            if f"{peer.broadcast_address}:{peer.http_port}" == node:
                p.tombstone()
        return None

    async def channel_create(self, request: BaseRequest, params: Params) -> Any:
        topic, channel = _topic_channel_args(params.checked())
        log.info("DB: adding channel(%s) in topic(%s)", channel, topic)
        self.db.add_registration(Registration("channel", topic, channel))
        log.info("DB: adding topic(%s)", topic)
        self.db.add_registration(Registration("topic", topic, ""))
        return None

    async def channel_delete(self, request: BaseRequest, params: Params) -> Any:
        topic, channel = _topic_channel_args(params.checked())
        regs = self.db.find_registrations("channel", topic, channel)
        if not regs:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        log.info("DB: removing channel(%s) from topic(%s)", channel, topic)
        for r in regs:
            self.db.remove_registration(r)
        return None


def _text(fn: Callable[[BaseRequest, Params], str]) -> Handler:
    async def handler(request: BaseRequest, params: Params) -> Any:
        return _text_response(fn(request, params))

    return handler
