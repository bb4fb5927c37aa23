"""The asyncio front end of the client: the same sans-IO protocol (``protocol.encode`` builds
commands, ``protocol.frames.FrameReader`` splits frames) over asyncio streams.

    conn = await AsyncConnection.connect("127.0.0.1:4150")
    await conn.mpub("events", [b"a", b"b"])          # returns once nsqd said OK
    await conn.subscribe("events", "c", rdy=100)
    async for msg in conn.messages():                 # heartbeats are answered on the way
        await conn.fin(msg.id)

An error frame raises ``NsqError`` with nsqd's code (as the blocking client's); a closed
connection ends ``messages()`` with ``NsqConnectionError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Sequence
from typing import Any

from .. import __version__
from ..internal import jsonbound
from ..protocol import encode
from ..protocol.frames import (
    FRAME_TYPE_ERROR,
    FRAME_TYPE_MESSAGE,
    Frame,
    FrameReader,
    Message,
    decode_message,
    duplicates_in,
)
from .errors import (
    IDEMPOTENT,
    NsqConnectionError,
    NsqError,
    check_identity,
    check_names,
    parse_address,
)

HEARTBEAT = b"_heartbeat_"


class AsyncConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: str):
        self._reader = reader
        self._writer = writer
        self.address = address
        self._frames = FrameReader()
        self._pending: list[Frame] = []
        self.identify_response: dict[str, Any] = {}

    @classmethod
    async def connect(
        cls, address: str, *, timeout: float = 10.0, user_agent: str = ""
    ) -> AsyncConnection:
        """TCP connect, magic and IDENTIFY (feature negotiation); raises NsqConnectionError."""
        host, port = parse_address(address)
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except (OSError, TimeoutError) as e:
            raise NsqConnectionError(f"cannot connect to nsqd {address}: {e}", address) from e
        conn = cls(reader, writer, f"{host}:{port}")
        writer.write(b"  V2")
        writer.write(
            encode.identify(
                {
                    "feature_negotiation": True,
                    "client_id": socket.gethostname().split(".")[0],
                    "hostname": socket.gethostname(),
                    "user_agent": user_agent or f"pynsqd/{__version__}",
                    IDEMPOTENT: True,
                }
            )
        )
        reply = await conn._response()
        if reply.startswith(b"{"):
            doc = jsonbound.loads(reply)
            conn.identify_response = doc if isinstance(doc, dict) else {}
        return conn

    # -- frames -------------------------------------------------------------------------------

    async def _frame(self) -> Frame:
        while not self._pending:
            try:
                data = await self._reader.read(1 << 16)
            except OSError as e:
                raise NsqConnectionError(f"{self.address}: {e}", self.address) from e
            if not data:
                raise NsqConnectionError(f"{self.address}: connection closed", self.address)
            self._frames.feed(data)
            self._pending = self._frames.frames()
        return self._pending.pop(0)

    async def _response(self) -> bytes:
        while True:
            frame = await self._frame()
            if frame.frame_type == FRAME_TYPE_ERROR:
                raise NsqError.from_frame(frame.data, self.address)
            if frame.data == HEARTBEAT:
                self._writer.write(encode.nop())
                continue
            return frame.data

    async def _expect_ok(self) -> int:
        """An OK: how many records it says were already there (``frames.ok_answer``)."""
        await self._writer.drain()
        reply = await self._response()
        duplicates = duplicates_in(reply)
        if duplicates is None:
            raise NsqError("E_INVALID", f"unexpected response {reply!r}", self.address)
        return duplicates

    # -- commands -----------------------------------------------------------------------------

    async def pub(self, topic: str, body: bytes, *, identity: tuple[str, int] | None = None) -> int:
        """PUB; ``identity``: (producer id, sequence number) of an idempotent publish to a
        retained topic (pynsqd): a retry with the same identity is written once. Returns how
        many of the records the topic already had (acknowledged, not written again)."""
        check_names(topic, framing_only=True)
        check_identity(identity, self.identify_response, self.address)
        self._writer.write(encode.pub(topic, body, identity))
        return await self._expect_ok()

    async def mpub(
        self, topic: str, bodies: Sequence[bytes], *, identity: tuple[str, int] | None = None
    ) -> int:
        check_names(topic, framing_only=True)
        check_identity(identity, self.identify_response, self.address)
        self._writer.write(encode.mpub(topic, bodies, identity))
        return await self._expect_ok()

    async def dpub(
        self, topic: str, defer_ms: int, body: bytes, *, identity: tuple[str, int] | None = None
    ) -> int:
        check_names(topic, framing_only=True)
        check_identity(identity, self.identify_response, self.address)
        self._writer.write(encode.dpub(topic, defer_ms, body, identity))
        return await self._expect_ok()

    async def subscribe(self, topic: str, channel: str, rdy: int = 1) -> None:
        check_names(topic, channel, framing_only=True)
        self._writer.write(encode.sub(topic, channel))
        await self._expect_ok()
        await self.rdy(rdy)

    async def rdy(self, count: int) -> None:
        self._writer.write(encode.rdy(count))
        await self._writer.drain()

    async def fin(self, msg_id: bytes) -> None:
        self._writer.write(encode.fin(msg_id))
        await self._writer.drain()

    async def req(self, msg_id: bytes, timeout_ms: int = 0) -> None:
        self._writer.write(encode.req(msg_id, timeout_ms))
        await self._writer.drain()

    async def touch(self, msg_id: bytes) -> None:
        self._writer.write(encode.touch(msg_id))
        await self._writer.drain()

    async def messages(self) -> AsyncIterator[Message]:
        """Messages as they arrive (after ``subscribe``); an error frame raises NsqError."""
        while True:
            frame = await self._frame()
            if frame.frame_type == FRAME_TYPE_MESSAGE:
                yield decode_message(frame.data)
            elif frame.frame_type == FRAME_TYPE_ERROR:
                raise NsqError.from_frame(frame.data, self.address)
            elif frame.data == HEARTBEAT:
                self._writer.write(encode.nop())

    async def close(self) -> None:
        if not self._writer.is_closing():
            self._writer.write(encode.cls())
            self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()

    async def __aenter__(self) -> AsyncConnection:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
