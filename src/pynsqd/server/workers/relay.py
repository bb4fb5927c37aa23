"""A channel's pull from the other workers (``--workers``): the relay and its links.

Theory of operation. A worker's channel that has consumers of its own opens one link to the
same channel on every other worker: a V2 consumer connection over that worker's private unix
socket (``SUB topic channel``; no TLS, no AUTH: the socket lives in a private directory, mode
0700). What a link brings is lent to the channel (``core/lending.py``), handed to its consumers
in publish order with its own messages, and its FIN, REQ and TOUCH go back over the link; the
other worker keeps its copy, so killing either worker loses nothing acknowledged: the link
drops and the lending worker requeues what was out (nsqd's rule for a consumer that
disconnects).

How much a link asks for (its RDY) depends on the other worker's copy of the channel, which
tells the link whether it has consumers of its own (``_synced_ 0|1`` after it first answered
the link's RDY, ``_consumers_ 0|1`` when that changes; ``link.WorkerLink``):

- **none there** (or not told yet): what it holds can reach a consumer only through a link, so
  the link keeps ``PREFETCH`` messages (or its share of the consumers' room, if more) waiting
  here, whatever this worker holds of its own; the merge keeps one nsqd's order;
- **consumers there**: those consumers are served there, and the link asks for nothing while
  this channel has messages of its own: its RDY is what it has out here plus its share of the
  consumers' uncovered room while the channel's own queue is empty and a consumer has room,
  else 0 (a change is one RDY command; what is already out stays out). So a message crosses
  workers only when a consumer here would otherwise wait, and a producer pays nothing for it
  until then.

A SUB here is answered once every link has been told what its worker holds (``synced``: at
most ``SYNC_MAX``), so a consumer's first RDY finds the node's oldest messages here: a message
published through any worker before the SUB waits for it in order. A link that drops while
consumers remain is opened again (the other worker is being restarted), after 50 ms, doubling
to 1 s.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Protocol, cast

from ...core.message import Message
from ...protocol import encode
from .dial import PeerLink

if TYPE_CHECKING:
    from ...core.channel import Channel
    from ...options import Options


class RelayHost(Protocol):
    """What a relay needs of its worker (``server/workers.Workers``)."""

    opts: Options
    loop: asyncio.AbstractEventLoop
    index: int

    def peers(self) -> list[int]: ...
    def link_path(self, peer: int) -> str: ...


log = logging.getLogger("pynsqd")

RECONNECT_MIN = 0.05
RECONNECT_MAX = 1.0
#: Messages a link keeps waiting here from a worker whose copy has no consumers of its own.
PREFETCH = 100
#: The longest a SUB waits for its links to be told what the other workers hold.
SYNC_MAX = 1.0
_SYNCED = b"_synced_ "
_CONSUMERS = b"_consumers_ "


class ServedLink(Protocol):
    """The serving side of another worker's link here (``link.WorkerLink``)."""

    def tell_consumers(self, has: bool) -> None: ...


