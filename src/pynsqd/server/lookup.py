"""nsqd's registration with nsqlookupd (``nsqd/lookup.go``, ``nsqd/lookup_peer.go``).

Theory of operation. Each ``--lookupd-tcp-address`` gets a ``LookupPeer``: one task that dials
(1 s timeout), sends the magic ``"  V1"`` and ``IDENTIFY``, then ``REGISTER``s every topic and
channel nsqd has at that moment, and from then on sends, one at a time with a 1 s deadline for
each response, the ``REGISTER``/``UNREGISTER`` notifications nsqd makes as topics and channels
come and go, and a ``PING`` every 15 s. Bytes on the wire are exactly go-nsq's commands.

Any failure (refused, timed out, garbage, a closed connection, which is noticed at once even when
idle) closes the connection; the peer dials again after a backoff that starts short and grows to
the ping interval, and re-registers everything on success. nsqd itself does better than Go here
only in timing: Go redials lazily at the next ping or notification. Notifications made while a
peer is disconnected are dropped, because the full registration on reconnect supersedes them.
Nothing here runs on the publish or consume path: a lookupd that is down, slow or mad costs
nsqd a task, never a blocked loop.

A topic created at run time asks every known lookupd (``GET /channels?topic=``) for the channels
other nodes have, and creates them (not ``#ephemeral`` ones), so that consumers of those channels
do not miss its first messages. nsqd blocks the publisher for this query; we create the topic at
once and the channels when the answers arrive. The window: messages published in between wait
in the topic (a topic with no channels keeps its messages), and are handed to every channel that
exists when the first one appears — so a consumer that subscribes to a new channel of the topic
during the query, before the pre-created ones exist, is the one case where a pre-created channel
misses those first messages.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast
from urllib.parse import quote

from .. import NSQD_VERSION
from ..internal import jsonbound
from ..internal.listener import is_unix_address, split_host_port
from ..internal.names import is_ephemeral, is_valid_name
from ..internal.waits import wait_set
from ..protocol.lookup import (
    MAGIC_V1,
    PING,
    ResponseReader,
    encode_identify,
    encode_register,
    encode_unregister,
)

if TYPE_CHECKING:
    from ..core.topic import Topic
    from ..options import Options


class LookupHost(Protocol):
    """What the registration needs of nsqd: its loop, options, address and topics."""

    loop: asyncio.AbstractEventLoop
    opts: Options
    tcp_address: str

    @property
    def topics(self) -> Mapping[str, Topic]: ...


log = logging.getLogger("pynsqd")


@dataclass
class LookupTimings:
    """nsqd's constants; not flags. Tests shorten them."""

    dial_timeout: float = 1.0
    io_timeout: float = 1.0  # each command's response (nsqd's 1 s read/write deadlines)
    ping_interval: float = 15.0
    reconnect_min: float = 0.25
    reconnect_max: float = 15.0
    #: How long a start waits for its first registration (``Lookup.settled``).
    settle_max: float = 5.0


class LookupPeerError(Exception):
    pass


