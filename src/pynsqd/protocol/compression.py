"""Stream compression after IDENTIFY, sans-IO: snappy framing and raw DEFLATE, both directions.

nsqd wraps the connection in ``golang/snappy``'s ``NewReader``/``NewWriter`` (the framing format:
a stream identifier chunk, then compressed or uncompressed chunks of at most 64 KiB, each with a
masked CRC-32C) or in ``compress/flate`` (raw DEFLATE, no zlib header, a sync flush after every
write). Decoders take whatever bytes a read delivered, however the chunks are split, and return
the bytes now complete; corrupt input raises ``StreamError`` with Go's wording.
"""

from __future__ import annotations

import zlib
from typing import Any


def _cramjam() -> Any:
    """cramjam, imported by the first snappy connection: 1.6 MiB a server without one saves."""
    import cramjam

    return cramjam


_STREAM_ID = b"\xff\x06\x00\x00sNaPpY"
#: golang/snappy: maxEncodedLenOfMaxBlockSize + checksumSize; no chunk of a real writer is longer.
_MAX_CHUNK = 76490 + 4
_MAX_UNCOMPRESSED_CHUNK = 65536 + 4
#: A decompression bomb is fed to the parser in pieces of at most this many bytes.
DEFLATE_PIECE = 1 << 20


class StreamError(ValueError):
    """The compressed stream is corrupt; the connection cannot go on."""


class SnappyDecoder:
    """golang/snappy's ``Reader``: chunks are checked and decompressed once they are whole."""

    __slots__ = ("_buf", "_started")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._started = False

    def decode(self, data: bytes) -> bytes:
        buf = self._buf
        buf += data
        n = len(buf)
        pos = 0
        while n - pos >= 4:
            kind = buf[pos]
            length = buf[pos + 1] | buf[pos + 2] << 8 | buf[pos + 3] << 16
            if not self._started:
                if kind != 0xFF or length != 6:
                    raise StreamError("snappy: corrupt input")
            elif 0x02 <= kind <= 0x7F:
                raise StreamError("snappy: unsupported input")
            limit = _MAX_UNCOMPRESSED_CHUNK if kind == 0x01 else _MAX_CHUNK
            if length > limit:
                raise StreamError("snappy: corrupt input")
            if n - pos - 4 < length:
                break
            if not self._started:
                if buf[pos : pos + 10] != _STREAM_ID:
                    raise StreamError("snappy: corrupt input")
                self._started = True
            pos += 4 + length
        if not pos:
            return b""
        # The complete chunks go to the native decoder in one call; it checks every checksum,
        # skips padding and skippable chunks, and accepts repeated stream identifiers.
        chunks = bytes(buf[:pos])
        del buf[:pos]
        if not chunks.startswith(_STREAM_ID):
            chunks = _STREAM_ID + chunks
        try:
            return bytes(_cramjam().snappy.decompress(chunks))
        except _cramjam().DecompressionError as err:
            raise StreamError(str(err) or "snappy: corrupt input") from None


class SnappyEncoder:
    """golang/snappy's ``Writer``: the stream identifier once, then framed chunks per write."""

    __slots__ = ("_started",)

    def __init__(self) -> None:
        self._started = False

    def encode(self, data: bytes) -> bytes:
        framed = bytes(_cramjam().snappy.compress(data))
        if self._started:
            return framed[len(_STREAM_ID) :]
        self._started = True
        return framed


class DeflateDecoder:
    """``flate.NewReader``: raw DEFLATE. Output comes in bounded pieces (see ``more``)."""

    __slots__ = ("_tail", "_z")

    def __init__(self) -> None:
        self._z = zlib.decompressobj(-15)
        self._tail = b""

    def decode(self, data: bytes) -> bytes:
        z = self._z
        src = self._tail + data if self._tail else data
        try:
            out = z.decompress(src, DEFLATE_PIECE)
        except zlib.error as err:
            raise StreamError(f"flate: corrupt input ({err})") from None
        self._tail = z.unconsumed_tail
        if z.eof:
            # The client ended the DEFLATE stream (a final block): nothing may follow it.
            raise StreamError("flate: stream ended")
        return out

    @property
    def more(self) -> bool:
        """Input is left that did not fit in the last piece: call ``decode(b"")`` again."""
        return bool(self._tail)


class DeflateEncoder:
    """``flate.NewWriter`` at the negotiated level, flushed (Z_SYNC_FLUSH) after every write."""

    __slots__ = ("_z",)

    def __init__(self, level: int) -> None:
        self._z = zlib.compressobj(level, zlib.DEFLATED, -15)

    def encode(self, data: bytes) -> bytes:
        z = self._z
        return z.compress(data) + z.flush(zlib.Z_SYNC_FLUSH)
