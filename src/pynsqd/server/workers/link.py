"""The serving side of a link from another worker of this node (``--workers``).

A worker link is a V2 connection over the node's private unix socket (``relay.py`` consumes
over it, ``forward.py`` publishes over it). It is served as a client is, with what differs in
one place: no TLS and no AUTH is asked of it (the socket is private), a publish
it carries is made here and never forwarded again, a refusal does not close it (it carries other
clients' publishes), and its answers stay in the order of its publishes while one waits for its
commit (``publishing.LinkPublishing``). The core asks ``is_link`` only to keep what it lends to
the worker's own consumers (``core/channel.py``).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from ...protocol.parser import Event
from ..protocol_v2 import ClientV2
from ..publishing import LinkPublishing

if TYPE_CHECKING:
    from ..context import ConnectionContext


class WorkerLink(ClientV2):
    is_link = True
    unnamed_peer = "worker-link"

    def __init__(self, nsqd: ConnectionContext) -> None:
        super().__init__(nsqd, dataclasses.replace(nsqd.protocol_config, tls_required=False))
        self.publishing = self.link_publishing = LinkPublishing(self)

    def send_frame(self, frame: bytes) -> None:
        in_order = self.link_publishing.in_order
        if in_order:  # behind an answer not known yet
            in_order.append([frame])
            return
        super().send_frame(frame)

    def _authorized(self, name: str, topic: str, channel: str, cmd: Event) -> bool:
        return True  # another worker of this node, over its private socket