class _PeerConnection(asyncio.Protocol):
    """The socket: responses in, futures out, in order."""

    def __init__(self, max_size: int, wake: asyncio.Event) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader = ResponseReader(max_size)
        self.waiting: collections.deque[asyncio.Future[bytes]] = collections.deque()
        self.lost = False
        self._wake = wake

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.reader.feed(data)
        try:
            responses = self.reader.responses()
        except ValueError as err:
            self._fail(LookupPeerError(str(err)))
            return
        for resp in responses:
            if not self.waiting:
                self._fail(LookupPeerError("unexpected response"))
                return
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_result(resp)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(LookupPeerError("connection closed"))

    def _fail(self, err: Exception) -> None:
        self.lost = True
        while self.waiting:
            fut = self.waiting.popleft()
            if not fut.done():
                fut.set_exception(err)
        if self.transport is not None:
            self.transport.close()
        self._wake.set()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class LookupPeer:
    def __init__(self, addr: str, lookup: Lookup) -> None:
        self.addr = addr
        self.lookup = lookup
        #: The lookupd's IDENTIFY answer: tcp_port, http_port, version, broadcast_address.
        self.info: dict[str, Any] = {}
        self.connected = False
        self._conn: _PeerConnection | None = None
        self._queue: collections.deque[bytes] = collections.deque()
        self._wake = asyncio.Event()
        self._closed = False
        #: Set once the first dial ended: registered (everything nsqd had then), or failed.
        self.settled = asyncio.Event()
        self._task = lookup.loop.create_task(self._run())

    def __repr__(self) -> str:
        return self.addr

    def notify(self, cmd: bytes) -> None:
        if self.connected:
            self._queue.append(cmd)
            self._wake.set()

    async def close(self) -> None:
        self._closed = True
        self.settled.set()
        self._wake.set()
        if self._conn is not None:
            self._conn.close()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    # -- the connection task ------------------------------------------------------------------

    async def _run(self) -> None:
        timings = self.lookup.timings
        delay = timings.reconnect_min
        while not self._closed:
            try:
                await self._connect()
                delay = timings.reconnect_min
                await self._serve()
            except asyncio.CancelledError:
                raise
            except (OSError, TimeoutError, LookupPeerError, ValueError) as err:
                log.error("LOOKUPD(%s): %s", self.addr, err or type(err).__name__)
            except Exception:
                log.exception("LOOKUPD(%s): unexpected error", self.addr)
            finally:
                self.settled.set()
                self._disconnect()
            if self._closed:
                break
            self._wake.clear()
            await wait_set(self._wake, delay)
            delay = min(delay * 2, timings.reconnect_max)

    def _disconnect(self) -> None:
        self.connected = False
        self._queue.clear()
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _connect(self) -> None:
        timings = self.lookup.timings
        host, port = split_host_port(self.addr)
        loop = self.lookup.loop
        self._wake.clear()
        try:
            _, conn = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _PeerConnection(self.lookup.max_response_size, self._wake), host, port
                ),
                timings.dial_timeout,
            )
        except TimeoutError:
            raise LookupPeerError(f"dial tcp {self.addr}: i/o timeout") from None
        self._conn = conn
        assert conn.transport is not None
        conn.transport.write(MAGIC_V1)
        identify = encode_identify(self.lookup.identify_data())
        resp = await self._command(identify)
        if resp == b"E_INVALID":
            raise LookupPeerError(f"lookupd returned {resp!r}")
        try:
            info = jsonbound.loads(resp)
        except ValueError:
            raise LookupPeerError(f"parsing response - {resp[:200]!r}") from None
        if not isinstance(info, dict):
            raise LookupPeerError(f"parsing response - {resp[:200]!r}")
        self.info = info
        # nsqd prints its peerInfo struct (%+v).
        log.info(
            "LOOKUPD(%s): peer info {TCPPort:%s HTTPPort:%s Version:%s BroadcastAddress:%s}",
            self.addr,
            info.get("tcp_port", 0),
            info.get("http_port", 0),
            info.get("version", ""),
            info.get("broadcast_address", ""),
        )
        if not info.get("broadcast_address"):
            log.error("LOOKUPD(%s): no broadcast address", self.addr)
        # From here on notifications are queued, after the full registration they supersede.
        self._queue = collections.deque(self.lookup.registrations())
        self.connected = True

    async def _serve(self) -> None:
        timings = self.lookup.timings
        loop = self.lookup.loop
        next_ping = loop.time() + timings.ping_interval
        while not self._closed:
            conn = self._conn
            if conn is None or conn.lost:
                raise LookupPeerError("connection closed")
            if self._queue:
                cmd = self._queue.popleft()
                log.info("LOOKUPD(%s): %s", self.addr, cmd.decode(errors="replace").strip())
                await self._command(cmd)
                continue
            self.settled.set()
            wait = next_ping - loop.time()
            if wait <= 0:
                log.debug("LOOKUPD(%s): sending heartbeat", self.addr)
                await self._command(PING)
                next_ping = loop.time() + timings.ping_interval
                continue
            self._wake.clear()
            await wait_set(self._wake, wait)

    async def _command(self, cmd: bytes) -> bytes:
        conn = self._conn
        if conn is None or conn.lost or conn.transport is None:
            raise LookupPeerError("connection closed")
        fut: asyncio.Future[bytes] = self.lookup.loop.create_future()
        conn.waiting.append(fut)
        conn.transport.write(cmd)
        try:
            return await asyncio.wait_for(fut, self.lookup.timings.io_timeout)
        except TimeoutError:
            name = cmd.split(b"\n", 1)[0].decode(errors="replace")
            raise LookupPeerError(f"{name} - read tcp {self.addr}: i/o timeout") from None


