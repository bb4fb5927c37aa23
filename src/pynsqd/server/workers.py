"""One worker of ``nsqd --workers N``: its share of the host's sockets and its peers.

Theory of operation. The supervisor (``server/supervisor.py``) binds the node's addresses once
(``--tcp-address``, ``--http-address``, ``--https-address``) and each worker's two private unix
sockets (``<data-path>/worker-<i>/link.sock`` for links, ``admin.sock`` for HTTP between
workers), then starts the workers with those descriptors and a ``WorkerSpec`` in the
environment. Every worker accepts on the shared sockets, one connection per wake-up, so
connections spread over the workers that are free to take them, and a worker that dies leaves
the listening socket open: what arrives while it restarts waits in the kernel's queue.

A worker is an nsqd of its own (its data directory, node id, topics, channels) with three
additions, all here or in ``server/relay.py``: a channel with consumers pulls what the other
workers' copies hold (relay), an admin call made to one worker is made to every worker and
answered once (``fanned``), and ``/stats`` answers for the node (``combine_stats``). A topic
made by a publish on one worker is made on the others too (so nsqlookupd, which only worker 0
registers with, and ``/stats`` list it); a channel made by a SUB is made on the others before
the SUB is answered (``channel_created``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import mmap
import os
import signal
import socket
import ssl
import struct
import urllib.parse
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from ..core.lending import Lending
from ..http.api import BODY_READ, read_body
from ..http.stats import merge_stats
from ..internal.httpapi import HTTPError
from ..internal.listener import SharedListener
from ..internal.names import is_ephemeral
from .forward import Done, Forwarder
from .relay import Relay

if TYPE_CHECKING:
    from aiohttp import ClientSession
    from aiohttp.web import StreamResponse
    from aiohttp.web_request import BaseRequest

    from ..core.channel import Channel
    from ..core.topic import Topic
    from ..options import Options


class WorkerNode(Protocol):
    """What a worker's part needs of its nsqd (``server/nsqd.NSQD``)."""

    opts: Options
    loop: asyncio.AbstractEventLoop

    @property
    def topics(self) -> dict[str, Topic]: ...


log = logging.getLogger("pynsqd")

#: An HTTP request one worker makes of another: made there alone, not again on every worker.
WORKER_HEADER = "X-Pynsqd-Worker"
#: Headers of one connection, not passed on by ``Workers.proxy``.
_HOP_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "keep-alive", "date"}
)
FAN_OUT_TIMEOUT = 30.0
#: ``Workers._ask``'s status for a call whose connection went without an answer.
DROPPED = -1
#: How many times an admin call is made of a peer whose connection drops each time.
FAN_OUT_ATTEMPTS = 3
#: ... and of a websocket's opening, passed on by ``Workers.proxy_websocket``.
_WS_HOP_HEADERS = _HOP_HEADERS | {"upgrade", WORKER_HEADER.lower()}


@dataclasses.dataclass
class WorkerSpec:
    """What the supervisor tells a worker (in ``PYNSQD_WORKER``, JSON)."""

    index: int
    count: int
    #: Inherited descriptors: tcp, http, https (shared); link, admin (this worker's unix
    #: sockets); alive (read end of a pipe the supervisor holds open); ready (write end).
    fds: dict[str, int]
    #: Every worker's link and admin socket paths, by index.
    links: list[str]
    admins: list[str]
    #: A file of ``count`` int64: each worker's client connections (``ConnectionCounts``).
    counts: str = ""
    #: The supervisor's start (unix seconds): the node's ``start_time`` in /info and /stats.
    started: int = 0
    #: The node's storage id (``<data-path>/cluster.id``), in /info; each worker's own data
    #: directory has its own, which its logs' answers carry (``/topic/offsets``).
    storage: str = ""

    ENV = "PYNSQD_WORKER"

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls) -> WorkerSpec | None:
        raw = os.environ.get(cls.ENV)
        if not raw:
            return None
        return cls(**json.loads(raw))


def worker_options(opts: Options, spec: WorkerSpec) -> None:
    """A worker's own options: its data directory, node id and log prefix."""
    base = opts.data_path or os.getcwd()
    opts.data_path = os.path.join(base, f"worker-{spec.index}")
    opts.node_id = (opts.node_id + spec.index) % 1024
    prefix = opts.log_prefix
    bare = prefix.rstrip()
    if bare.endswith("]"):  # "[nsqd] " -> "[nsqd w1] "
        opts.log_prefix = f"{bare[:-1]} w{spec.index}]{prefix[len(bare) :]}"
    else:
        opts.log_prefix = f"{prefix}w{spec.index} "


