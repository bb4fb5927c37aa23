"""A channel's pull from the other workers (``--workers``): the relay and its links.

Theory of operation. A worker's channel that has consumers of its own opens one link to the
same channel on every other worker: a V2 consumer connection over that worker's private unix
socket (``SUB topic channel``; no TLS, no AUTH: the socket lives in a private directory, mode
0700). A link asks for nothing while this channel has messages of its own to give: its RDY is
what it has out here plus its share of the consumers' uncovered room while the channel's own
queue is empty and a consumer has room, else 0 (a change is one RDY command; what is already
out stays out). So a message crosses
workers only when a consumer here would otherwise wait, and a producer pays nothing for it
until then. What a link brings is lent to the channel (``core/lending.py``) and its FIN, REQ
and TOUCH go back over the link; the other worker keeps its copy, so killing either worker
loses nothing acknowledged: the link drops and the lending worker requeues what was out
(nsqd's rule for a consumer that disconnects). A link that drops while consumers remain is
opened again (the other worker is being restarted), after 50 ms, doubling to 1 s.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import TYPE_CHECKING, Protocol, cast

from ... import __version__
from ...core.message import Message
from ...protocol import encode
from ...protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    MESSAGE_FIXED,
    MESSAGE_OVERHEAD,
)

_FRAME_HEADER = struct.Struct(">ll")

if TYPE_CHECKING:
    from ...core.channel import Channel
    from ...options import Options


class RelayHost(Protocol):
    """What a relay needs of its worker (``server/workers.Workers``)."""

    @property
    def opts(self) -> Options: ...
    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def index(self) -> int: ...
    def peers(self) -> list[int]: ...
    def link_path(self, peer: int) -> str: ...


log = logging.getLogger("pynsqd")

#: The user agent of a link: the other worker's /stats leaves these connections out of the
#: node's figures (they are the node talking to itself).
LINK_AGENT = f"pynsqd-worker-link/{__version__}"
RECONNECT_MIN = 0.05
RECONNECT_MAX = 1.0


class Link(asyncio.Protocol):
    """One consumer connection to another worker's copy of the channel."""

    def __init__(self, relay: Relay, peer: int) -> None:
        self.relay = relay
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        #: Messages this link brought that are not FIN'd or REQ'd yet (the other worker's
        #: in-flight count for this connection).
        self.outstanding = 0
        self.rdy = 0
        self.closed = False

    # -- the connection -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        ch = self.relay.channel
        opts = self.relay.workers.opts
        self.transport.write(
            b"  V2"
            + encode.identify(
                {
                    "client_id": f"worker-{self.relay.workers.index}",
                    "hostname": "worker",
                    "user_agent": LINK_AGENT,
                    "feature_negotiation": False,
                    "output_buffer_timeout": -1,
                    "msg_timeout": int(opts.max_msg_timeout * 1000),
                }
            )
            + encode.sub(ch.topic.name, ch.name)
        )
        self.relay.demand_changed()

    def data_received(self, data: bytes) -> None:
        # Message frames straight into Messages (no Frame objects: a link carries many).
        buf = self.buf
        buf += data
        pos, end = 0, len(buf)
        msgs: list[Message] = []
        header = _FRAME_HEADER.unpack_from
        fixed = MESSAGE_FIXED.unpack_from
        while end - pos >= 8:
            size, ftype = header(buf, pos)
            if size < 4 + (MESSAGE_OVERHEAD if ftype == FRAME_TYPE_MESSAGE else 0):
                log.error("WORKERS: link to worker %d sent a bad frame (%d bytes)", self.peer, size)
                self.close()
                return
            stop = pos + 4 + size
            if stop > end:
                break
            start = pos + 8
            if ftype == FRAME_TYPE_MESSAGE:
                ts, attempts = fixed(buf, start)
                msgs.append(
                    Message(
                        bytes(buf[start + 10 : start + 26]),
                        bytes(buf[start + 26 : stop]),
                        ts,
                        attempts,
                    )
                )
            elif ftype == FRAME_TYPE_ERROR:
                # E_FIN_FAILED and friends: the other worker timed the message out first.
                log.debug("WORKERS: link to worker %d: %r", self.peer, bytes(buf[start:stop]))
            elif buf[start:stop] == b"_heartbeat_":
                self._write(encode.nop())
            pos = stop
        if pos:
            del buf[:pos]
        if msgs:
            self.outstanding += len(msgs)
            self.relay.lend(msgs, self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        self.relay.link_lost(self)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- commands (core.lending.Lender) ---------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def fin(self, ids: list[bytes]) -> None:
        self.outstanding -= len(ids)
        self._write(b"".join([b"FIN " + i + b"\n" for i in ids]))

    def req(self, msg_id: bytes, timeout_ms: int) -> None:
        self.outstanding -= 1
        self._write(encode.req(msg_id, timeout_ms))

    def touch(self, msg_id: bytes) -> None:
        self._write(encode.touch(msg_id))

    def set_rdy(self, n: int) -> None:
        if n != self.rdy and self.transport is not None and not self.closed:
            self.rdy = n
            self.transport.write(encode.rdy(n))


class Relay:
    """One channel's links to the other workers (``core.lending.Demand``)."""

    def __init__(self, workers: RelayHost, channel: Channel) -> None:
        self.workers = workers
        self.channel = channel
        self.links: dict[int, Link] = {}
        self._backoff: dict[int, float] = {}
        self._retry: dict[int, asyncio.TimerHandle] = {}
        self.closed = False

    def _wanted(self) -> bool:
        ch = self.channel
        return (
            not self.closed and not ch.exiting and any(not c.is_link for c in ch.clients.values())
        )

    def consumers_changed(self) -> None:
        if self._wanted():
            for peer in self.workers.peers():
                if peer not in self.links and peer not in self._retry:
                    self._open(peer)
        else:
            self._close_links()

    def _open(self, peer: int) -> None:
        link = Link(self, peer)
        self.links[peer] = link
        path = self.workers.link_path(peer)

        async def connect() -> None:
            try:
                await self.workers.loop.create_unix_connection(lambda: link, path)
            except OSError as err:
                log.debug("WORKERS: link to worker %d failed - %s", peer, err)
                link.closed = True
                self.link_lost(link)

        self.workers.loop.create_task(connect())

    def link_lost(self, link: Link) -> None:
        if self.links.get(link.peer) is link:
            del self.links[link.peer]
        lending = self.channel.lending
        if lending is not None:
            lending.forget(link)
        if self._wanted() and link.peer not in self._retry:
            delay = self._backoff.get(link.peer, RECONNECT_MIN / 2) * 2
            self._backoff[link.peer] = min(delay, RECONNECT_MAX)

            def retry(peer: int = link.peer) -> None:
                del self._retry[peer]
                if self._wanted() and peer not in self.links:
                    self._open(peer)

            self._retry[link.peer] = self.workers.loop.call_later(delay, retry)

    def lend(self, msgs: list[Message], link: Link) -> None:
        self._backoff.pop(link.peer, None)
        lending = self.channel.lending
        if lending is None or self.closed:
            for m in msgs:
                link.req(m.id, 0)
            return
        lending.add(msgs, link)
        self.channel.schedule_pump()

    def demand_changed(self) -> None:
        """Each link's RDY is what it has out here plus its share of the consumers' room
        not yet covered (their RDY less what they hold and what waits here), and 0 while
        this channel has messages of its own or none of its consumers has room. So the links
        together may bring what the consumers have room for, wherever the messages are (a
        consumer with RDY 5 whose 5 messages are all on one other worker gets 5 in flight,
        as from nsqd), a link fed alone keeps one RDY while messages flow, and a change is
        one RDY command, at most one per loop turn."""
        links = self.links
        if not links:
            return
        ch = self.channel
        free = 0
        if not (ch.paused or ch.exiting or ch.held or len(ch.queue)):
            room = 0
            for c in ch.clients.values():
                if not c.is_link:
                    room += c.rdy - c.in_flight_count
            lending = ch.lending
            free = room - (len(lending.queue) if lending is not None else 0)
        if free <= 0:
            for link in links.values():
                link.set_rdy(0)
            return
        share = -(-free // len(links))
        most = self.workers.opts.max_rdy_count
        for link in links.values():
            link.set_rdy(min(most, link.outstanding + share))

    def _close_links(self) -> None:
        for handle in self._retry.values():
            handle.cancel()
        self._retry.clear()
        for link in list(self.links.values()):
            link.close()
        self.links.clear()
        if self.channel.lending is not None:
            self.channel.lending.forget()

    def close(self) -> None:
        self.closed = True
        self._close_links()


__all__ = ["LINK_AGENT", "Link", "Relay"]