class Lookup:
    """All lookup peers of one nsqd, and the notifications nsqd makes to them."""

    def __init__(self, nsqd: LookupHost) -> None:
        self.nsqd = nsqd
        self.loop = nsqd.loop
        self.timings = LookupTimings()
        self.peers: dict[str, LookupPeer] = {}
        self.hostname = socket.gethostname()
        self.max_response_size = nsqd.opts.max_body_size
        self._fetches: set[asyncio.Task[None]] = set()  # channel queries and peer closes
        self._session: Any = None  # aiohttp.ClientSession, made on first use
        self._closed = False

    # -- peers ----------------------------------------------------------------------------------

    def set_addresses(self, addresses: list[str]) -> None:
        """Drop the peers no longer listed, add the new ones (``PUT /config/...``)."""
        if self._closed:
            return
        wanted = list(dict.fromkeys(addresses))
        for addr in list(self.peers):
            if addr not in wanted:
                log.info("LOOKUP(%s): removing peer", addr)
                task = self.loop.create_task(self.peers.pop(addr).close())
                self._fetches.add(task)  # keep a reference until it is done
                task.add_done_callback(self._fetches.discard)
        for addr in wanted:
            if addr not in self.peers:
                log.info("LOOKUP(%s): adding peer", addr)
                self.peers[addr] = LookupPeer(addr, self)

    def register(self, addresses: list[str], then: Callable[[], None]) -> None:
        """Register with ``addresses`` from now on; ``then`` once each first registration
        ended (``settled``)."""
        self.set_addresses(addresses)
        if not self.peers:
            then()
            return

        async def settle() -> None:
            await self.settled()
            if not self._closed:
                then()

        task = self.loop.create_task(settle())
        self._fetches.add(task)  # keep a reference until it is done
        task.add_done_callback(self._fetches.discard)

    async def settled(self) -> None:
        """Until every lookupd's first registration ended (done or failed; at most
        ``settle_max``): a node says it is ready only then (``GET /ping``), so that a client
        that starts at its first OK finds it at nsqlookupd."""
        waits = [p.settled.wait() for p in self.peers.values()]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), self.timings.settle_max)

    async def close(self) -> None:
        self._closed = True
        log.info("LOOKUP: closing")
        peers = list(self.peers.values())
        self.peers.clear()
        for task in list(self._fetches):
            task.cancel()
        await asyncio.gather(*(p.close() for p in peers), *self._fetches, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    # -- what nsqd tells lookupd ----------------------------------------------------------------

    def identify_data(self) -> dict[str, Any]:
        opts = self.nsqd.opts
        return {
            "version": NSQD_VERSION,
            "tcp_port": opts.broadcast_tcp_port or _port(self.nsqd.tcp_address),
            "http_port": opts.broadcast_http_port or _port(getattr(self.nsqd, "http_address", "")),
            "hostname": self.hostname,
            "broadcast_address": opts.broadcast_address,
            "topology_zone": opts.topology_zone,
            "topology_region": opts.topology_region,
        }

    def registrations(self) -> list[bytes]:
        """A topic with no channels as ``REGISTER <topic>``, else one per channel."""
        cmds: list[bytes] = []
        for topic in self.nsqd.topics.values():
            if topic.channels:
                cmds.extend(encode_register(topic.name, c) for c in topic.channels)
            else:
                cmds.append(encode_register(topic.name))
        return cmds

    def _notify(self, cmd: bytes) -> None:
        for peer in self.peers.values():
            peer.notify(cmd)

    def topic_created(self, topic: Topic) -> None:
        self._notify(encode_register(topic.name))

    def topic_deleted(self, topic: Topic) -> None:
        self._notify(encode_unregister(topic.name))

    def channel_created(self, topic: Topic, channel: str) -> None:
        self._notify(encode_register(topic.name, channel))

    def channel_deleted(self, topic: Topic, channel: str) -> None:
        self._notify(encode_unregister(topic.name, channel))

    # -- pre-creating a new topic's channels ----------------------------------------------------

    def http_addresses(self) -> list[str]:
        """``broadcast_address:http_port`` of every lookupd that has answered IDENTIFY."""
        out = []
        for peer in self.peers.values():
            host = peer.info.get("broadcast_address")
            port = peer.info.get("http_port")
            if isinstance(host, str) and host and isinstance(port, int):
                out.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        return out

    def fetch_channels(self, topic: Topic) -> None:
        """Ask the lookupds for the new topic's channels, without blocking anyone."""
        addresses = self.http_addresses()
        if not addresses or self._closed:
            return
        task = self.loop.create_task(self._fetch_channels(topic, addresses))
        self._fetches.add(task)
        task.add_done_callback(self._fetches.discard)

    async def _fetch_channels(self, topic: Topic, addresses: list[str]) -> None:
        results = await asyncio.gather(
            *(self._get_channels(addr, topic.name) for addr in addresses), return_exceptions=True
        )
        names: set[str] = set()
        errors = []
        for addr, result in zip(addresses, results, strict=True):
            if isinstance(result, BaseException):
                errors.append(f"{addr}: {result or type(result).__name__}")
            else:
                names.update(result)
        if errors and len(errors) == len(addresses):
            log.warning(
                "failed to query nsqlookupd for channels to pre-create for topic %s - %s",
                topic.name,
                "; ".join(errors),
            )
        if self.nsqd.topics.get(topic.name) is not topic or topic.exiting:
            return
        for name in sorted(names):
            if is_ephemeral(name):
                continue
            if not is_valid_name(name):
                log.warning("TOPIC(%s): lookupd channel %r is not valid", topic.name, name)
                continue
            topic.get_channel(name)

    async def _get_channels(self, addr: str, topic: str) -> list[str]:
        import aiohttp

        if self._session is None:
            opts = self.nsqd.opts
            timeout = aiohttp.ClientTimeout(
                total=opts.http_client_request_timeout, connect=opts.http_client_connect_timeout
            )
            self._session = aiohttp.ClientSession(timeout=timeout)
        url = f"http://{addr}/channels?topic={quote(topic)}"
        headers = {"Accept": "application/vnd.nsq; version=1.0"}
        async with self._session.get(url, headers=headers) as resp:
            if resp.status != 200:
                raise LookupPeerError(f"got response {resp.status} {resp.reason}")
            body = await resp.read()
        try:
            data = jsonbound.loads(body)
        except ValueError as err:
            raise LookupPeerError(f"parsing response - {err}") from None
        channels = data.get("channels") if isinstance(data, dict) else None
        if not isinstance(channels, list):
            raise LookupPeerError("no channels in the response")
        return [c for c in channels if isinstance(c, str)]


def _port(address: str) -> int:
    """A bound TCP address's port; 0 for a unix socket or none (as nsqd leaves it)."""
    if not address or is_unix_address(address):
        return 0
    return split_host_port(address)[1]


__all__ = ["Lookup", "LookupPeer", "LookupTimings"]
