"""The byte transforms between the socket and the parser: TLS, then snappy or deflate.

Each transform is sans-IO and stands alone (``tests/unit/server/test_transforms.py`` drives each one
with nothing but bytes):

- ``feed(wire) -> plain``: what the client sent, as far as it is complete.
- ``encode(plain) -> wire``: what goes back.
- ``outgoing()``: bytes the transform must send of its own accord (TLS handshake records,
  alerts, session tickets); empty for the codecs.
- ``more``: output is being withheld that ``feed(b"")`` returns (deflate hands out a small
  input's large output in bounded pieces, so that one client cannot make the server hold a
  decompression bomb).
- ``eof``: the client closed the stream cleanly (TLS close_notify).

A corrupt stream raises ``TransformError`` with Go's wording. ``Pipeline`` chains the transforms
in nsqd's order, socket → TLS → compression → parser, and back in reverse.
"""

from __future__ import annotations

import ssl
from typing import Protocol

from ..protocol.compression import (
    DeflateDecoder,
    DeflateEncoder,
    SnappyDecoder,
    SnappyEncoder,
    StreamError,
)
from .tls import TLSLayer, first_record_is_tls


class TransformError(Exception):
    """The stream cannot go on. ``alert``: bytes to send to the client before closing."""

    def __init__(self, reason: str, alert: bytes = b"") -> None:
        super().__init__(reason)
        self.reason = reason
        self.alert = alert


class Transform(Protocol):
    def feed(self, data: bytes) -> bytes: ...
    def encode(self, data: bytes) -> bytes: ...
    def outgoing(self) -> bytes: ...
    @property
    def more(self) -> bool: ...
    @property
    def eof(self) -> bool: ...


class TLSTransform:
    """Server-side TLS. Until ``ready``, ``feed`` drives the handshake and returns nothing;
    application data that came with the client's Finished waits for the next ``feed``, so that
    a transform stacked once the handshake is done (compression) sees it."""

    __slots__ = ("_first", "layer", "ready")

    more = False

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self.layer = TLSLayer(ctx)
        self.ready = False
        self._first = True

    def feed(self, data: bytes) -> bytes:
        layer = self.layer
        if not self.ready:
            if data and self._first:
                self._first = False
                if not first_record_is_tls(data):
                    raise TransformError("tls: first record does not look like a TLS handshake")
            try:
                self.ready = layer.handshake(data)
            except ssl.SSLError as err:
                raise TransformError(str(err.reason or err), layer.take_outgoing()) from None
            return b""
        try:
            return layer.decode(data)
        except ssl.SSLError as err:
            raise TransformError(f"tls: {err.reason or err}", layer.take_outgoing()) from None

    def encode(self, data: bytes) -> bytes:
        return self.layer.encode(data)

    def outgoing(self) -> bytes:
        return self.layer.take_outgoing()

    @property
    def eof(self) -> bool:
        return self.layer.eof


class _Codec:
    """A compression transform: a stream decoder and encoder (``protocol/compression.py``)."""

    __slots__ = ("_decoder", "_encoder")

    eof = False

    def __init__(
        self, decoder: SnappyDecoder | DeflateDecoder, encoder: SnappyEncoder | DeflateEncoder
    ) -> None:
        self._decoder = decoder
        self._encoder = encoder

    def feed(self, data: bytes) -> bytes:
        try:
            return self._decoder.decode(data)
        except StreamError as err:
            raise TransformError(str(err)) from None

    def encode(self, data: bytes) -> bytes:
        return self._encoder.encode(data)

    def outgoing(self) -> bytes:
        return b""


class SnappyTransform(_Codec):
    """golang/snappy's framing format, both directions."""

    __slots__ = ()

    more = False

    def __init__(self) -> None:
        super().__init__(SnappyDecoder(), SnappyEncoder())


class DeflateTransform(_Codec):
    """Raw DEFLATE at the negotiated level; output in bounded pieces (see ``more``)."""

    __slots__ = ("_deflate", "level")

    def __init__(self, level: int) -> None:
        self._deflate = DeflateDecoder()
        super().__init__(self._deflate, DeflateEncoder(level))
        self.level = level

    @property
    def more(self) -> bool:
        return self._deflate.more


class Pipeline:
    """The transforms of one connection, outermost (next to the socket) first."""

    __slots__ = ("stages",)

    def __init__(self) -> None:
        self.stages: list[Transform] = []

    def push(self, stage: Transform) -> None:
        """Stack a transform nearest the parser (TLS first, compression on top of it)."""
        self.stages.append(stage)

    def feed(self, data: bytes) -> bytes:
        for stage in self.stages:
            data = stage.feed(data)
        return data

    def encode(self, data: bytes) -> bytes:
        for stage in reversed(self.stages):
            data = stage.encode(data)
        return data

    def outgoing(self) -> bytes:
        out = [o for o in (stage.outgoing() for stage in self.stages) if o]
        return b"".join(out)

    @property
    def more(self) -> bool:
        return any(stage.more for stage in self.stages)

    @property
    def eof(self) -> bool:
        return any(stage.eof for stage in self.stages)
