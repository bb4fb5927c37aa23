"""HTTP between the workers of a node (``--workers``), over each worker's private admin socket.

Theory of operation. An admin call made to one worker is made here, then on every other worker,
and answered once with this worker's answer (``fanned``; a worker killed while it held the call
is asked again: admin calls are idempotent). A call about a topic's log is answered by the
worker whose partition it names (``routed``: ``partition=<node id>``, each worker's log of a
retained topic being a partition named by its node id; without it, ``/topic/offsets`` is every
worker's answer in one, a rewind or a channel made at a time is made in every partition, and
an offset alone is refused: ``PARTITION_REQUIRED``), or, for a topic one worker keeps (a
bounded one), by that worker; on a replicated node, where every worker is a member of the
cluster, a call about another node's partition by the worker holding a copy, and a call about
the cluster by the member it is about (``on_member``, ``members.py``; a follower's fetch
stream is a websocket, passed on both ways); the client's
request is passed on and its answer streamed back (``proxy``). ``/stats``, ``/metrics`` and
``/ping`` answer for the node: every worker's, summed (``combine_stats``, ``peer_answers``,
``unhealthy_peers``). A request another worker made carries ``WORKER_HEADER`` and is made here
alone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ...http.api import BODY_READ, read_body
from ...http.replay import partition_id
from ...http.stats import merge_stats
from ...internal.httpapi import HTTPError
from ...internal.router import CLIENT_HEADER, WORKER_HEADER
from ...internal.router import peer as client_address
from .members import Members

if TYPE_CHECKING:
    from aiohttp import ClientSession
    from aiohttp.web import StreamResponse
    from aiohttp.web_request import BaseRequest

    from ...options import Options

log = logging.getLogger("pynsqd")

#: An HTTP request one worker makes of another: made there alone, not again on every worker.
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
_WS_HOP_HEADERS = _HOP_HEADERS | {"upgrade"}
#: Headers only a worker sets (``internal/router.py``): a client's are never passed on.
_PRIVATE_HEADERS = frozenset({WORKER_HEADER.lower(), CLIENT_HEADER.lower()})


def _passed_on(request: BaseRequest) -> dict[str, str]:
    """A client's request's headers as passed on to another worker: none of one connection's,
    none only a worker sets, and the client's address for the other worker's log line."""
    headers = {
        k: v
        for k, v in request.headers.items()
        if k.lower() not in _HOP_HEADERS and k.lower() not in _PRIVATE_HEADERS
    }
    headers[CLIENT_HEADER] = client_address(request)
    return headers


class AdminLinks:
    """This worker's HTTP calls to the others (``Workers.admin``)."""

    def __init__(
        self,
        opts: Options,
        index: int,
        admins: list[str],
        *,
        clustered: bool,
        kept: Callable[[str], int | None] = lambda _: None,
        storage: str = "",
    ) -> None:
        self._opts = opts
        self.index = index
        #: Every worker's admin socket path, by index.
        self._admins = admins
        #: A replicated node (``--etcd-endpoints``): each worker is a member of the cluster.
        self.clustered = clustered
        self.members = Members(self, len(admins))
        #: The worker that keeps a topic this worker has, when another (``Topic.kept_by``).
        self.kept = kept
        #: The node's storage id: what ``/topic/offsets`` names its partitions by.
        self.storage = storage
        #: The node's first node id: worker ``i``'s partitions are named ``base + i``.
        self.base = (opts.node_id - index) % 1024
        #: Topics a peer's fan-out is making here: not announced back.
        self.quiet: set[str] = set()
        self._sessions: dict[int, ClientSession] = {}

    @property
    def is_lead(self) -> bool:
        return self.index == 0

    def peers(self) -> list[int]:
        return [i for i in range(len(self._admins)) if i != self.index]

    def _session(self, peer: int) -> ClientSession:
        session = self._sessions.get(peer)
        if session is None or session.closed:
            import aiohttp

            session = aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=self._admins[peer]),
                timeout=aiohttp.ClientTimeout(total=FAN_OUT_TIMEOUT),
            )
            self._sessions[peer] = session
        return session

    async def _ask(
        self,
        peer: int,
        method: str,
        path_qs: str,
        body: bytes,
        headers: Mapping[str, str] | None = None,
        *,
        again: bool = False,
    ) -> tuple[int, bytes]:
        """Status 0: no answer in ``FAN_OUT_TIMEOUT``; ``DROPPED``: the connection went
        without an answer (the worker was killed, or its socket is gone). ``headers``: the
        client's, passed on (its auth secret). ``again``: an admin call made of a peer until
        it answers (``FAN_OUT_ATTEMPTS``): one killed while it held the call (which it may or
        may not have made) is asked again, and the asking waits in its socket, which the
        supervisor holds, for the worker started in its place; that one has read its state
        from disk by then, and makes the call on it. Admin calls are idempotent."""
        import aiohttp

        text = b""
        for attempt in range(FAN_OUT_ATTEMPTS if again else 1):
            if attempt:
                log.warning(
                    "WORKERS: %s %s on worker %d dropped (%s); asking again",
                    method,
                    path_qs,
                    peer,
                    text[:200].decode(errors="replace"),
                )
            try:
                async with self._session(peer).request(
                    method,
                    "http://worker" + path_qs,
                    data=body or None,
                    headers={**(headers or {}), WORKER_HEADER: str(self.index)},
                ) as resp:
                    return resp.status, await resp.read()
            except TimeoutError as err:
                return 0, str(err).encode() or b"timed out"
            except (aiohttp.ClientError, OSError) as err:
                text = str(err).encode()
        return DROPPED, text

    async def fan_out(self, method: str, path_qs: str, body: bytes) -> None:
        """Make the same call of every other worker; a worker that fails it is logged (one
        being restarted reads the change from its own disk or its peers' announcements)."""
        peers = self.peers()
        answers = await asyncio.gather(
            *(self._ask(p, method, path_qs, body, again=True) for p in peers)
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
        return isinstance(sockname, str) and sockname == self._admins[self.index]

    async def proxy(self, peer: int, request: BaseRequest, body: bytes | None) -> StreamResponse:
        """The client's request made of worker ``peer`` (the keeper of its topic's log), its
        answer streamed back as it comes: status, body and nsqd's headers. ``body``: the
        request's body when it was read already."""
        import aiohttp
        from aiohttp.web import StreamResponse

        if body is None:
            body = b""
            if request.can_read_body:
                read = await read_body(request, self._opts.max_body_size)
                if read is None:
                    raise HTTPError(413, "BODY_TOO_BIG")
                body = read
        headers = _passed_on(request)
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
        return HTTPError(503, "WORKER_UNAVAILABLE", {"reason": f"worker {peer} did not answer"})

    def partitions(self) -> list[int]:
        """This node's partition names (node ids), by worker."""
        return [(self.base + i) % 1024 for i in range(len(self._admins))]

    def worker_of(self, partition: int) -> int:
        """The worker whose partition ``partition=`` names (a node id, checked by
        ``http/replay.partition_id``); 404 ``PARTITION_NOT_FOUND`` for one that is not this
        node's."""
        index = (partition - self.base) % 1024
        if index >= len(self._admins):
            raise HTTPError(404, "PARTITION_NOT_FOUND", {"partitions": self.partitions()})
        return index

    def routed(
        self, handler: Callable[[BaseRequest, Any], Awaitable[Any]]
    ) -> Callable[[BaseRequest, Any], Awaitable[Any]]:
        """A call about a topic's log (offsets, reads, rewinds, a reader's commit, retention, a
        channel made at an offset): this module's docstring."""

        async def handler_by_partition(request: BaseRequest, params: Any) -> Any:
            query = request.query
            topic = query.get("topic", "")
            path = request.path
            if self.from_worker(request) or (
                path == "/channel/create" and not ("offset" in query or "timestamp" in query)
            ):
                return await handler(request, params)  # a plain channel: made everywhere
            # A topic one worker keeps (a bounded one): its keeper answers.
            keeper = self.kept(topic) if topic else None
            if keeper is not None:
                return await self.proxy(keeper, request, None)
            if path == "/topic/retention":
                return await handler(request, params)  # every partition's (fanned)
            partition = partition_id(params)
            if self.clustered and (partition is not None or path == "/topic/offsets"):
                # Another node's partition (a copy some worker holds), the members' answers.
                return await self.members.routed(request, params, handler)
            if partition is not None:
                worker = self.worker_of(partition)
                if worker == self.index:
                    return await handler(request, params)
                return await self.proxy(worker, request, None)
            if path == "/topic/offsets" or "timestamp" in query:
                return await self.every_partition(request)
            raise HTTPError(
                400,
                "PARTITION_REQUIRED",
                {"reason": "an offset names one partition", "partitions": self.partitions()},
            )

        return handler_by_partition

    async def every_partition(self, request: BaseRequest) -> Any:
        """A call without ``partition=`` made of every worker's partition: ``/topic/offsets``
        answers with each (``node_offsets``), a rewind or a channel made at a time with what
        each put back, summed. A worker's refusal is the answer (a 404 only if every worker
        gave one: a topic some worker has not made yet)."""
        body = b""
        if request.can_read_body:
            read = await read_body(request, self._opts.max_body_size)
            body = read or b""
        headers = _passed_on(request)
        calls = []
        for i, partition in enumerate(self.partitions()):
            query = dict(request.query, partition=str(partition))
            path_qs = request.path + "?" + urllib.parse.urlencode(query)
            calls.append(self._ask(i, request.method, path_qs, body, headers, again=True))
        answers = await asyncio.gather(*calls)
        docs: list[tuple[int, dict[str, Any]]] = []
        refusals: list[tuple[int, bytes]] = []
        for i, (status, text) in enumerate(answers):
            if status == 200:
                docs.append(((self.base + i) % 1024, json.loads(text) if text else {}))
            elif status <= 0:
                raise HTTPError(503, "WORKER_UNAVAILABLE", {"reason": f"worker {i} did not answer"})
            else:
                refusals.append((status, text))
        real = [r for r in refusals if r[0] != 404]
        if real or not docs:
            status, text = (real or refusals)[0]
            doc = json.loads(text) if text.startswith(b"{") else {"message": text.decode()}
            raise HTTPError(status, str(doc.pop("message", "")), doc)
        if request.path == "/topic/offsets":
            return node_offsets(docs, self.base, self.storage)
        return {
            "count": sum(int(d.get("count", 0)) for _, d in docs),
            "partitions": [{"partition": p, **d} for p, d in docs],
        }

    def on_member(
        self, handler: Callable[[BaseRequest, Any], Awaitable[Any]]
    ) -> Callable[[BaseRequest, Any], Awaitable[Any]]:
        """A call about the cluster (``/info``, ``/topic/replication``, a follower's fetch
        stream ``/topic/replicate``) answered by the member it is about (``members.py``)."""

        async def handler_on_member(request: BaseRequest, params: Any) -> Any:
            if not self.clustered or self.from_worker(request):
                return await handler(request, params)
            return await self.members.on_member(request, params, handler)

        return handler_on_member

    async def ask_alone(self, peer: int, path_qs: str, request: BaseRequest) -> tuple[int, bytes]:
        """``GET path_qs`` of worker ``peer``, answered there alone, with the client's
        headers (its auth secret)."""
        return await self._ask(peer, "GET", path_qs, b"", _passed_on(request))

    async def proxy_websocket(self, peer: int, request: BaseRequest) -> Any:
        """A websocket (a follower's fetch stream) passed on to worker ``peer``: opened there
        first (a refusal is answered with its status), then each message passed on both
        ways until either side closes."""
        import aiohttp
        from aiohttp.web import WebSocketResponse

        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in _WS_HOP_HEADERS
            and not k.lower().startswith("sec-websocket")
            and k.lower() not in _PRIVATE_HEADERS  # a client's are never passed on
        }
        headers[CLIENT_HEADER] = client_address(request)
        # A session of its own: the fan-out's (``_session``) bounds a whole call to 30 s.
        session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=self._admins[peer]),
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
                    {"reason": f"worker {peer}, a member of the cluster, refused it"},
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
                self.quiet.add(topic)
                try:
                    return await handler(request, params)
                finally:
                    self.quiet.discard(topic)
            body = b""
            if request.can_read_body:
                read = await read_body(request, self._opts.max_msg_size)
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

    async def close(self) -> None:
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()


