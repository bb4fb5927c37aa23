"""The router nsqd and nsqlookupd share (``julienschmidt/httprouter`` as their http.go uses it).

An exact path and method table: a known path with another method is 405
``{"message":"METHOD_NOT_ALLOWED"}`` (with ``Allow``), anything else 404
``{"message":"NOT_FOUND"}``.
A handler returns data, rendered by its route's kind — ``v1`` (``http_api.RespondV1``),
``plain`` (``PlainText``) or ``raw`` (a ready response) — or raises ``HTTPError``. Any other
exception is logged and answered 500 ``INTERNAL_ERROR``; no traceback reaches the client.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from aiohttp import web_server
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response, StreamResponse

from ..internal.gotext import go_json
from . import debug
from .httpapi import HTTPError, Params
from .listener import SharedListener, format_address, listen

V1_HEADER = ("X-NSQ-Content-Type", "nsq; version=1.0")
JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"

Kind = Literal["v1", "plain", "raw"]
Handler = Callable[[BaseRequest, Params], Awaitable[Any]]
Methods = dict[str, tuple[Kind, Handler]]


def respond_v1(code: int, data: Any, extra: dict[str, Any] | None = None) -> Response:
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
            body, content_type = go_json(data), JSON_TYPE
    else:
        body, content_type = go_json({"message": str(data), **(extra or {})}), JSON_TYPE
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


def text_response(text: str) -> Response:
    resp = Response(status=200, body=text.encode())
    resp.headers["Content-Type"] = TEXT_TYPE
    return resp


def text_handler(fn: Callable[[BaseRequest, Params], str]) -> Handler:
    async def handler(request: BaseRequest, params: Params) -> Any:
        return text_response(fn(request, params))

    return handler


def sync_handler(fn: Callable[[BaseRequest, Params], Any]) -> Handler:
    async def handler(request: BaseRequest, params: Params) -> Any:
        return fn(request, params)

    return handler


#: With ``--workers``, a request another worker made over this one's private admin socket
#: names that worker (its index) or, passing a client's request on, the client's address
#: (``server/workers/admin.py``). Only a unix socket's request is taken at its word.
WORKER_HEADER = "X-Pynsqd-Worker"
CLIENT_HEADER = "X-Pynsqd-Client"


def peer(request: BaseRequest) -> str:
    """The client's ``host:port`` (Go's ``RemoteAddr``); over a worker's private admin socket
    the client's a worker passed on, or ``worker N`` for a worker's own call."""
    addr = request.transport.get_extra_info("peername") if request.transport else None
    if isinstance(addr, tuple):
        host = str(addr[0])
        return f"[{host}]:{addr[1]}" if ":" in host else f"{host}:{addr[1]}"
    if request.transport is not None and isinstance(addr, str):  # a unix socket
        client = request.headers.get(CLIENT_HEADER)
        if client:
            return client
        worker = request.headers.get(WORKER_HEADER)
        if worker:
            return f"worker {worker}"
    return str(request.remote or "")


class _BadRequestLog(logging.LoggerAdapter):  # type: ignore[type-arg]
    """What aiohttp's server logs about requests it could not parse or serve: one line, in
    nsqd's form, at WARNING at most, with the error's own text instead of a traceback."""

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        exc = kwargs.pop("exc_info", None)
        if exc is True:
            exc = sys.exc_info()[1]
        if isinstance(exc, BaseException):
            text = str(msg) % args if args else str(msg)
            text = text.replace("Error handling request", "bad request")
            msg, args = "HTTP: %s - %s", (text, _one_line(exc))
        if not self.logger.isEnabledFor(min(level, logging.WARNING)):
            return
        self.logger.log(min(level, logging.WARNING), msg, *args, **kwargs)

    def exception(self, msg: object, *args: object, **kwargs: Any) -> None:
        kwargs.setdefault("exc_info", True)
        self.log(logging.WARNING, msg, *args, **kwargs)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 200 else text[:200] + "..."


class Router:
    """Routes, dispatch and the request log line; subclasses add routes and hooks."""

    def __init__(self, logger: logging.Logger) -> None:
        self.routes: dict[str, Methods] = {}
        self._log = logger
        #: ``serve_on``'s socket and its address (nsqlookupd's, nsqadmin's API).
        self.address = ""
        self._web: web_server.Server | None = None
        self._server: asyncio.Server | SharedListener | None = None

    async def serve_on(self, loop: asyncio.AbstractEventLoop, address: str) -> None:
        """Serve these routes on ``address`` (``HTTP: listening on ...``)."""
        self._web = self.web_server(loop)
        self._server = await listen(loop, self._web, address)
        self.address = format_address(self._server.sockets[0])
        self._log.info("HTTP: listening on %s", self.address)

    async def close(self) -> None:
        """Stop ``serve_on``'s socket; requests under way get a second to finish."""
        if self._server is not None:
            self._log.info("HTTP: closing %s", self.address)
            self._server.close()
        if self._web is not None:
            await self._web.shutdown(1.0)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def add(self, method: str, path: str, kind: Kind, handler: Handler) -> None:
        self.routes.setdefault(path, {})[method] = (kind, handler)

    def web_server(self, loop: asyncio.AbstractEventLoop) -> web_server.Server:
        """aiohttp's low-level server for these routes, configured as nsqd behaves:

        - a body is what the client sent: ``Content-Encoding`` is not decoded (Go nsqd
          publishes it as it is, and inflating a small body to gigabytes would stall the loop);
        - a request aiohttp cannot parse is one line at WARNING, never a traceback.
        """
        return web_server.Server(
            self.handle,
            loop=loop,
            access_log=None,
            lingering_time=1.0,
            auto_decompress=False,
            logger=_BadRequestLog(self._log),
        )

    def add_pprof_routes(self, index_path: str) -> None:
        """Python stand-ins for Go's ``/debug/pprof`` pages."""
        add = self.add
        add("GET", index_path, "raw", text_handler(lambda r, p: debug.index()))
        add("GET", "/debug/pprof/cmdline", "raw", text_handler(lambda r, p: debug.cmdline()))
        for method in ("GET", "POST"):
            add(
                method,
                "/debug/pprof/symbol",
                "raw",
                text_handler(lambda r, p: debug.symbol(r.method)),
            )
        add("GET", "/debug/pprof/heap", "raw", text_handler(lambda r, p: debug.heap()))
        add("GET", "/debug/pprof/goroutine", "raw", text_handler(lambda r, p: debug.goroutine()))
        add("GET", "/debug/pprof/block", "raw", text_handler(lambda r, p: debug.block()))
        add(
            "GET",
            "/debug/pprof/threadcreate",
            "raw",
            text_handler(lambda r, p: debug.threadcreate()),
        )

    def find_route(self, path: str) -> Methods | None:
        """The methods served at ``path`` (subclasses add parameterised paths)."""
        return self.routes.get(path)

    def gate(self, request: BaseRequest) -> StreamResponse | None:
        """A response that pre-empts routing (nsqd's TLS-required 403), or None."""
        return None

    def log_level(self, request: BaseRequest) -> int:
        """The level of a request's log line (nsqd logs each at INFO)."""
        return logging.INFO

    async def handle(self, request: BaseRequest) -> StreamResponse:
        started = time.perf_counter()
        resp = await self.dispatch(request)
        elapsed = (time.perf_counter() - started) * 1e6
        self._log.log(
            self.log_level(request),
            "%d %s %s (%s) %.3fµs",
            resp.status,
            request.method,
            request.raw_path,
            peer(request),
            elapsed,
        )
        return resp

    async def dispatch(self, request: BaseRequest) -> StreamResponse:
        gated = self.gate(request)
        if gated is not None:
            return gated
        methods = self.find_route(request.path)
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
            if kind == "v1":
                return respond_v1(err.code, err.text, err.extra)
            return respond_plain(err.code, err.text)
        except Exception:
            self._log.exception("HTTP: internal error in %s %s", request.method, request.path)
            return respond_v1(500, "INTERNAL_ERROR")
        if isinstance(data, StreamResponse):  # a v1 route that streams (/topic/log)
            return data
        if kind == "v1":
            return respond_v1(200, data)
        if kind == "plain":
            return respond_plain(200, data)
        assert isinstance(data, StreamResponse)
        return data
