"""Each byte transform of the connection pipeline alone: bytes in, bytes out, no socket.

The other end is an independent implementation: python-snappy's stream framing, zlib's raw
DEFLATE, and Python's ssl client over memory BIOs with trustme certificates. Each transform is
fed its input whole, a byte at a time, and with trailing partial data.
"""

from __future__ import annotations

import contextlib
import ssl
import zlib

import pytest
import snappy
import trustme

from pynsqd.protocol.compression import DEFLATE_PIECE
from pynsqd.server.transforms import (
    DeflateTransform,
    Pipeline,
    SnappyTransform,
    TLSTransform,
    TransformError,
)

COMMANDS = b"PUB t 5\n" + b"hello" + b"NOP\n" * 50 + b"FIN 0123456789abcdef\n"


def feed_bytewise(stage: SnappyTransform | DeflateTransform | TLSTransform, data: bytes) -> bytes:
    return b"".join(stage.feed(data[i : i + 1]) for i in range(len(data)))


# -- snappy ---------------------------------------------------------------------------------


def snappy_stream(data: bytes) -> bytes:
    return bytes(snappy.StreamCompressor().compress(data))


def test_snappy_whole_and_byte_at_a_time() -> None:
    wire = snappy_stream(COMMANDS)
    assert SnappyTransform().feed(wire) == COMMANDS
    assert feed_bytewise(SnappyTransform(), wire) == COMMANDS


def test_snappy_trailing_partial_chunk_waits_for_the_rest() -> None:
    comp = snappy.StreamCompressor()
    first, second = comp.compress(b"NOP\n"), comp.compress(b"CLS\n")
    stage = SnappyTransform()
    assert stage.feed(first + second[:3]) == b"NOP\n"
    assert stage.feed(second[3:]) == b"CLS\n"


def test_snappy_encode_is_read_by_another_implementation() -> None:
    stage = SnappyTransform()
    wire = stage.encode(b"OK") + stage.encode(b"second")
    assert snappy.StreamDecompressor().decompress(wire) == b"OKsecond"


def test_snappy_corrupt_stream_is_an_error_with_gos_words() -> None:
    with pytest.raises(TransformError, match="snappy: corrupt input"):
        SnappyTransform().feed(b"PUB t 5\nhello")  # not snappy framing at all


# -- deflate --------------------------------------------------------------------------------


def deflate(data: bytes, level: int = 6) -> bytes:
    z = zlib.compressobj(level, zlib.DEFLATED, -15)
    return z.compress(data) + z.flush(zlib.Z_SYNC_FLUSH)


def test_deflate_whole_and_byte_at_a_time() -> None:
    wire = deflate(COMMANDS)
    assert DeflateTransform(6).feed(wire) == COMMANDS
    assert feed_bytewise(DeflateTransform(6), wire) == COMMANDS


def test_deflate_bomb_comes_out_in_bounded_pieces() -> None:
    stage = DeflateTransform(6)
    total = 4 * DEFLATE_PIECE + 123
    piece = stage.feed(deflate(b"\0" * total))
    assert len(piece) == DEFLATE_PIECE and stage.more
    got = len(piece)
    while stage.more:
        piece = stage.feed(b"")
        assert len(piece) <= DEFLATE_PIECE
        got += len(piece)
    assert got == total


def test_deflate_encode_is_read_by_zlib() -> None:
    stage = DeflateTransform(9)
    wire = stage.encode(b"OK") + stage.encode(b"more")
    assert zlib.decompressobj(-15).decompress(wire) == b"OKmore"


def test_deflate_end_of_stream_and_garbage_are_errors() -> None:
    ended = zlib.compressobj(6, zlib.DEFLATED, -15)
    with pytest.raises(TransformError, match="flate: stream ended"):
        DeflateTransform(6).feed(ended.compress(b"NOP\n") + ended.flush())
    with pytest.raises(TransformError, match="flate: corrupt input"):
        DeflateTransform(6).feed(b"\xff" * 16)


# -- TLS ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = trustme.CA()
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ca.configure_trust(client)
    return server, client


class TLSClient:
    """Python's ssl client over memory BIOs: the other end of a TLSTransform."""

    def __init__(self, ctx: ssl.SSLContext) -> None:
        self.incoming = ssl.MemoryBIO()
        self.outgoing = ssl.MemoryBIO()
        self.obj = ctx.wrap_bio(self.incoming, self.outgoing, server_hostname="127.0.0.1")

    def handshake(self, server: TLSTransform, bytewise: bool = False) -> None:
        for _ in range(10):
            try:
                self.obj.do_handshake()
                done = True
            except ssl.SSLWantReadError:
                done = False
            wire = self.outgoing.read()
            if wire:
                got = feed_bytewise(server, wire) if bytewise else server.feed(wire)
                assert got == b""  # nothing but handshake so far
            self.incoming.write(server.outgoing())
            if done and server.ready:
                return
        raise AssertionError("handshake did not finish")

    def send(self, data: bytes) -> bytes:
        self.obj.write(data)
        return self.outgoing.read()

    def receive(self, wire: bytes) -> bytes:
        self.incoming.write(wire)
        return self.obj.read(1 << 20)


@pytest.mark.parametrize("bytewise", [False, True])
def test_tls_handshake_then_data_both_ways(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext], bytewise: bool
) -> None:
    server_ctx, client_ctx = contexts
    server = TLSTransform(server_ctx)
    client = TLSClient(client_ctx)
    client.handshake(server, bytewise)
    assert server.layer.version.startswith("TLS1.")
    wire = client.send(COMMANDS)
    got = feed_bytewise(server, wire) if bytewise else server.feed(wire)
    assert got == COMMANDS
    assert client.receive(server.encode(b"OK")) == b"OK"


def test_tls_trailing_partial_record_waits(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server_ctx, client_ctx = contexts
    server = TLSTransform(server_ctx)
    client = TLSClient(client_ctx)
    client.handshake(server)
    one, two = client.send(b"NOP\n"), client.send(b"CLS\n")
    assert server.feed(one + two[:7]) == b"NOP\n"
    assert server.feed(two[7:]) == b"CLS\n"


def test_tls_first_record_not_a_handshake_is_an_error(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    with pytest.raises(TransformError, match="does not look like a TLS handshake"):
        TLSTransform(contexts[0]).feed(b"NOP\n")


def test_tls_close_notify_is_eof(contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    server_ctx, client_ctx = contexts
    server = TLSTransform(server_ctx)
    client = TLSClient(client_ctx)
    client.handshake(server)
    wire = client.send(b"NOP\n")
    with contextlib.suppress(ssl.SSLWantReadError):  # it sends close_notify, then waits
        client.obj.unwrap()
    assert server.feed(wire + client.outgoing.read()) == b"NOP\n"
    assert server.eof


# -- the pipeline ---------------------------------------------------------------------------


def test_pipeline_tls_then_snappy_in_nsqds_order(
    contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    server_ctx, client_ctx = contexts
    tls = TLSTransform(server_ctx)
    pipeline = Pipeline()
    pipeline.push(tls)
    client = TLSClient(client_ctx)
    client.handshake(tls)
    pipeline.push(SnappyTransform())
    # the client compresses, then encrypts; the server decrypts, then decompresses
    assert pipeline.feed(client.send(snappy_stream(COMMANDS))) == COMMANDS
    plain = client.receive(pipeline.encode(b"OK"))
    assert snappy.StreamDecompressor().decompress(plain) == b"OK"
    assert not pipeline.more and not pipeline.eof
