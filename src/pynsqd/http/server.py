"""The HTTP listener: aiohttp's low-level server on nsqd's own event loop, and the router.

The router is nsqd's (``julienschmidt/httprouter`` in ``nsqd/http.go``): an exact path and
method table plus ``/config/:opt``; a known path with the wrong method is 405
``{"message":"METHOD_NOT_ALLOWED"}``, anything else 404 ``{"message":"NOT_FOUND"}``. Responses
follow ``http_api.RespondV1`` (V1 routes) or ``PlainText`` (``/ping``, ``/debug/setblockrate``,
``/debug/freememory``). The service also runs the statsd task, so nsqd has one object to
start and stop for everything in this package.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal

from aiohttp import web_server
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse

from ..log import LOGGER_NAME
from ..server.listener import format_address, listen, split_host_port
from . import debug
from .api import API, HTTPError, Params
from .memstats import install_gc_timer
from .metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from .metrics import make_registry, render
from .statsd import StatsdPusher

if TYPE_CHECKING:
    from ..server.nsqd import NSQD

log = logging.getLogger(LOGGER_NAME)

V1_HEADER = ("X-NSQ-Content-Type", "nsq; version=1.0")
JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"

Kind = Literal["v1", "plain", "raw"]
Handler = Callable[[BaseRequest, Params], Awaitable[Any]]


def _json(data: Any) -> bytes:
    # Go's json.Marshal: compact, and <, > and & escaped.
    text = json.dumps(data, separators=(",", ":"), ensure_ascii=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return text.encode()


def respond_v1(code: int, data: Any) -> Response:
    """nsqd's ``RespondV1``: raw str/bytes, empty for None, JSON otherwise; errors as JSON."""
    content_type: str | None = None
    if code == 200:
        if isinstance(data, str):
            body = data.encode("utf-8", "surrogateescape")
        elif isinstance(data, bytes):
            body = data
        elif data is None:
            body = b""
        else:
            body, content_type = _json(data), JSON_TYPE
    else:
        body, content_type = _json({"message": str(data)}), JSON_TYPE
    return _response(code, body, content_type, v1=True)


def _response(code: int, body: bytes, content_type: str | None, *, v1: bool) -> Response:
    resp = Response(status=code, body=body)
    if content_type is None:
        # Go sniffs a written body (text here) and sends no Content-Type for an empty one.
        if body:
            resp.headers["Content-Type"] = TEXT_TYPE
        else:
            resp.headers.popall("Content-Type", None)
    else:
        resp.headers["Content-Type"] = content_type
    if v1:
        resp.headers[V1_HEADER[0]] = V1_HEADER[1]
    return resp


def respond_plain(code: int, text: str) -> Response:
    return _response(code, text.encode("utf-8", "surrogateescape"), None, v1=False)


