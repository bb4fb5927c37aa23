"""One blocking connection to an nsqd: IDENTIFY, publish and wait for OK, subscribe and read
messages (heartbeats answered), FIN. Frames are split by ``protocol.frames.FrameReader`` and
commands built by ``protocol.encode``; this module only moves bytes."""

from __future__ import annotations

import contextlib
import json
import socket
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from typing import Any

from ..internal import jsonbound
from ..internal.version import version_string
from ..protocol import encode
from ..protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    Frame,
    FrameReader,
    Message,
    decode_message,
)

HEARTBEAT = b"_heartbeat_"


class NsqError(Exception):
    """nsqd answered with an error frame, closed the connection, or could not be reached."""


class Connection:
    def __init__(self, address: str, *, timeout: float = 10.0, user_agent: str = "") -> None:
        host, _, port = address.rpartition(":")
        try:
            self.sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout)
        except (OSError, ValueError) as err:
            raise NsqError(f"failed to connect to {address} - {err}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.address = address
        self._reader = FrameReader()
        self._pending: list[Frame] = []
        self.sock.sendall(b"  V2")
        info = {
            "client_id": socket.gethostname().split(".")[0],
            "hostname": socket.gethostname(),
            "user_agent": user_agent or version_string("pynsqd-client"),
            "feature_negotiation": True,
        }
        self.sock.sendall(encode.identify(info))
        reply = self._response()
        self.server: dict[str, Any] = {}
        if reply.startswith(b"{"):
            parsed = jsonbound.loads(reply)
            self.server = parsed if isinstance(parsed, dict) else {}

    # -- frames -----------------------------------------------------------------------------

    def _frame(self) -> Frame:
        while not self._pending:
            try:
                data = self.sock.recv(1 << 16)
            except OSError as err:
                raise NsqError(f"{self.address}: {err}") from None
            if not data:
                raise NsqError(f"{self.address}: connection closed")
            self._reader.feed(data)
            self._pending = self._reader.frames()
        return self._pending.pop(0)

    def _response(self) -> bytes:
        """The next response (heartbeats answered); an error frame raises."""
        while True:
            frame = self._frame()
            if frame.frame_type == FRAME_TYPE_ERROR:
                raise NsqError(frame.data.decode(errors="replace"))
            if frame.data == HEARTBEAT:
                self.sock.sendall(encode.nop())
                continue
            return frame.data

    # -- publishing ---------------------------------------------------------------------------

    def publish(self, topic: str, body: bytes) -> None:
        self.sock.sendall(encode.pub(topic, body))
        self._expect_ok()

    def multi_publish(self, topic: str, bodies: Sequence[bytes]) -> None:
        self.sock.sendall(encode.mpub(topic, bodies))
        self._expect_ok()

    def _expect_ok(self) -> None:
        reply = self._response()
        if reply != b"OK":
            raise NsqError(f"unexpected response {reply!r}")

    # -- consuming ----------------------------------------------------------------------------

    def subscribe(self, topic: str, channel: str, rdy: int) -> None:
        self.sock.sendall(encode.sub(topic, channel))
        self._expect_ok()
        self.sock.sendall(encode.rdy(rdy))

    def messages(self) -> Iterator[Message]:
        """Messages as they arrive; FIN each with ``finish`` (heartbeats are answered)."""
        while True:
            frame = self._frame()
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                yield decode_message(frame.data)
            elif frame.frame_type == FRAME_TYPE_ERROR:
                raise NsqError(frame.data.decode(errors="replace"))
            elif frame.data == HEARTBEAT:
                self.sock.sendall(encode.nop())

    def finish(self, msg_id: bytes) -> None:
        self.sock.sendall(encode.fin(msg_id))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.sendall(encode.cls())
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def lookup_nodes(lookupd_http: str, topic: str, timeout: float = 5.0) -> list[str]:
    """The TCP addresses of the nsqd nodes nsqlookupd lists for ``topic``."""
    base = lookupd_http if "://" in lookupd_http else f"http://{lookupd_http}"
    url = f"{base}/lookup?topic={urllib.parse.quote(topic)}"
    request = urllib.request.Request(url, headers={"Accept": "application/vnd.nsq; version=1.0"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            doc = json.loads(r.read())
    except (OSError, ValueError) as err:
        raise NsqError(f"lookup of topic {topic} on {lookupd_http} failed - {err}") from None
    data = doc.get("data", doc) if isinstance(doc, dict) else {}
    nodes = []
    for p in data.get("producers") or []:
        host = p.get("broadcast_address") or p.get("hostname")
        nodes.append(f"{host}:{p.get('tcp_port')}")
    return nodes
