"""The serving side of a link from another worker of this node (``--workers``).

A worker link is a V2 connection over the node's private unix socket (``relay.py`` consumes
over it, ``forward.py`` publishes over it). It is served as a client is, with what differs in
one place: no TLS and no AUTH is asked of it (the socket is private), a publish
it carries is made here and never forwarded again, a refusal does not close it (it carries other
clients' publishes), and its answers stay in the order of its publishes while one waits for its
commit (``publishing.LinkPublishing``), and it is told whether this worker's copy of its
channel has consumers of its own: ``_synced_ 0|1`` once the messages its first RDY was given
are on their way (the relay answers its SUB then), ``_consumers_ 0|1`` at each change after
(``relay.py``). The core asks ``is_link`` only to keep what it lends to the worker's own
consumers (``core/channel.py``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ...protocol.commands import IdentifyData, Rdy
from ...protocol.frames import encode_response
from ...protocol.headers import MAX_BLOCK, HeaderLimits
from ...protocol.parser import Event
from ..protocol_v2 import ClientV2
from ..publishing import LinkPublishing

if TYPE_CHECKING:
    from ..context import ConnectionContext


#: A link's limits: none of its own (the worker the client reached checked them).
LINK_HEADERS = HeaderLimits(max_count=MAX_BLOCK, max_bytes=MAX_BLOCK)


class WorkerLink(ClientV2):
    is_link = True
    unnamed_peer = "worker-link"

    def __init__(self, nsqd: ConnectionContext) -> None:
        cfg = nsqd.protocol_config
        # Each body it carries has its header block before it (a client's own, or an empty
        # one: 2 bytes), within the limits the worker the client reached checked.
        link_cfg = dataclasses.replace(
            cfg,
            tls_required=False,
            max_msg_size=cfg.max_msg_size + 2 + MAX_BLOCK,
            max_body_size=cfg.max_body_size * 2 + 2 + MAX_BLOCK,
        )
        super().__init__(nsqd, link_cfg)
        self.publishing = self.link_publishing = LinkPublishing(self)
        self._synced = False

    def identified(self, d: IdentifyData) -> None:
        super().identified(d)
        if d.headers:  # a link carries every message's headers (``dial.py`` asks)
            self.headers = LINK_HEADERS

    def RDY(self, cmd: Rdy) -> None:
        super().RDY(cmd)
        if not self._synced and self.channel is not None:
            self._synced = True
            # After the channel's pump, which this RDY scheduled (call_soon keeps the order):
            # the other worker knows what this one held once this arrives.
            self.loop.call_soon(lambda: self._say(b"_synced_ "))

    def tell_consumers(self, has: bool) -> None:
        """This worker's copy of the channel got its first consumer, or lost its last."""
        if self._synced:
            self._say(b"_consumers_ ")

    def _say(self, what: bytes) -> None:
        ch = self.channel
        if ch is None or self.closed:
            return
        has = any(not c.is_link for c in ch.clients.values())
        self.send_frame(encode_response(what + (b"1" if has else b"0")))
        self._flush_soon()

    def send_frame(self, frame: bytes) -> None:
        in_order = self.link_publishing.in_order
        if in_order:  # behind an answer not known yet
            in_order.append([frame])
            return
        super().send_frame(frame)

    def _authorized(self, name: str, topic: str, channel: str, cmd: Event) -> bool:
        return True  # another worker of this node, over its private socket
