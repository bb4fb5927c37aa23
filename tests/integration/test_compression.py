"""Snappy and deflate after IDENTIFY, alone and over TLS. The client side is python-snappy's
stream (de)compressor and zlib, not the server's code; pynsq and gnsq negotiate them too."""

from __future__ import annotations

import ssl
import zlib
from collections.abc import Callable
from typing import Any

import pytest

from pynsqd.protocol import encode
from pynsqd.protocol.compression import SnappyDecoder, StreamError
from tests.conftest import ServerThread
from tests.integration.secure_client import (
    Certs,
    Layered,
    client_id,
    gnsq_consume,
    identify_exact,
    secure_connect,
)
from tests.wire import Conn

MakeNSQD = Callable[..., ServerThread]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


def round_trip(conn: Conn, topic: str) -> None:
    big = bytes(range(256)) * 800  # 200 KiB: several snappy chunks, many deflate blocks
    conn.pub(topic, b"small")
    conn.mpub(topic, [b"m1", b"m2", big])
    conn.dpub(topic, 0, b"deferred")
    conn.sub(topic, "ch", rdy=10)
    msgs = conn.read_messages(5)
    assert sorted(m.body for m in msgs) == sorted([b"small", b"m1", b"m2", big, b"deferred"])
    for m in msgs:
        conn.fin(m.id)
    conn.nop()


def test_snappy(nsqd: ServerThread) -> None:
    conn, reply = secure_connect(nsqd, snappy=True)
    assert reply["snappy"] is True and reply["deflate"] is False
    with conn:
        round_trip(conn, "snappy")
        client = client_id(nsqd)
        assert nsqd.call(lambda: (client.snappy, client.deflate, client.tls)) == (
            True,
            False,
            False,
        )


@pytest.mark.parametrize(("asked", "effective"), [(0, 6), (1, 1), (9, 3)])
def test_deflate_levels(make_nsqd: MakeNSQD, asked: int, effective: int) -> None:
    server = make_nsqd(max_deflate_level=3 if asked == 9 else 6)
    conn, reply = secure_connect(server, deflate=True, deflate_level=asked)
    assert reply["deflate"] is True and reply["deflate_level"] == effective
    with conn:
        round_trip(conn, "deflate")
        client = client_id(server)
        assert server.call(lambda: (client.deflate, client.deflate_level)) == (True, effective)


def test_snappy_and_deflate_together_fail(nsqd: ServerThread) -> None:
    with Conn(nsqd.tcp_address) as conn:
        conn.send(encode.identify({"feature_negotiation": True, "snappy": True, "deflate": True}))
        conn.expect_fatal(b"E_IDENTIFY_FAILED cannot enable both deflate and snappy compression")


def test_not_offered_when_disabled(make_nsqd: MakeNSQD) -> None:
    server = make_nsqd(snappy=False, deflate=False)
    with Conn(server.tcp_address) as conn:
        reply = conn.identify({"feature_negotiation": True, "snappy": True})
        assert isinstance(reply, dict) and reply["snappy"] is False
        conn.pub("t", b"plain")
    with Conn(server.tcp_address) as conn:
        reply = conn.identify({"feature_negotiation": True, "deflate": True})
        assert isinstance(reply, dict) and reply["deflate"] is False
        conn.pub("t", b"plain")


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
def test_over_tls(make_nsqd: MakeNSQD, certs: Certs, codec: str) -> None:
    server = make_nsqd(**certs.server_options(tls_required="true"))
    conn, reply = secure_connect(server, certs.client_context(), tls_v1=True, **{codec: True})
    assert reply["tls_v1"] is True and reply[codec] is True
    with conn:
        assert isinstance(conn.sock, Layered)
        round_trip(conn, f"tls-{codec}")
        client = client_id(server)
        assert server.call(lambda: (client.tls, getattr(client, codec))) == (True, True)


@pytest.mark.parametrize("codec", ["snappy", "deflate"])
def test_commands_split_anywhere(nsqd: ServerThread, codec: str) -> None:
    """The compressed stream arrives a byte at a time: frames split across every read."""
    conn, _ = secure_connect(nsqd, **{codec: True})
    with conn:
        assert isinstance(conn.sock, Layered)
        wire = b"".join(encode.pub("split", b"body %d" % i) for i in range(20))
        compressed = conn.sock._encode(wire)
        for i in range(len(compressed)):
            conn.sock.send_raw(compressed[i : i + 1])
        for _ in range(20):
            assert conn.read_response() == b"OK"
    topic = nsqd.call(lambda: nsqd.nsqd.topics["split"])
    assert nsqd.call(lambda: topic.message_count) == 20


@pytest.mark.parametrize(
    ("codec", "garbage"),
    [
        ("snappy", b"PUB t\n\x00\x00\x00\x01x"),  # not even a stream identifier
        ("snappy", b"\xff\x06\x00\x00sNaPpY\x00\x08\x00\x00\x00\x00\x00\x00junk"),  # bad CRC
        ("snappy", b"\xff\x06\x00\x00sNaPpY\x05\x01\x00\x00x"),  # reserved chunk type
        ("snappy", b"\xff\x06\x00\x00sNaPpY\x00\xff\xff\xff"),  # chunk far too long
        ("deflate", b"\xff\xff\xff\xff\xff\xff"),
    ],
)
def test_garbage_in_compressed_stream_closes(
    nsqd: ServerThread, codec: str, garbage: bytes
) -> None:
    with nsqd.connect() as other:
        conn, _ = secure_connect(nsqd, **{codec: True})
        with conn:
            assert isinstance(conn.sock, Layered)
            conn.sock.send_raw(garbage)
            conn.expect_closed()
        other.pub("t", b"others carry on")