#: A partition's fields in ``node_offsets`` (each worker's own ``/topic/offsets``), summed
#: at the top for the node.
_SUMMED = ("earliest", "latest", "bytes", "segments")


def node_offsets(
    docs: Sequence[tuple[int, Mapping[str, Any]]], base: int, cluster: str
) -> dict[str, Any]:
    """The node's ``/topic/offsets`` from each worker's: every partition with its offsets
    (``partitions``, each named by its worker's node id, as a replicated topic's answer names
    its partitions, so a reader plans one range per partition), and at the top their sums and
    the settings they share. ``cluster`` names the node (its storage id)."""
    first = docs[0][1]
    out: dict[str, Any] = {k: v for k, v in first.items() if k not in _SUMMED}
    for key in _SUMMED:
        out[key] = sum(int(d.get(key, 0)) for _, d in docs)
    out.pop("offset", None)
    out["cluster"] = out["storage_id"] = cluster or str(first.get("storage_id", ""))
    out["node_id"] = base
    out["partitions"] = [
        {
            "partition": partition,
            "role": "leader",
            "epoch": 0,
            "isr": [base],
            "earliest": d["earliest"],
            "committed": d["latest"],
            "latest": d["latest"],
            "bytes": d.get("bytes", 0),
            "storage_id": d.get("storage_id", ""),
            **({"offset": d["offset"]} if "offset" in d else {}),
        }
        for partition, d in docs
    ]
    out["nodes"] = {}
    return out
