"""TLS after IDENTIFY, client certificate policies, --tls-required and the HTTPS listener,
with real certificates from trustme, the ssl module's own client sockets, pynsq and gnsq."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trustme

from pynsqd.protocol import encode
from pynsqd.server import upgrade
from pynsqd.server.nsqd import NSQD
from pynsqd.server.tls import TLSConfigError
from tests.conftest import ServerThread, make_options
from tests.integration.secure_client import (
    Certs,
    client_id,
    gnsq_consume,
    read_frame_exact,
    secure_connect,
)
from tests.wire import Conn

MakeNSQD = Callable[..., ServerThread]


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return Certs(tmp_path_factory.mktemp("certs"))


def test_identify_reports_tls_only_when_configured(
    make_nsqd: MakeNSQD, certs: Certs, tmp_path: Path
) -> None:
    plain = make_nsqd()
    with plain.connect() as c:
        reply = c.identify({"feature_negotiation": True, "tls_v1": True})
        assert isinstance(reply, dict) and reply["tls_v1"] is False
        c.pub("t", b"still plain")  # no upgrade happened
    (tmp_path / "tls").mkdir()
    tls = make_nsqd(**certs.server_options(data_path=str(tmp_path / "tls")))
    with tls.connect() as c:
        reply = c.identify({"feature_negotiation": True})
        assert isinstance(reply, dict) and reply["tls_v1"] is False  # not asked
        c.pub("t", b"plain on a TLS-capable server")


def test_upgrade_then_pub_sub_over_tls(make_nsqd: MakeNSQD, certs: Certs) -> None:
    server = make_nsqd(**certs.server_options())
    conn, reply = secure_connect(server, certs.client_context(), tls_v1=True)
    assert reply["tls_v1"] is True
    with conn:
        assert isinstance(conn.sock, ssl.SSLSocket)
        conn.pub("tls", b"secret body")
        conn.sub("tls", "ch", rdy=1)
        msg = conn.read_message()
        assert msg.body == b"secret body"
        conn.fin(msg.id)
        client = client_id(server)
        stats = server.call(
            lambda: (client.tls, client.tls_version, client.tls_cipher_suite, client.snappy)
        )
        assert stats[0] is True
        assert stats[1] == {"TLSv1.3": "TLS1.3", "TLSv1.2": "TLS1.2"}[conn.sock.version() or ""]
        assert stats[2] == conn.sock.cipher()[0]  # type: ignore[index]
        assert stats[3] is False
        body = urllib.request.urlopen(f"{server.http_url}/stats?format=json").read()
        entry = json.loads(body)["topics"][0]["channels"][0]["clients"][0]
        assert entry["tls"] is True and entry["tls_version"] == stats[1]


def test_tls_min_version(make_nsqd: MakeNSQD, certs: Certs) -> None:
    server = make_nsqd(**certs.server_options(tls_min_version="tls1.3"))
    ctx = certs.client_context()
    ctx.maximum_version = ssl.TLSVersion.TLSv1_2
    with Conn(server.tcp_address) as conn:
        assert isinstance(conn.identify({"feature_negotiation": True, "tls_v1": True}), dict)
        with pytest.raises(ssl.SSLError):
            conn.sock = ctx.wrap_socket(conn.sock, server_hostname="127.0.0.1")
    ctx = certs.client_context()
    conn, _ = secure_connect(server, ctx, tls_v1=True)
    with conn:
        assert conn.sock.version() == "TLSv1.3"  # type: ignore[attr-defined]
        conn.pub("t", b"x")


def test_client_hello_sent_with_identify_belongs_to_the_handshake(
    make_nsqd: MakeNSQD, certs: Certs
) -> None:
    """Bytes the client sends right after IDENTIFY, before reading the reply, are TLS."""
    server = make_nsqd(**certs.server_options())
    ctx = certs.client_context()
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    hello = outgoing.read()
    with Conn(server.tcp_address) as conn:
        conn.send(encode.identify({"feature_negotiation": True, "tls_v1": True}) + hello)
        ftype, data = read_frame_exact(conn.sock)
        assert ftype == 0 and json.loads(data)["tls_v1"] is True
        while True:
            try:
                tls.do_handshake()
                break
            except ssl.SSLWantReadError:
                if outgoing.pending:
                    conn.send(outgoing.read())
                chunk = conn.sock.recv(65536)
                assert chunk, "closed during the handshake"
                incoming.write(chunk)
        tls.write(encode.pub("hello", b"over tls"))
        conn.send(outgoing.read())
        plain = b""
        while len(plain) < 20:
            try:
                plain += tls.read(65536)
            except ssl.SSLWantReadError:
                chunk = conn.sock.recv(65536)
                assert chunk
                incoming.write(chunk)
        # The OK after the handshake, then the OK for PUB.
        assert plain == b"\x00\x00\x00\x06\x00\x00\x00\x00OK" * 2


def test_plain_commands_after_negotiating_tls(make_nsqd: MakeNSQD, certs: Certs) -> None:
    server = make_nsqd(**certs.server_options())
    with server.connect() as other, Conn(server.tcp_address) as conn:
        reply = conn.identify({"feature_negotiation": True, "tls_v1": True})
        assert isinstance(reply, dict) and reply["tls_v1"] is True
        conn.send(encode.pub("t", b"not encrypted"))
        conn.expect_fatal(
            b"E_IDENTIFY_FAILED IDENTIFY failed "
            b"tls: first record does not look like a TLS handshake"
        )
        other.pub("t", b"others carry on")


def test_broken_handshake_closes(make_nsqd: MakeNSQD, certs: Certs) -> None:
    server = make_nsqd(**certs.server_options())
    data = b""
    with Conn(server.tcp_address) as conn:
        conn.identify({"feature_negotiation": True, "tls_v1": True})
        conn.send(b"\x16\x03\x01\x00\x05garbage-that-is-no-client-hello" * 4)
        conn.sock.settimeout(5)
        while True:
            try:
                chunk = conn.sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            data += chunk
    assert b"E_IDENTIFY_FAILED IDENTIFY failed" in data
    with server.connect() as other:
        other.pub("t", b"fine")


def test_handshake_timeout(
    make_nsqd: MakeNSQD, certs: Certs, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upgrade, "HANDSHAKE_TIMEOUT", 0.2)
    server = make_nsqd(**certs.server_options())
    with Conn(server.tcp_address) as conn:
        conn.identify({"feature_negotiation": True, "tls_v1": True})
        conn.expect_fatal(b"E_IDENTIFY_FAILED IDENTIFY failed tls: handshake timeout")


# -- client certificates ----------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["require", "require-verify"])
def test_client_certificate_policies(make_nsqd: MakeNSQD, certs: Certs, policy: str) -> None:
    server = make_nsqd(
        **certs.server_options(
            tls_client_auth_policy=policy, tls_root_ca_file=certs.ca_file, tls_required="true"
        )
    )
    conn, _ = secure_connect(server, certs.client_context(certs.client), tls_v1=True)
    with conn:
        conn.pub("t", b"with a good certificate")
        client = client_id(server)
        assert server.call(lambda: client.tls_common_name) == "client-cn"
    for bad in (None, certs.rogue):
        with Conn(server.tcp_address) as conn:
            assert isinstance(conn.identify({"feature_negotiation": True, "tls_v1": True}), dict)
            ctx = certs.client_context(bad)
            with pytest.raises((ssl.SSLError, ConnectionError)):
                conn.sock = ctx.wrap_socket(conn.sock, server_hostname="127.0.0.1")
                # TLS 1.3: the server checks the client's certificate after the client is done.
                conn.sock.sendall(encode.pub("t", b"x"))
                while conn.sock.recv(65536):
                    pass
                raise ConnectionError("closed")


# -- --tls-required -------------------------------------------------------------------------


def https_get(url: str, certs: Certs, cert: Any = None) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, context=certs.client_context(cert)) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_tls_required_gates_tcp_and_http(make_nsqd: MakeNSQD, certs: Certs) -> None:
    server = make_nsqd(**certs.server_options(tls_required="true", https_address="127.0.0.1:0"))
    https_port = int(server.nsqd.https_address.rsplit(":", 1)[1])
    for cmd, wire in [
        ("PUB", encode.pub("t", b"x")),
        ("SUB", encode.sub("t", "c")),
        ("AUTH", encode.auth(b"s")),
        ("NOP", encode.nop()),
    ]:
        with Conn(server.tcp_address) as conn:
            conn.send(wire)
            conn.expect_fatal(f"E_INVALID cannot {cmd} in current state (TLS required)".encode())
    with Conn(server.tcp_address) as conn:  # IDENTIFY is allowed; then only after the upgrade
        conn.identify({"feature_negotiation": True})
        conn.send(encode.pub("t", b"x"))
        conn.expect_fatal(b"E_INVALID cannot PUB in current state (TLS required)")
    conn, _ = secure_connect(server, certs.client_context(), tls_v1=True)
    with conn:
        conn.pub("t", b"over tls")
    status, body = http_get(f"{server.http_url}/ping")
    assert status == 403
    assert json.loads(body) == {"message": "TLS_REQUIRED", "https_port": https_port}
    assert https_get(f"https://127.0.0.1:{https_port}/ping", certs) == (200, b"OK")


def test_tls_required_tcp_https_leaves_http_open(make_nsqd: MakeNSQD, certs: Certs) -> None:
    server = make_nsqd(
        **certs.server_options(tls_required="tcp-https", https_address="127.0.0.1:0")
    )
    with Conn(server.tcp_address) as conn:
        conn.send(encode.pub("t", b"x"))
        conn.expect_fatal(b"E_INVALID cannot PUB in current state (TLS required)")
    assert http_get(f"{server.http_url}/ping") == (200, b"OK")


def test_https_listener_only_with_tls(
    make_nsqd: MakeNSQD, certs: Certs, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    plain = make_nsqd(https_address="127.0.0.1:0")
    assert plain.nsqd.https_address == ""
    caplog.set_level("INFO", logger="pynsqd")
    (tmp_path / "tls").mkdir()
    server = make_nsqd(
        **certs.server_options(https_address="127.0.0.1:0", data_path=str(tmp_path / "tls"))
    )
    address = server.nsqd.https_address
    assert f"HTTPS: listening on {address}" in caplog.text
    port = int(address.rsplit(":", 1)[1])
    status, body = https_get(f"https://127.0.0.1:{port}/info", certs)
    assert status == 200 and json.loads(body)["version"] == "1.3.0"


def test_bad_certificate_files_fail_start(tmp_path: Path) -> None:
    opts = make_options(tmp_path, tls_cert=str(tmp_path / "nope.pem"), tls_key="nope.key")

    async def start() -> None:
        await NSQD(opts).start()

    # The flag and the file it names, not a bare "[Errno 2] No such file or directory".
    nope = re.escape(str(tmp_path / "nope.pem"))
    with pytest.raises(TLSConfigError, match=rf"failed to load TLS config - --tls-cert={nope}: "):
        asyncio.run(start())
    certs_dir = tmp_path / "c"
    certs_dir.mkdir()
    ca = trustme.CA()
    cert, key = certs_dir / "cert.pem", certs_dir / "key.pem"
    issued = ca.issue_cert("127.0.0.1")
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    opts = make_options(
        tmp_path,
        tls_cert=str(cert),
        tls_key=str(key),
        tls_client_auth_policy="require-verify",
        tls_root_ca_file=str(tmp_path / "no-ca.pem"),
    )
    with pytest.raises(TLSConfigError, match=r"--tls-root-ca-file=\S*no-ca\.pem: "):
        asyncio.run(start())


def test_a_client_tls_file_that_cannot_be_read_is_named() -> None:
    from pynsqd.client import ClientOptions

    with pytest.raises(OSError, match=r"TLS CA file /no/such/ca\.pem: No such file"):
        ClientOptions(tls=True, tls_ca_file="/no/such/ca.pem").ssl_context()
    with pytest.raises(OSError, match=r"TLS certificate file /no/cert\.pem: No such file"):
        ClientOptions(tls=True, tls_cert_file="/no/cert.pem", tls_key_file="/no/k").ssl_context()


def test_tls_required_without_cert_is_refused() -> None:
    from pynsqd.cli import UsageError, parse_options

    with pytest.raises(UsageError, match="cannot require TLS client connections without TLS"):
        parse_options(["--tls-required=true"])


# -- independent clients ----------------------------------------------------------------------


def test_pynsq_over_tls(make_nsqd: MakeNSQD, certs: Certs) -> None:
    import nsq

    from tests.real_clients import run_tornado
    from tests.waiting import wait_for_async as wait_for

    server = make_nsqd(**certs.server_options(tls_required="true"))
    addr = f"127.0.0.1:{server.tcp_port}"
    tls_options = {"ca_certs": certs.ca_file, "cert_reqs": ssl.CERT_REQUIRED}
    bodies = [f"pynsq-tls-{i}".encode() for i in range(50)]

    async def main() -> None:
        received: list[bytes] = []
        writer = nsq.Writer([addr], tls_v1=True, tls_options=tls_options, reconnect_interval=60)
        reader = nsq.Reader(
            topic="tls",
            channel="pynsq",
            message_handler=lambda m: received.append(m.body) or True,
            nsqd_tcp_addresses=[addr],
            max_in_flight=10,
            tls_v1=True,
            tls_options=tls_options,
        )
        try:
            await wait_for(lambda: bool(writer.conns), "the writer to connect")
            await asyncio.sleep(0.2)
            oks: list[Any] = []
            for b in bodies:
                writer.pub("tls", b, callback=lambda conn, data: oks.append(data))
            await wait_for(lambda: len(oks) == len(bodies), "every OK")
            assert all(r == b"OK" for r in oks), oks[:3]
            await wait_for(lambda: len(received) >= len(bodies), "every message")
            assert sorted(received) == sorted(bodies)
        finally:
            reader.close()
            for conn in list(writer.conns.values()):
                conn.close()

    run_tornado(main)


def test_gnsq_over_tls(make_nsqd: MakeNSQD, certs: Certs) -> None:
    """gnsq's Consumer over TLS. (gnsq's Producer cannot take the OK that follows the TLS
    handshake: it pops a response queue that does not exist yet, against nsqd as well.)"""
    pytest.importorskip("gevent")

    server = make_nsqd(**certs.server_options(tls_required="true"))
    conn, _ = secure_connect(server, certs.client_context(), tls_v1=True)
    with conn:
        conn.mpub("gnsq-tls", [b"a", b"b", b"c"])
    tls_options = {"ca_certs": certs.ca_file, "cert_reqs": ssl.CERT_REQUIRED}
    received = gnsq_consume(server.tcp_port, "gnsq-tls", 3, tls_v1=True, tls_options=tls_options)
    assert sorted(received) == [b"a", b"b", b"c"]