class Link(PeerLink):
    """One consumer connection to another worker's copy of the channel."""

    def __init__(self, relay: Relay, peer: int) -> None:
        super().__init__(peer)
        self.relay = relay
        #: Messages this link brought that are not FIN'd or REQ'd yet (the other worker's
        #: in-flight count for this connection).
        self.outstanding = 0
        self.rdy = -1  # the first set_rdy is always sent: the other worker answers it
        #: Whether the other worker's copy has consumers of its own; None until it says.
        self.peer_consumers: bool | None = None
        ch = relay.channel
        self.write(encode.sub(ch.topic.name, ch.name))

    # -- the connection (``dial.PeerLink``) -----------------------------------------------

    def identity(self) -> dict[str, Any]:
        return {
            "client_id": f"worker-{self.relay.workers.index}",
            "output_buffer_timeout": -1,
            "msg_timeout": int(self.relay.workers.opts.max_msg_timeout * 1000),
        }

    def connected(self) -> None:
        self.relay.demand_changed()

    def received(self, msgs: list[Message]) -> None:
        self.outstanding += len(msgs)
        self.relay.lend(msgs, self)

    def answered(self, data: bytes, *, error: bool) -> None:
        if error:
            # E_FIN_FAILED and friends: the other worker timed the message out first.
            log.debug("WORKERS: link to worker %d: %r", self.peer, data)
        elif data.startswith(_SYNCED):
            self.relay.peer_told(self, data.endswith(b"1"), synced=True)
        elif data.startswith(_CONSUMERS):
            self.relay.peer_told(self, data.endswith(b"1"), synced=False)

    def lost(self) -> None:
        self.relay.link_lost(self)

    def dial_failed(self, err: OSError) -> None:
        log.debug("WORKERS: link to worker %d failed - %s", self.peer, err)
        self.relay.link_lost(self)

    # -- commands (core.lending.Lender) ---------------------------------------------------

    def fin(self, ids: list[bytes]) -> None:
        self.outstanding -= len(ids)
        self.write(b"".join([b"FIN " + i + b"\n" for i in ids]))

    def req(self, msg_id: bytes, timeout_ms: int) -> None:
        self.outstanding -= 1
        self.write(encode.req(msg_id, timeout_ms))

    def touch(self, msg_id: bytes) -> None:
        self.write(encode.touch(msg_id))

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
        #: SUBs waiting for every link to be told what its worker holds (``synced``).
        self._waiters: list[asyncio.Future[None]] = []
        self._sync_timer: asyncio.TimerHandle | None = None
        #: What the other workers' links here were last told (``ServedLink``).
        self._told: bool | None = None
        self.closed = False

    def _has_consumers(self) -> bool:
        return any(not c.is_link for c in self.channel.clients.values())

    def _wanted(self) -> bool:
        return not self.closed and not self.channel.exiting and self._has_consumers()

    def consumers_changed(self) -> None:
        has = self._has_consumers()
        if has != self._told:  # the other workers' links here are told
            self._told = has
            for c in self.channel.clients.values():
                if c.is_link:
                    cast(ServedLink, c).tell_consumers(has)
        if self._wanted():
            for peer in self.workers.peers():
                if peer not in self.links and peer not in self._retry:
                    self._open(peer)
        else:
            self._close_links()

    def _open(self, peer: int) -> None:
        link = Link(self, peer)
        self.links[peer] = link
        link.dial(self.workers.loop, self.workers.link_path(peer))

    # -- what the other workers hold -------------------------------------------------------

    def synced(self) -> asyncio.Future[None] | None:
        """Until every link open now has been told what its worker holds (it lent its
        first messages before saying so) or has closed: at most ``SYNC_MAX``. None: no wait."""
        if all(link.peer_consumers is not None for link in self.links.values()):
            return None
        loop = self.workers.loop
        fut: asyncio.Future[None] = loop.create_future()
        self._waiters.append(fut)
        if self._sync_timer is None:
            self._sync_timer = loop.call_later(SYNC_MAX, self._release)
        return fut

    def _release(self) -> None:
        if self._sync_timer is not None:
            self._sync_timer.cancel()
            self._sync_timer = None
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _check_synced(self) -> None:
        if self._waiters and all(link.peer_consumers is not None for link in self.links.values()):
            self._release()

    def peer_told(self, link: Link, has: bool, *, synced: bool) -> None:
        """The other worker says whether its copy has consumers (``synced``: after what it
        lent at the link's first RDY)."""
        if link.peer_consumers is None and not synced:
            return  # its answer to the first RDY comes next
        link.peer_consumers = has
        lending = self.channel.lending
        if has and lending is not None:  # its consumers are served there first
            lending.give_back_waiting(link)
        self._check_synced()
        self.demand_changed()

    def link_lost(self, link: Link) -> None:
        if self.links.get(link.peer) is link:
            del self.links[link.peer]
        self._check_synced()
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
        """Each link's RDY (the module's doc): a link to a worker without consumers keeps
        ``PREFETCH`` waiting here (or its share of the consumers' uncovered room, if more);
        one to a worker with consumers asks for its share of that room only while this
        channel has nothing of its own, else 0. The room is the consumers' RDY less what
        they hold and what lent waits here. So the links together may bring what the
        consumers have room for, wherever the messages are (a consumer with RDY 5 whose 5
        messages are all on one other worker gets 5 in flight, as from nsqd), and a change is
        one RDY command, at most one per loop turn."""
        links = self.links
        if not links:
            return
        ch = self.channel
        blocked = ch.paused or ch.exiting or ch.held
        free = 0
        if not blocked:
            room = 0
            for c in ch.clients.values():
                if not c.is_link:
                    room += c.rdy - c.in_flight_count
            lending = ch.lending
            free = room - (len(lending.queue) if lending is not None else 0)
        most = self.workers.opts.max_rdy_count
        eager = [link for link in links.values() if not link.peer_consumers]
        idle = [link for link in links.values() if link.peer_consumers]
        if eager:
            share = -(-max(free, 0) // len(eager))
            for link in eager:
                link.set_rdy(0 if blocked else min(most, link.outstanding + max(PREFETCH, share)))
        if idle:
            if free <= 0 or len(ch.queue):
                for link in idle:
                    link.set_rdy(0)
                return
            share = -(-free // len(idle))
            for link in idle:
                link.set_rdy(min(most, link.outstanding + share))

    def _close_links(self) -> None:
        for handle in self._retry.values():
            handle.cancel()
        self._retry.clear()
        for link in list(self.links.values()):
            link.close()
        self.links.clear()
        self._check_synced()
        if self.channel.lending is not None:
            self.channel.lending.forget()

    def close(self) -> None:
        self.closed = True
        self._close_links()
        self._release()


__all__ = ["Link", "Relay"]
