"""The client side of a link to another worker of this node (``--workers``): the one V2
connection that the relay's consumer links (``relay.Link``) and the forward links
(``forward.ForwardLink``) are made of.

Theory of operation. A link is a V2 connection over the other worker's private unix socket
(``<data-path>/worker-<i>/link.sock``, in a directory of mode 0700: no TLS, no AUTH), served
there by ``link.WorkerLink``. It speaks the project's V2 client protocol (``protocol/encode.py``
for the commands, the frame layout of ``protocol/frames.py``), with one IDENTIFY for every
link (``LINK_AGENT``: the other worker's ``/stats`` leaves these connections out of the node's
figures). Frames are split here straight into ``Message``s (a relay link carries many: no
``Frame`` objects on the way), a heartbeat is answered, and what a link does with the rest is
its subclass's: ``received`` (messages), ``answered`` (a response or an error), ``connected``,
``lost``. What is written before the connection is made goes out right after the IDENTIFY, in
order; a connection that cannot be made calls ``dial_failed`` (nothing was written).
"""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any, cast

from ... import __version__
from ...core.message import Message
from ...protocol import encode
from ...protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    MAGIC_V2,
    MESSAGE_FIXED,
    MESSAGE_OVERHEAD,
)

log = logging.getLogger("pynsqd")

#: The user agent of a link: the other worker's /stats leaves these connections out of the
#: node's figures (they are the node talking to itself).
LINK_AGENT = f"pynsqd-worker-link/{__version__}"

_FRAME_HEADER = struct.Struct(">ll")
_HEARTBEAT = b"_heartbeat_"
_NOP = encode.nop()


class PeerLink(asyncio.Protocol):
    """One V2 connection to worker ``peer``; subclasses say what it is for."""

    def __init__(self, peer: int) -> None:
        self.peer = peer
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buf = bytearray()
        #: Commands written before the connection was made: sent after the IDENTIFY.
        self._pending: list[bytes] = []
        self._dialing: asyncio.Task[None] | None = None

    # -- the connection -------------------------------------------------------------------

    def dial(self, loop: asyncio.AbstractEventLoop, path: str) -> None:
        """Connect to the other worker's link socket at ``path``."""

        async def connect() -> None:
            try:
                await loop.create_unix_connection(lambda: self, path)
            except OSError as err:
                self.closed = True
                self._pending.clear()
                self.dial_failed(err)

        self._dialing = loop.create_task(connect())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self.closed:  # closed while it was being made
            transport.close()
            return
        self.transport = cast(asyncio.Transport, transport)
        identify = {
            "hostname": "worker",
            "user_agent": LINK_AGENT,
            "feature_negotiation": False,
            # Every message frame and publish body carries its header block (``link.py``).
            "headers": True,
            **self.identity(),
        }
        self.transport.write(MAGIC_V2 + encode.identify(identify) + b"".join(self._pending))
        self._pending.clear()
        self.connected()

    def write(self, data: bytes) -> None:
        """A command to the other worker (queued until the connection is made; dropped once
        it is closed)."""
        if self.closed:
            return
        if self.transport is None:
            self._pending.append(data)
        else:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, end = 0, len(buf)
        msgs: list[Message] = []
        header = _FRAME_HEADER.unpack_from
        fixed = MESSAGE_FIXED.unpack_from
        while end - pos >= 8:
            size, ftype = header(buf, pos)
            if size < 4 + (MESSAGE_OVERHEAD + 2 if ftype == FRAME_TYPE_MESSAGE else 0):
                log.error("WORKERS: link to worker %d sent a bad frame (%d bytes)", self.peer, size)
                self.close()
                return
            stop = pos + 4 + size
            if stop > end:
                break
            start = pos + 8
            if ftype == FRAME_TYPE_MESSAGE:
                ts, attempts = fixed(buf, start)
                # [uint16 block length][block][body]: the link asked for headers.
                body = start + 28 + (buf[start + 26] << 8 | buf[start + 27])
                if body > stop:
                    log.error("WORKERS: link to worker %d sent a bad header block", self.peer)
                    self.close()
                    return
                msgs.append(
                    Message(
                        bytes(buf[start + 10 : start + 26]),
                        bytes(buf[body:stop]),
                        ts,
                        attempts,
                        bytes(buf[start + 28 : body]),
                    )
                )
            elif ftype != FRAME_TYPE_ERROR and buf[start:stop] == _HEARTBEAT:
                self.write(_NOP)
            else:
                self.answered(bytes(buf[start:stop]), error=ftype == FRAME_TYPE_ERROR)
            pos = stop
        if pos:
            del buf[:pos]
        if msgs:
            self.received(msgs)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        self.lost()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    # -- what a kind of link does ---------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """What this link adds to the IDENTIFY (its ``client_id``, timeouts)."""
        return {}

    def connected(self) -> None:
        """The connection is made (its IDENTIFY and pending commands written)."""

    def received(self, msgs: list[Message]) -> None:
        """Messages the other worker sent (a consumer link's)."""
        raise NotImplementedError

    def answered(self, data: bytes, *, error: bool) -> None:
        """A response (``OK``, ``_synced_ 1``, ...) or an error line."""

    def lost(self) -> None:
        """The connection closed (or was never made: after ``dial_failed``)."""

    def dial_failed(self, err: OSError) -> None:
        """The connection could not be made; nothing was written."""


__all__ = ["LINK_AGENT", "PeerLink"]
