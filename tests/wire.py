"""A blocking test client speaking raw V2: send command bytes, read frames."""

from __future__ import annotations

import json
import socket
from typing import Any

from pynsqd.protocol import encode
from pynsqd.protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    FRAME_TYPE_RESPONSE,
    Frame,
    FrameReader,
    Message,
    decode_message,
)


class Conn:
    def __init__(
        self, address: tuple[str, int] | str, *, magic: bytes = b"  V2", timeout: float = 5
    ):
        if isinstance(address, str):  # a unix socket path
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.connect(address)
        else:
            self.sock = socket.create_connection(address, timeout=timeout)
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = FrameReader()
        self._pending: list[Frame] = []
        if magic:
            self.send(magic)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Conn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading --------------------------------------------------------------------------

    def read_frame(self, *, skip_heartbeats: bool = True) -> Frame:
        while True:
            while not self._pending:
                data = self.sock.recv(65536)
                if not data:
                    raise ConnectionError("connection closed by nsqd")
                self.reader.feed(data)
                self._pending.extend(self.reader.frames())
            frame = self._pending.pop(0)
            if skip_heartbeats and frame == Frame(FRAME_TYPE_RESPONSE, b"_heartbeat_"):
                continue
            return frame

    def read_response(self) -> bytes:
        frame = self.read_frame()
        assert frame.frame_type == FRAME_TYPE_RESPONSE, frame
        return frame.data

    def read_error(self) -> bytes:
        frame = self.read_frame()
        assert frame.frame_type == FRAME_TYPE_ERROR, frame
        return frame.data

    def expect_fatal(self, error: bytes) -> None:
        """nsqd sends exactly this error frame, then closes the connection."""
        assert self.read_error() == error
        self.expect_closed()

    def read_message(self) -> Message:
        frame = self.read_frame()
        assert frame.frame_type == FRAME_TYPE_MESSAGE, frame
        return decode_message(frame.data)

    def read_messages(self, n: int) -> list[Message]:
        return [self.read_message() for _ in range(n)]

    def expect_closed(self, timeout: float = 5) -> None:
        """The server closed the connection (after any frames already read)."""
        self.sock.settimeout(timeout)
        while True:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:  # closed with our unread bytes still in its buffer
                return
            if not data:
                return
            self.reader.feed(data)
            frames = self.reader.frames()
            assert all(f == Frame(FRAME_TYPE_RESPONSE, b"_heartbeat_") for f in frames), frames

    def expect_nothing(self, wait: float = 0.2) -> None:
        """No frame (other than heartbeats) arrives within ``wait`` seconds."""
        self.sock.settimeout(wait)
        try:
            frame = self.read_frame()
        except TimeoutError:
            return
        finally:
            self.sock.settimeout(5)
        raise AssertionError(f"unexpected frame {frame}")

    # -- commands -------------------------------------------------------------------------

    def identify(self, data: dict[str, Any] | None = None) -> dict[str, Any] | bytes:
        self.send(encode.identify(data or {}))
        resp = self.read_response()
        return json.loads(resp) if resp.startswith(b"{") else resp

    def sub(self, topic: str, channel: str, rdy: int | None = None) -> None:
        self.send(encode.sub(topic, channel))
        assert self.read_response() == b"OK"
        if rdy is not None:
            self.send(encode.rdy(rdy))

    def pub(self, topic: str, body: bytes) -> None:
        self.send(encode.pub(topic, body))
        assert self.read_response() == b"OK"

    def mpub(self, topic: str, bodies: list[bytes]) -> None:
        self.send(encode.mpub(topic, bodies))
        assert self.read_response() == b"OK"

    def dpub(self, topic: str, defer_ms: int, body: bytes) -> None:
        self.send(encode.dpub(topic, defer_ms, body))
        assert self.read_response() == b"OK"

    def rdy(self, n: int) -> None:
        self.send(encode.rdy(n))

    def fin(self, msg_id: bytes) -> None:
        self.send(encode.fin(msg_id))

    def req(self, msg_id: bytes, timeout_ms: int) -> None:
        self.send(encode.req(msg_id, timeout_ms))

    def touch(self, msg_id: bytes) -> None:
        self.send(encode.touch(msg_id))

    def cls(self) -> None:
        self.send(encode.cls())
        assert self.read_response() == b"CLOSE_WAIT"

    def nop(self) -> None:
        self.send(encode.nop())

    def auth(self, secret: bytes) -> None:
        self.send(encode.auth(secret))


def node_of(msg_id: bytes) -> int:
    """The node id inside a message id (``core/guid.py``): under ``--workers``, the worker
    that keeps the message (each has its own)."""
    return (int(msg_id, 16) >> 12) & 0x3FF
