"""Publishes to a retained topic that another worker keeps (``--workers``): the forward links.

Theory of operation. A retained topic's log is one worker's (``Placement.keeper``: a hash of
the name), so that its offsets, rewinds, dedup index and retention are those of one log, as
with one process. A publish that lands on another worker is sent there before it is answered:
one V2 producer connection per pair of workers, over the keeper's private unix socket (as the
relay's links), pipelined: every client connection's publishes go down it in the order they
came, and the keeper's answers come back in that order (``_waiting``). The client's connection
waits for its answer (``Pause.FORWARD``), so what it is told OK is in the keeper's log, synced
as its flags say; a refusal there (a bad sequence, a full disk) is answered to the client with
the keeper's own error. The keeper answers a link's refusal without closing it (one client's
bad publish does not fail another's). If the connection drops (the keeper was killed, or
stopped), what was sent and waiting fails with ``E_PUB_FAILED`` saying it may have been
written (the keeper may have appended it and died before its OK: a publisher that simply
publishes again may write it twice; an idempotent one may retry); what was never sent (the
link could not be opened) says it was not written. The next publish opens the link again.
HTTP publishes go to the keeper's admin socket instead (``AdminLinks.proxy``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from .dial import PeerLink

if TYPE_CHECKING:
    from ...core.message import Message

log = logging.getLogger("pynsqd")

#: ``done(answer, error)``: the keeper's answer (its OK, which may count duplicates), or
#: (``error``) its error line, or why no answer came.
Done = Callable[[bytes, bool], None]

#: The answer to a publish sent to the keeper whose link dropped before its answer came.
SENT_LOST = (
    b"E_PUB_FAILED the worker that keeps the topic's log went away before it answered; "
    b"the message may have been written"
)
#: The answer to a publish that was never sent (no link to the keeper).
NOT_SENT = (
    b"E_PUB_FAILED the worker that keeps the topic's log is not serving (restarting); "
    b"not written, publish again"
)


class ForwardHost(Protocol):
    """What the forward links need of their worker (``server/workers.Workers``)."""

    loop: asyncio.AbstractEventLoop
    index: int

    def link_path(self, peer: int) -> str: ...


class ForwardLink(PeerLink):
    """One producer connection to the worker that keeps some retained topics' logs."""

    def __init__(self, peer: int, lost: Callable[[ForwardLink], None]) -> None:
        super().__init__(peer)
        self._lost = lost
        #: Commands sent (or to send once connected), oldest first: their ``done``.
        self._waiting: collections.deque[Done] = collections.deque()

    def identity(self) -> dict[str, Any]:
        return {"client_id": "worker-forward", "heartbeat_interval": -1, "idempotent_publish": True}

    def connected(self) -> None:
        self._waiting.appendleft(lambda answer, error: None)  # the IDENTIFY's, first

    def send(self, command: bytes, done: Done) -> None:
        if self.closed:
            done(NOT_SENT, True)
            return
        self._waiting.append(done)
        self.write(command)

    def answered(self, data: bytes, *, error: bool) -> None:
        if not self._waiting:
            log.error("WORKERS: forward link to worker %d: an answer no one asked", self.peer)
            return
        self._waiting.popleft()(data, error)

    def received(self, msgs: list[Message]) -> None:
        log.error("WORKERS: forward link to worker %d: a message on a producer link", self.peer)
        self.close()

    def lost(self) -> None:
        self.fail(SENT_LOST)

    def dial_failed(self, err: OSError) -> None:
        log.warning("WORKERS: forward link to worker %d failed - %s", self.peer, err)
        self.fail(NOT_SENT)  # nothing was written to it

    def fail(self, why: bytes) -> None:
        self.closed = True
        waiting, self._waiting = self._waiting, collections.deque()
        self._lost(self)
        for done in waiting:
            done(why, True)


class Forwarder:
    """This worker's forward links, one per keeper, opened on first use."""

    def __init__(self, host: ForwardHost) -> None:
        self.host = host
        self.links: dict[int, ForwardLink] = {}

    def send(self, peer: int, command: bytes, done: Done) -> None:
        link = self.links.get(peer)
        if link is None:
            link = self.links[peer] = ForwardLink(peer, self._lost)
            link.dial(self.host.loop, self.host.link_path(peer))
        link.send(command, done)

    def _lost(self, link: ForwardLink) -> None:
        if self.links.get(link.peer) is link:
            del self.links[link.peer]

    def close(self) -> None:
        for link in list(self.links.values()):
            link.close()
        self.links.clear()


__all__ = ["Done", "ForwardLink", "Forwarder"]