class HTTPService:
    """The HTTP API on ``--http-address`` plus the statsd task."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        self.api = api = API(nsqd)
        self.registry = make_registry(nsqd)
        self.address = ""
        self.https_address = ""
        self._web: web_server.Server | None = None
        self._server: asyncio.Server | None = None
        self._https_server: asyncio.Server | None = None
        self._statsd_task: asyncio.Task[None] | None = None
        self.routes: dict[str, dict[str, tuple[Kind, Handler]]] = {}
        add = self._add
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
        add("GET", "/metrics", "raw", self._metrics)
        add("GET", "/debug/pprof/", "raw", _text(lambda r, p: debug.index()))
        add("GET", "/debug/pprof/cmdline", "raw", _text(lambda r, p: debug.cmdline()))
        add("GET", "/debug/pprof/symbol", "raw", _text(lambda r, p: debug.symbol(r.method)))
        add("POST", "/debug/pprof/symbol", "raw", _text(lambda r, p: debug.symbol(r.method)))
        add("GET", "/debug/pprof/heap", "raw", _text(lambda r, p: debug.heap()))
        add("GET", "/debug/pprof/goroutine", "raw", _text(lambda r, p: debug.goroutine()))
        add("GET", "/debug/pprof/block", "raw", _text(lambda r, p: debug.block()))
        add("GET", "/debug/pprof/threadcreate", "raw", _text(lambda r, p: debug.threadcreate()))
        add("GET", "/debug/pprof/profile", "raw", self._profile)
        add("PUT", "/debug/setblockrate", "plain", _sync(lambda r, p: debug.setblockrate(p)))
        add("POST", "/debug/freememory", "plain", _sync(lambda r, p: debug.freememory()))

    def _add(self, method: str, path: str, kind: Kind, handler: Handler) -> None:
        self.routes.setdefault(path, {})[method] = (kind, handler)

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        install_gc_timer()
        opts = self.nsqd.opts
        if opts.http_address:
            self._web = web_server.Server(
                self._handle, loop=self.nsqd.loop, access_log=None, lingering_time=1.0
            )
            self._server = await listen(self.nsqd.loop, self._web, opts.http_address)
            self.address = format_address(self._server.sockets[0])
            log.info("HTTP: listening on %s", self.address)
        if opts.statsd_address:
            self._statsd_task = self.nsqd.loop.create_task(StatsdPusher(self.nsqd).run())

    async def start_https(self, address: str, ssl_context: ssl.SSLContext) -> None:
        """The same API over TLS on --https-address; nsqd starts it when TLS is configured."""
        if self._web is None:
            self._web = web_server.Server(
                self._handle, loop=self.nsqd.loop, access_log=None, lingering_time=1.0
            )
        self._https_server = await listen(self.nsqd.loop, self._web, address, ssl=ssl_context)
        self.https_address = format_address(self._https_server.sockets[0])
        log.info("HTTPS: listening on %s", self.https_address)

    async def stop(self) -> None:
        if self._https_server is not None:
            log.info("HTTPS: closing %s", self.https_address)
            self._https_server.close()
        if self._server is not None:
            log.info("HTTP: closing %s", self.address)
            self._server.close()
        if self._statsd_task is not None:
            self._statsd_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._statsd_task
            self._statsd_task = None
        if self._web is not None:
            await self._web.shutdown(1.0)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
        if self._https_server is not None:
            await self._https_server.wait_closed()
            self._https_server = None

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
            _peer(request),
            elapsed,
        )
        return resp

    async def _dispatch(self, request: BaseRequest) -> StreamResponse:
        opts = self.nsqd.opts
        if opts.tls_required == "true" and not request.secure:
            # nsqd's plain-HTTP gate under --tls-required=true.
            port = _https_port(self.https_address or opts.https_address)
            resp = Response(status=403, text=f'{{"message": "TLS_REQUIRED", "https_port": {port}}}')
            resp.headers[V1_HEADER[0]] = V1_HEADER[1]
            return resp
        path = request.path
        params = Params(request.rel_url.raw_query_string)
        methods = self.routes.get(path)
        if methods is None and path.startswith("/config/") and "/" not in path[8:] and path[8:]:
            config = self._config_handler(path[8:])
            methods = {"GET": ("v1", config), "PUT": ("v1", config)}
        if methods is None:
            return respond_v1(404, "NOT_FOUND")
        route = methods.get(request.method)
        if route is None:
            resp = respond_v1(405, "METHOD_NOT_ALLOWED")
            resp.headers["Allow"] = ", ".join(sorted(methods))
            return resp
        kind, handler = route
        try:
            data = await handler(request, params)
        except HTTPError as err:
            if kind == "v1":
                return respond_v1(err.code, err.text)
            return respond_plain(err.code, err.text)
        except Exception:
            log.exception("HTTP: internal error in %s %s", request.method, path)
            return respond_v1(500, "INTERNAL_ERROR")
        if kind == "v1":
            return respond_v1(200, data)
        if kind == "plain":
            return respond_plain(200, data)
        assert isinstance(data, StreamResponse)
        return data

    def _config_handler(self, opt: str) -> Handler:
        async def handler(request: BaseRequest, params: Params) -> Any:
            return await self.api.config(request, params, opt)

        return handler

    async def _metrics(self, request: BaseRequest, params: Params) -> StreamResponse:
        resp = Response(status=200, body=render(self.registry))
        resp.headers["Content-Type"] = METRICS_CONTENT_TYPE
        return resp

    async def _profile(self, request: BaseRequest, params: Params) -> StreamResponse:
        return _text_response(await debug.profile(params))


def _peer(request: BaseRequest) -> str:
    """The client's ``host:port`` (Go's ``RemoteAddr``)."""
    peer = request.transport.get_extra_info("peername") if request.transport else None
    if isinstance(peer, tuple):
        host = str(peer[0])
        return f"[{host}]:{peer[1]}" if ":" in host else f"{host}:{peer[1]}"
    return str(request.remote or "")


def _https_port(address: str) -> int:
    try:
        return split_host_port(address)[1]
    except ValueError:
        return 0


def _text_response(text: str) -> Response:
    resp = Response(status=200, body=text.encode())
    resp.headers["Content-Type"] = TEXT_TYPE
    return resp


def _text(fn: Callable[[BaseRequest, Params], str]) -> Handler:
    async def handler(request: BaseRequest, params: Params) -> Any:
        return _text_response(fn(request, params))

    return handler


def _sync(fn: Callable[[BaseRequest, Params], Any]) -> Handler:
    async def handler(request: BaseRequest, params: Params) -> Any:
        return fn(request, params)

    return handler