class ConnectionCounts:
    """Each worker's client connections, in a small file every worker maps: the supervisor
    makes it (every slot ``DOWN``), a worker writes its own slot, reads the others' to decide
    whether to accept (``Workers.admit``), and the supervisor writes ``DOWN`` when one exits."""

    DOWN = (1 << 62) - 1
    _SLOT = struct.Struct("<q")

    def __init__(self, path: str, count: int) -> None:
        self.count = count
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), count * 8)

    @classmethod
    def create(cls, path: str, count: int) -> ConnectionCounts:
        with open(path, "wb") as f:
            f.write(cls._SLOT.pack(cls.DOWN) * count)
        return cls(path, count)

    def set(self, index: int, value: int) -> None:
        self._SLOT.pack_into(self._map, index * 8, value)

    def least_but(self, index: int) -> int:
        """The fewest connections of the other workers (``DOWN`` when none is up)."""
        unpack = self._SLOT.unpack_from
        return min(
            (unpack(self._map, i * 8)[0] for i in range(self.count) if i != index),
            default=self.DOWN,
        )

    def close(self) -> None:
        self._map.close()


def inherited_socket(fd: int) -> socket.socket:
    return socket.socket(fileno=fd)


class Workers:
    """This worker's view of the others (``nsqd.workers``; None without ``--workers``)."""

    def __init__(self, nsqd: WorkerNode, spec: WorkerSpec) -> None:
        self.nsqd = nsqd
        self.spec = spec
        self.index = spec.index
        self.opts = nsqd.opts
        self.loop = nsqd.loop
        #: Topics a peer's fan-out is making here: not announced back.
        self._quiet: set[str] = set()
        #: Channels made here being made on the other workers (``channel_created``).
        self._made: dict[tuple[str, str], asyncio.Future[None]] = {}
        self._sessions: dict[int, ClientSession] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._alive_fd = spec.fds.get("alive", -1)
        self._clients = 0
        self._counts = ConnectionCounts(spec.counts, spec.count) if spec.counts else None
        if self._counts is not None:
            self._counts.set(self.index, 0)
        self.forwarder = Forwarder(self)
        #: The sockets this worker accepts on (its copies of the supervisor's).
        self._listeners: list[SharedListener] = []

    @property
    def is_lead(self) -> bool:
        """Worker 0 registers the node with nsqlookupd."""
        return self.index == 0

    def peers(self) -> list[int]:
        return [i for i in range(self.spec.count) if i != self.index]

    def link_path(self, peer: int) -> str:
        return self.spec.links[peer]

    # -- retained topics: one worker keeps a topic's log ----------------------------------

    @property
    def clustered(self) -> bool:
        """A replicated node (``--etcd-endpoints``): worker 0 is its member of the cluster."""
        return bool(self.opts.etcd_endpoints)

    def log_worker(self, topic: str) -> int:
        """The worker that keeps ``topic``'s log when it retains one: its offsets, rewinds,
        dedup index and retention are one log's, as with one process. On a replicated node
        worker 0, the cluster's member, keeps them all: any retained topic may be replicated
        (its settings are in etcd, which only worker 0 reads), and its partition is the
        node's one log of it."""
        if self.clustered:
            return 0
        return zlib.crc32(topic.encode()) % self.spec.count

    def elsewhere(self, topic: str) -> int | None:
        """``log_worker`` when it is another worker (None: this one)."""
        keeper = self.log_worker(topic)
        return None if keeper == self.index else keeper

    def forward(self, peer: int, command: bytes, done: Done) -> None:
        self.forwarder.send(peer, command, done)

    # -- sockets --------------------------------------------------------------------------

    def listener(
        self,
        name: str,
        factory: Callable[[], asyncio.BaseProtocol],
        ssl_context: ssl.SSLContext | None = None,
    ) -> SharedListener | None:
        fd = self.spec.fds.get(name)
        if fd is None:
            return None
        # The node's TCP port: a worker with more than its share of clients lets the others
        # take the next one (HTTP's connections are short-lived: taken as they come).
        admit = self.admit if name == "tcp" and self._counts is not None else None
        listener = SharedListener(self.loop, inherited_socket(fd), factory, ssl_context, admit)
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

    def started(self) -> None:
        """Serving: tell the supervisor, and stop when it goes (its end of a pipe closes)."""
        ready = self.spec.fds.get("ready")
        if ready is not None:
            with contextlib.suppress(OSError):
                os.write(ready, b"%d\n" % self.index)
        if self._alive_fd >= 0:
            self.loop.add_reader(self._alive_fd, self._supervisor_gone)

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
        if name in self._quiet:
            return
        self._spawn(self.fan_out("POST", "/topic/create?topic=" + urllib.parse.quote(name), b""))

    def channel_created(self, topic: str, channel: str) -> None:
        """A channel made here (a SUB, a link's SUB) is made on every other worker, so that
        what is published through any of them after the SUB's OK is the channel's; the SUB
        waits for it (``channel_everywhere``). An #ephemeral channel reaches the others
        through the links alone (made everywhere, it would outlive its consumers there)."""
        if topic in self._quiet or is_ephemeral(channel):
            return
        key = (topic, channel)
        done: asyncio.Future[None] = self.loop.create_future()
        self._made[key] = done
        query = urllib.parse.urlencode({"topic": topic, "channel": channel})

        async def announce() -> None:
            try:
                await asyncio.wait_for(self.fan_out("POST", f"/channel/create?{query}", b""), 5.0)
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

    def channel_everywhere(self, topic: str, channel: str) -> asyncio.Future[None] | None:
        return self._made.get((topic, channel))

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = self.loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- HTTP between workers -------------------------------------------------------------

    def _session(self, peer: int) -> ClientSession:
        session = self._sessions.get(peer)
        if session is None or session.closed:
            import aiohttp

            session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self.spec.admins[peer]),
                timeout=aiohttp.ClientTimeout(total=FAN_OUT_TIMEOUT),
            )
            self._sessions[peer] = session
        return session

    async def _ask(self, peer: int, method: str, path_qs: str, body: bytes) -> tuple[int, bytes]:
        """Status 0: no answer in ``FAN_OUT_TIMEOUT``; ``DROPPED``: the connection went
        without an answer (the worker was killed, or its socket is gone)."""
        import aiohttp

        try:
            async with self._session(peer).request(
                method,
                "http://worker" + path_qs,
                data=body or None,
                headers={WORKER_HEADER: str(self.index)},
            ) as resp:
                return resp.status, await resp.read()
        except TimeoutError as err:
            return 0, str(err).encode() or b"timed out"
        except (aiohttp.ClientError, OSError) as err:
            return DROPPED, str(err).encode()

    async def _ask_again_if_dropped(
        self, peer: int, method: str, path_qs: str, body: bytes
    ) -> tuple[int, bytes]:
        """An admin call made of a peer until it answers: one killed while it held the call
        (which it may or may not have made) is asked again, and the asking waits in its socket,
        which the supervisor holds, for the worker started in its place; that one has read its
        state from disk by then, and makes the call on it. Admin calls are idempotent."""
        status, text = await self._ask(peer, method, path_qs, body)
        for _ in range(FAN_OUT_ATTEMPTS - 1):
            if status != DROPPED:
                break
            log.warning(
                "WORKERS: %s %s on worker %d dropped (%s); asking again",
                method,
                path_qs,
                peer,
                text[:200].decode(errors="replace"),
            )
            status, text = await self._ask(peer, method, path_qs, body)
        return status, text

    async def fan_out(self, method: str, path_qs: str, body: bytes) -> None:
        """Make the same call of every other worker; a worker that fails it is logged (one
        being restarted reads the change from its own disk or its peers' announcements)."""
        peers = self.peers()
        answers = await asyncio.gather(
            *(self._ask_again_if_dropped(p, method, path_qs, body) for p in peers)
        )
        for peer, (status, text) in zip(peers, answers, strict=True):
            if status <= 0 or status >= 500:
                log.warning(
                    "WORKERS: %s %s on worker %d failed - %s",
                    method,
                    path_qs,
                    peer,
                    text[:200].decode(errors="replace") or status,
                )

    def from_worker(self, request: BaseRequest) -> bool:
        """A call another worker made (over this worker's private admin socket)."""
        return WORKER_HEADER in request.headers and self.on_admin_socket(request)

    def on_admin_socket(self, request: BaseRequest) -> bool:
        """A request over this worker's private admin socket (another worker's, or one it
        passed on for a client: ``proxy``)."""
        transport = request.transport
        sockname = transport.get_extra_info("sockname") if transport is not None else None
        return isinstance(sockname, str) and sockname == self.spec.admins[self.index]

    async def proxy(self, peer: int, request: BaseRequest, body: bytes | None) -> StreamResponse:
        """The client's request made of worker ``peer`` (the keeper of its topic's log), its
        answer streamed back as it comes: status, body and nsqd's headers. ``body``: the
        request's body when it was read already."""
        import aiohttp
        from aiohttp.web import StreamResponse

        if body is None:
            body = b""
            if request.can_read_body:
                read = await read_body(request, self.opts.max_body_size)
                if read is None:
                    raise HTTPError(413, "BODY_TOO_BIG")
                body = read
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in _HOP_HEADERS and k != WORKER_HEADER
        }
        try:
            async with self._session(peer).request(
                request.method, "http://worker" + request.path_qs, data=body, headers=headers
            ) as answer:
                resp = StreamResponse(status=answer.status, reason=answer.reason)
                for k, v in answer.headers.items():
                    if k.lower() not in _HOP_HEADERS and k.lower() != "server":
                        resp.headers[k] = v
                if answer.content_length is not None:
                    resp.content_length = answer.content_length
                await resp.prepare(request)
                async for chunk in answer.content.iter_chunked(1 << 16):
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except (TimeoutError, aiohttp.ClientError, OSError) as err:
            raise self._unavailable(peer, request, err) from err

    def _unavailable(self, peer: int, request: BaseRequest, err: Exception) -> HTTPError:
        """A call passed on to ``peer`` that got no answer: logged, and 503 naming it."""
        log.warning("WORKERS: %s on worker %d failed - %s", request.path, peer, err)
        role = "the node's member of the cluster" if self.clustered else "which keeps its log"
        return HTTPError(
            503, "WORKER_UNAVAILABLE", {"reason": f"worker {peer}, {role}, did not answer"}
        )

    def routed(
        self, handler: Callable[[BaseRequest, Any], Awaitable[Any]]
    ) -> Callable[[BaseRequest, Any], Awaitable[Any]]:
        """A call about a topic's log (offsets, reads, rewinds, retention, a channel made at
        an offset) answered by the worker that keeps it (``log_worker``)."""

        async def handler_on_the_keeper(request: BaseRequest, params: Any) -> Any:
            query = request.query
            topic = query.get("topic", "")
            if request.path == "/channel/create" and not (
                "offset" in query or "timestamp" in query
            ):
                return await handler(request, params)  # a plain channel: made everywhere
            keeper = self.elsewhere(topic) if topic else None
            if keeper is None or self.from_worker(request):
                return await handler(request, params)
            return await self.proxy(keeper, request, None)

        return handler_on_the_keeper

    def on_member(
        self, handler: Callable[[BaseRequest, Any], Awaitable[Any]]
    ) -> Callable[[BaseRequest, Any], Awaitable[Any]]:
        """A call about the cluster (``/info``, ``/topic/replication``, a follower's fetch
        stream ``/topic/replicate``) answered by worker 0, the node's member of it."""

        async def handler_on_worker_0(request: BaseRequest, params: Any) -> Any:
            if self.is_lead or not self.clustered or self.from_worker(request):
                return await handler(request, params)
            if request.headers.get("Upgrade", "").lower() == "websocket":
                return await self.proxy_websocket(0, request)
            return await self.proxy(0, request, None)

        return handler_on_worker_0

    async def proxy_websocket(self, peer: int, request: BaseRequest) -> Any:
        """A websocket (a follower's fetch stream) passed on to worker ``peer``: opened there
        first (a refusal is answered with its status), then each message passed on both
        ways until either side closes."""
        import aiohttp
        from aiohttp.web import WebSocketResponse

        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in _WS_HOP_HEADERS and not k.lower().startswith("sec-websocket")
        }
        # A session of its own: the fan-out's (``_session``) bounds a whole call to 30 s.
        session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self.spec.admins[peer]),
            timeout=aiohttp.ClientTimeout(total=None, connect=FAN_OUT_TIMEOUT),
        )
        try:
            try:
                upstream = await session.ws_connect(
                    "http://worker" + request.path_qs,
                    headers=headers,
                    max_msg_size=0,
                    autoping=True,
                    compress=0,
                )
            except aiohttp.WSServerHandshakeError as err:
                raise HTTPError(
                    err.status,
                    "WEBSOCKET_REFUSED",
                    {"reason": f"worker {peer}, the node's member of the cluster, refused it"},
                ) from err
            except (TimeoutError, aiohttp.ClientError, OSError) as err:
                raise self._unavailable(peer, request, err) from err
            ws = WebSocketResponse(max_msg_size=0, autoping=True, compress=False, timeout=1.0)
            try:
                await ws.prepare(request)
            except ConnectionError:
                await upstream.close()
                return ws

            async def pump(src: Any, dst: Any) -> None:
                async for msg in src:
                    if msg.type is aiohttp.WSMsgType.BINARY:
                        await dst.send_bytes(msg.data)
                    elif msg.type is aiohttp.WSMsgType.TEXT:
                        await dst.send_str(msg.data)
                    else:
                        break

            ways = [
                asyncio.ensure_future(pump(ws, upstream)),
                asyncio.ensure_future(pump(upstream, ws)),
            ]
            try:
                await asyncio.wait(ways, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for way in ways:
                    way.cancel()
                await asyncio.gather(*ways, return_exceptions=True)
                await upstream.close()
                await ws.close()
            return ws
        finally:
            await session.close()

    def fanned(
        self, handler: Callable[[BaseRequest, Any], Awaitable[Any]]
    ) -> Callable[[BaseRequest, Any], Awaitable[Any]]:
        """An admin handler made on this worker, then on every other, answered once with
        this worker's answer (nsqd's status codes: a refusal here is not fanned out)."""

        async def handler_on_every_worker(request: BaseRequest, params: Any) -> Any:
            if self.from_worker(request):
                topic = request.query.get("topic", "")
                self._quiet.add(topic)
                try:
                    return await handler(request, params)
                finally:
                    self._quiet.discard(topic)
            body = b""
            if request.can_read_body:
                read = await read_body(request, self.opts.max_msg_size)
                if read is None:
                    raise HTTPError(413, "INVALID_VALUE")
                body = request[BODY_READ] = read  # the handler reads it from there
            result = await handler(request, params)
            await self.fan_out(request.method, request.path_qs, body)
            return result

        return handler_on_every_worker

    async def peer_answers(self, request: BaseRequest, path_qs: str) -> list[bytes] | None:
        if self.from_worker(request):
            return None
        peers = self.peers()
        answers = await asyncio.gather(*(self._ask(p, "GET", path_qs, b"") for p in peers))
        out = []
        for peer, (status, text) in zip(peers, answers, strict=True):
            if status != 200:
                log.warning(
                    "WORKERS: %s of worker %d failed (%s)",
                    path_qs,
                    peer,
                    status if status > 0 else text,
                )
                continue
            out.append(text)
        return out

    async def unhealthy_peers(self, request: BaseRequest) -> list[tuple[int, str]]:
        """``/ping`` for the node: every other worker that says it is unhealthy (a 500 and
        its ``NOK - ...`` line). One that does not answer (restarting) is not counted: the
        others take its connections meanwhile."""
        if self.from_worker(request):
            return []
        peers = self.peers()
        answers = await asyncio.gather(*(self._ask(p, "GET", "/ping", b"") for p in peers))
        return [
            (peer, text.decode(errors="replace"))
            for peer, (status, text) in zip(peers, answers, strict=True)
            if status == 500
        ]

    async def combine_stats(
        self,
        request: BaseRequest,
        topics: list[dict[str, Any]] | None,
        producers: list[dict[str, Any]] | None,
    ) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
        """This worker's /stats with every other worker's: the node's."""
        if self.from_worker(request):
            return topics, producers
        query = dict(request.query)
        query["format"] = "json"
        query["include_mem"] = "false"
        path_qs = "/stats?" + urllib.parse.urlencode(query)
        peers = self.peers()
        answers = await asyncio.gather(*(self._ask(p, "GET", path_qs, b"") for p in peers))
        parts: list[tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]] = [
            (topics, producers)
        ]
        for peer, (status, text) in zip(peers, answers, strict=True):
            if status != 200:
                log.warning(
                    "WORKERS: /stats of worker %d failed (%s)", peer, status if status > 0 else text
                )
                continue
            data = json.loads(text)
            parts.append((data.get("topics"), data.get("producers")))
        return merge_stats(parts)

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
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
