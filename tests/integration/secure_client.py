"""Client side of TLS, snappy and deflate for the raw test client, by independent code paths:
the ssl module's own sockets, python-snappy's stream (de)compressor, and zlib."""

from __future__ import annotations

import json
import ssl
import struct
import threading
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import snappy
import trustme

from pynsqd.protocol import encode
from tests.conftest import ServerThread
from tests.wire import Conn


class Certs:
    """A CA, nsqd's certificate for 127.0.0.1, and client certificates (one from another CA)."""

    def __init__(self, tmp: Path) -> None:
        self.ca = trustme.CA()
        self.ca_file = str(tmp / "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_file)
        server = self.ca.issue_cert("127.0.0.1", "localhost")
        self.cert_file = str(tmp / "server.pem")
        self.key_file = str(tmp / "server.key")
        server.cert_chain_pems[0].write_to_path(self.cert_file)
        for pem in server.cert_chain_pems[1:]:
            pem.write_to_path(self.cert_file, append=True)
        server.private_key_pem.write_to_path(self.key_file)
        self.client = self.ca.issue_cert("client@example", common_name="client-cn")
        self.client_file = str(tmp / "client.pem")
        self.client.private_key_and_cert_chain_pem.write_to_path(self.client_file)
        self.rogue = trustme.CA().issue_cert("rogue@example", common_name="rogue-cn")
        self.rogue_file = str(tmp / "rogue.pem")
        self.rogue.private_key_and_cert_chain_pem.write_to_path(self.rogue_file)

    def server_options(self, **extra: Any) -> dict[str, Any]:
        # HTTPS on a port of its own (nsqd's default, 0.0.0.0:4152, is shared by parallel runs).
        return {
            "tls_cert": self.cert_file,
            "tls_key": self.key_file,
            "https_address": "127.0.0.1:0",
            **extra,
        }

    def client_context(self, cert: trustme.LeafCert | None = None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        self.ca.configure_trust(ctx)
        if cert is not None:
            cert.configure_cert(ctx)
        return ctx


class Layered:
    """A socket-like object: compression over a (possibly TLS) socket."""

    def __init__(
        self, sock: Any, encode: Callable[[bytes], bytes], decode: Callable[[bytes], bytes]
    ) -> None:
        self._sock = sock
        self._encode = encode
        self._decode = decode

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(self._encode(data))

    def send_raw(self, data: bytes) -> None:
        self._sock.sendall(data)

    def recv(self, n: int) -> bytes:
        while True:
            raw = self._sock.recv(n)
            if not raw:
                return b""
            out = self._decode(raw)
            if out:
                return out

    def settimeout(self, t: float | None) -> None:
        self._sock.settimeout(t)

    def close(self) -> None:
        self._sock.close()


def snappy_layer(sock: Any) -> Layered:
    decomp = snappy.StreamDecompressor()
    comp = snappy.StreamCompressor()
    return Layered(sock, comp.compress, decomp.decompress)


def deflate_layer(sock: Any, level: int = 6) -> Layered:
    comp = zlib.compressobj(level, zlib.DEFLATED, -15)
    decomp = zlib.decompressobj(-15)

    def encode(data: bytes) -> bytes:
        return comp.compress(data) + comp.flush(zlib.Z_SYNC_FLUSH)

    return Layered(sock, encode, decomp.decompress)


def read_exact(sock: Any, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed by nsqd")
        buf += chunk
    return buf


def read_frame_exact(sock: Any) -> tuple[int, bytes]:
    """One frame, without reading a byte past it (what follows may be TLS or compressed)."""
    size, ftype = struct.unpack(">ll", read_exact(sock, 8))
    return ftype, read_exact(sock, size - 4)


def upgrade(
    conn: Conn,
    reply: dict[str, Any],
    ctx: ssl.SSLContext | None = None,
    *,
    deflate_level: int = 6,
) -> None:
    """Do what the IDENTIFY reply says, in nsqd's order, reading each OK on its layer."""
    if reply.get("tls_v1"):
        assert ctx is not None
        conn.sock = ctx.wrap_socket(conn.sock, server_hostname="127.0.0.1")
        assert read_frame_exact(conn.sock) == (0, b"OK")
    if reply.get("snappy"):
        conn.sock = snappy_layer(conn.sock)  # type: ignore[assignment]
        assert conn.read_response() == b"OK"
    if reply.get("deflate"):
        conn.sock = deflate_layer(conn.sock, deflate_level)  # type: ignore[assignment]
        assert conn.read_response() == b"OK"


def identify_exact(conn: Conn, **identify: Any) -> dict[str, Any]:
    conn.send(encode.identify({"feature_negotiation": True, **identify}))
    ftype, data = read_frame_exact(conn.sock)
    assert ftype == 0, data
    reply: dict[str, Any] = json.loads(data)
    return reply


def secure_connect(
    server: ServerThread, ctx: ssl.SSLContext | None = None, **identify: Any
) -> tuple[Conn, dict[str, Any]]:
    conn = Conn(server.tcp_address)
    reply = identify_exact(conn, **identify)
    upgrade(conn, reply, ctx, deflate_level=reply.get("deflate_level", 6))
    return conn, reply


def client_id(server: ServerThread) -> Any:
    """The one ClientV2 connected to the server."""
    clients = server.call(lambda: list(server.nsqd.clients.values()))
    assert len(clients) == 1, clients
    return clients[0]


# -- an auth server ------------------------------------------------------------------------


class AuthServer:
    """A real HTTP auth server on 127.0.0.1:0: records each request, answers as told."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.status = 200
        self.reply: Any = {
            "ttl": 3600,
            "identity": "id-1",
            "identity_url": "http://example.com/id-1",
            "authorizations": [
                {"topic": "^allowed", "channels": [".*"], "permissions": ["publish", "subscribe"]}
            ],
        }
        self.delay = threading.Event()  # set: answer at once
        self.delay.set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                outer.requests.append(
                    {
                        "method": self.command,
                        "path": self.path,
                        "headers": dict(self.headers),
                        "body": self.rfile.read(length) if length else b"",
                    }
                )
                outer.delay.wait(30)
                body = outer.reply if isinstance(outer.reply, bytes) else None
                if body is None:
                    body = json.dumps(outer.reply).encode()
                try:
                    self.send_response(outer.status)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    pass

            do_GET = _answer
            do_POST = _answer

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.address = f"127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.delay.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def gnsq_consume(port: int, topic: str, n: int, **options: Any) -> list[bytes]:
    """Run a gnsq Consumer (gevent, no monkey-patching) until it has ``n`` messages."""
    import gevent
    import gnsq

    consumer = gnsq.Consumer(
        topic,
        "ch",
        nsqd_tcp_addresses=[f"127.0.0.1:{port}"],
        max_backoff_duration=0,
        **options,
    )
    received: list[bytes] = []

    @consumer.on_message.connect
    def handler(consumer: Any, message: Any) -> None:
        received.append(message.body)

    try:
        with gevent.Timeout(20):
            consumer.start(block=False)
            while len(received) < n:
                gevent.sleep(0.01)
    finally:
        consumer.close()
        consumer.join(timeout=5)
    return received