def test_deflate_bomb_is_fed_in_pieces(nsqd: ServerThread) -> None:
    """1.5 MiB of NOPs in a few KiB of DEFLATE: parsed in bounded pieces, then a PUB."""
    conn, _ = secure_connect(nsqd, deflate=True)
    with conn:
        comp = zlib.compressobj(9, zlib.DEFLATED, -15)
        nops = b"NOP\n" * (1 << 17)
        data = b"".join(comp.compress(nops) for _ in range(3))
        data += comp.compress(encode.pub("bomb", b"after")) + comp.flush(zlib.Z_SYNC_FLUSH)
        assert len(data) < 64 * 1024
        assert isinstance(conn.sock, Layered)
        conn.sock.send_raw(data)
        conn.sock.settimeout(60)
        # Served while the pieces are parsed (30 s: a guard against a hang on a loaded
        # machine; the parse takes milliseconds alone).
        with Conn(nsqd.tcp_address, timeout=30) as other:
            other.pub("other", b"x")
        assert conn.read_response() == b"OK"


def test_commands_pipelined_after_identify_are_compressed(nsqd: ServerThread) -> None:
    """A client that sends its first compressed commands together with IDENTIFY."""
    import snappy

    with Conn(nsqd.tcp_address) as conn:
        comp = snappy.StreamCompressor()
        conn.send(
            encode.identify({"feature_negotiation": True, "snappy": True})
            + comp.compress(encode.pub("pipelined", b"x"))
        )
        from tests.integration.secure_client import read_frame_exact, snappy_layer

        ftype, _ = read_frame_exact(conn.sock)
        assert ftype == 0
        conn.sock = snappy_layer(conn.sock)  # type: ignore[assignment]
        assert conn.read_response() == b"OK"  # the upgrade
        assert conn.read_response() == b"OK"  # the PUB


def test_snappy_decoder_unit() -> None:
    import snappy

    stream = snappy.StreamCompressor().compress(b"hello " * 30000)
    stream += snappy.StreamCompressor().compress(b"again")  # a repeated stream identifier
    dec = SnappyDecoder()
    out = b"".join(dec.decode(stream[i : i + 7]) for i in range(0, len(stream), 7))
    assert out == b"hello " * 30000 + b"again"
    with pytest.raises(StreamError):
        SnappyDecoder().decode(b"\x00\x01\x00\x00x")


# -- independent clients ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "features",
    [{"snappy": True}, {"deflate": True, "deflate_level": 4}, {"snappy": True, "tls_v1": True}],
)
def test_pynsq(make_nsqd: MakeNSQD, certs: Certs, features: dict[str, Any]) -> None:
    import asyncio

    import nsq

    from tests.real_clients import run_tornado
    from tests.waiting import wait_for_async as wait_for

    server = make_nsqd(**certs.server_options())
    addr = f"127.0.0.1:{server.tcp_port}"
    if features.get("tls_v1"):
        features = {
            **features,
            "tls_options": {"ca_certs": certs.ca_file, "cert_reqs": ssl.CERT_REQUIRED},
        }
    bodies = [f"pynsq-{i}".encode() * (i + 1) for i in range(100)]

    async def main() -> None:
        received: list[bytes] = []
        writer = nsq.Writer([addr], reconnect_interval=60, **features)
        reader = nsq.Reader(
            topic="compressed",
            channel="pynsq",
            message_handler=lambda m: received.append(m.body) or True,
            nsqd_tcp_addresses=[addr],
            max_in_flight=10,
            **features,
        )
        try:
            await wait_for(lambda: bool(writer.conns), "the writer to connect")
            await asyncio.sleep(0.2)
            oks: list[Any] = []
            for b in bodies[:50]:
                writer.pub("compressed", b, callback=lambda conn, data: oks.append(data))
            writer.mpub("compressed", bodies[50:], callback=lambda conn, data: oks.append(data))
            await wait_for(lambda: len(oks) == 51, "every OK")
            assert all(r == b"OK" for r in oks), oks[:3]
            await wait_for(lambda: len(received) >= len(bodies), "every message")
            assert sorted(received) == sorted(bodies)
        finally:
            reader.close()
            for conn in list(writer.conns.values()):
                conn.close()

    run_tornado(main)
    clients = server.call(lambda: list(server.nsqd.clients.values()))
    for c in clients:
        assert c.snappy == bool(features.get("snappy"))
        assert c.deflate == bool(features.get("deflate"))


@pytest.mark.parametrize("features", [{"snappy": True}, {"deflate": True}])
def test_gnsq_consumer(nsqd: ServerThread, features: dict[str, Any]) -> None:
    pytest.importorskip("gevent")

    with nsqd.connect() as conn:
        conn.mpub("gnsq-c", [b"a" * 1000, b"b", b"c"])
    received = gnsq_consume(nsqd.tcp_port, "gnsq-c", 3, **features)
    assert sorted(received) == [b"a" * 1000, b"b", b"c"]


def test_identify_exact_helper_plain(nsqd: ServerThread) -> None:
    with Conn(nsqd.tcp_address) as conn:
        reply = identify_exact(conn)
        assert reply["snappy"] is False and reply["deflate"] is False
