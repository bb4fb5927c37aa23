"""AUTH against a real HTTP auth server in the test: the exact request nsqd sends, the reply's
authorizations deciding PUB/MPUB/DPUB/SUB, every error text, TTL re-fetch, and a slow or broken
auth server that never holds up other clients."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

from pynsqd.protocol import encode
from tests.conftest import ServerThread
from tests.integration.secure_client import AuthServer, Certs, client_id, secure_connect
from tests.processes import free_port
from tests.wire import Conn

MakeNSQD = Callable[..., ServerThread]
ACCEPT = "application/vnd.nsq; version=1.0"


@pytest.fixture
def authd() -> Iterator[AuthServer]:
    server = AuthServer()
    yield server
    server.close()


@pytest.fixture
def server(make_nsqd: MakeNSQD, authd: AuthServer) -> ServerThread:
    return make_nsqd(auth_http_addresses=[authd.address])


def authed_conn(server: ServerThread, secret: bytes = b"s3cret") -> Conn:
    conn = Conn(server.tcp_address)
    reply = conn.identify({"feature_negotiation": True})
    assert isinstance(reply, dict) and reply["auth_required"] is True
    conn.auth(secret)
    json.loads(conn.read_response())
    return conn


def test_auth_disabled(nsqd: ServerThread) -> None:
    with nsqd.connect(feature_negotiation=True) as conn:
        conn.auth(b"x")
        conn.expect_fatal(b"E_AUTH_DISABLED AUTH disabled")


def test_identify_without_auth_server(nsqd: ServerThread) -> None:
    with nsqd.connect() as conn:
        reply = conn.identify({"feature_negotiation": True})
        assert isinstance(reply, dict) and reply["auth_required"] is False


@pytest.mark.parametrize(
    ("cmd", "wire"),
    [
        ("PUB", encode.pub("allowed", b"x")),
        ("MPUB", encode.mpub("allowed", [b"x"])),
        ("DPUB", encode.dpub("allowed", 10, b"x")),
        ("SUB", encode.sub("allowed", "ch")),
    ],
)
def test_auth_first(server: ServerThread, cmd: str, wire: bytes) -> None:
    with server.connect(feature_negotiation=True) as conn:
        conn.send(wire)
        conn.expect_fatal(f"E_AUTH_FIRST AUTH required before {cmd}".encode())


def test_get_request_and_reply(server: ServerThread, authd: AuthServer) -> None:
    with server.connect(feature_negotiation=True) as conn:
        conn.auth(b"s3cr+t x&y=\xff")
        assert conn.read_response() == (
            b'{"identity":"id-1","identity_url":"http://example.com/id-1","permission_count":1}'
        )
        conn.pub("allowed", b"x")
        conn.mpub("allowed_too", [b"a", b"b"])
        conn.dpub("allowed", 5, b"x")
    (req,) = authd.requests
    assert req["method"] == "GET"
    assert req["headers"]["Accept"] == ACCEPT
    path, _, query = req["path"].partition("?")
    assert path == "/auth"
    assert query == "common_name=&remote_ip=127.0.0.1&secret=s3cr%2Bt+x%26y%3D%FF&tls=false"


def test_auth_already_set(server: ServerThread) -> None:
    with authed_conn(server) as conn:
        conn.auth(b"again")
        conn.expect_fatal(b"E_INVALID AUTH already set")


def test_post_request(make_nsqd: MakeNSQD, authd: AuthServer) -> None:
    server = make_nsqd(
        auth_http_addresses=[f"http://{authd.address}/custom/path"],
        auth_http_request_method="post",
    )
    with authed_conn(server, b'se"cret') as conn:
        conn.pub("allowed", b"x")
    (req,) = authd.requests
    assert req["method"] == "POST"
    assert req["path"] == "/custom/path"
    assert req["headers"]["Accept"] == ACCEPT
    assert req["headers"]["Content-Type"] == "application/json"
    assert req["body"] == (
        b'{"common_name":[""],"remote_ip":["127.0.0.1"],"secret":["se\\"cret"],"tls":["false"]}'
    )


def test_permissions(make_nsqd: MakeNSQD, authd: AuthServer) -> None:
    authd.reply = {
        "ttl": 60,
        "identity": "",
        "identity_url": "",
        "authorizations": [
            # unanchored: "test" also matches "mytest2"
            {"topic": "test", "channels": [".*"], "permissions": ["publish"]},
            {"topic": "^sub$", "channels": ["^good$"], "permissions": ["subscribe"]},
            # publish checks channel "": a channel regex that cannot match "" denies it
            {"topic": "^strict$", "channels": ["^ch$"], "permissions": ["publish", "subscribe"]},
        ],
    }
    server = make_nsqd(auth_http_addresses=[authd.address])
    with authed_conn(server) as conn:
        conn.pub("mytest2", b"x")
        conn.send(encode.pub("other", b"x"))
        conn.expect_fatal(b'E_UNAUTHORIZED AUTH failed for PUB on "other" ""')
    with authed_conn(server) as conn:
        conn.send(encode.pub("strict", b"x"))
        conn.expect_fatal(b'E_UNAUTHORIZED AUTH failed for PUB on "strict" ""')
    with authed_conn(server) as conn:
        conn.send(encode.mpub("sub", [b"x"]))
        conn.expect_fatal(b'E_UNAUTHORIZED AUTH failed for MPUB on "sub" ""')
    with authed_conn(server) as conn:
        conn.send(encode.dpub("nope", 1, b"x"))
        conn.expect_fatal(b'E_UNAUTHORIZED AUTH failed for DPUB on "nope" ""')
    with authed_conn(server) as conn:
        conn.sub("strict", "ch")
    with authed_conn(server) as conn:
        conn.sub("sub", "good")
    with authed_conn(server) as conn:
        conn.send(encode.sub("sub", "bad"))
        conn.expect_fatal(b'E_UNAUTHORIZED AUTH failed for SUB on "sub" "bad"')
    with authed_conn(server) as conn:
        conn.send(encode.sub("test", "ch"))  # publish only
        conn.expect_fatal(b'E_UNAUTHORIZED AUTH failed for SUB on "test" "ch"')
    topics = server.call(lambda: list(server.nsqd.topics))
    assert "other" not in topics and "nope" not in topics  # nothing was created


def test_no_authorizations(server: ServerThread, authd: AuthServer) -> None:
    authd.reply = {"ttl": 60, "identity": "x", "authorizations": []}
    with server.connect(feature_negotiation=True) as conn:
        conn.auth(b"x")
        conn.expect_fatal(b"E_UNAUTHORIZED AUTH no authorizations found")


@pytest.mark.parametrize(
    ("status", "reply"),
    [
        (500, {"message": "boom"}),
        (200, b"not json"),
        (200, b"[1, 2]"),
        (200, {"ttl": 0, "authorizations": [{"topic": ".*", "channels": [".*"]}]}),
        (200, {"ttl": 60, "authorizations": [{"topic": "(", "channels": [".*"]}]}),
        (200, {"ttl": 60, "authorizations": [{"topic": ".*", "channels": ["["]}]}),
        (
            200,
            {"ttl": 60, "authorizations": [{"topic": ".*", "channels": [], "permissions": ["x"]}]},
        ),
        (200, {"ttl": "60", "authorizations": []}),
    ],
)
def test_auth_server_errors(
    server: ServerThread, authd: AuthServer, status: int, reply: Any
) -> None:
    authd.status, authd.reply = status, reply
    with server.connect(feature_negotiation=True) as conn:
        conn.auth(b"x")
        conn.expect_fatal(b"E_AUTH_FAILED AUTH failed")  # never the auth server's details


def test_auth_server_down(make_nsqd: MakeNSQD) -> None:
    server = make_nsqd(auth_http_addresses=[f"127.0.0.1:{free_port()}"])
    with server.connect(feature_negotiation=True) as conn:
        conn.auth(b"x")
        conn.expect_fatal(b"E_AUTH_FAILED AUTH failed")


def test_any_auth_server_will_do(make_nsqd: MakeNSQD, authd: AuthServer) -> None:
    server = make_nsqd(auth_http_addresses=[f"127.0.0.1:{free_port()}", authd.address])
    for _ in range(4):  # whichever the random start, the good one answers
        with authed_conn(server) as conn:
            conn.pub("allowed", b"x")


def test_slow_auth_server_times_out_and_blocks_nobody(
    make_nsqd: MakeNSQD, authd: AuthServer
) -> None:
    server = make_nsqd(auth_http_addresses=[authd.address], http_client_request_timeout=1.0)
    authd.delay.clear()
    with server.connect(feature_negotiation=True) as slow:
        slow.send(encode.auth(b"x") + encode.pub("allowed", b"x"))
        # meanwhile the loop serves everyone else
        with Conn(server.tcp_address) as other:
            other.identify({"feature_negotiation": True})
            other.send(encode.pub("allowed", b"x"))
            other.expect_fatal(b"E_AUTH_FIRST AUTH required before PUB")
        body = urllib.request.urlopen(f"{server.http_url}/ping").read()
        assert body == b"OK"
        slow.expect_fatal(b"E_AUTH_FAILED AUTH failed")
    authd.delay.set()


def test_commands_pipelined_after_auth_wait_for_it(server: ServerThread, authd: AuthServer) -> None:
    authd.delay.clear()
    with server.connect(feature_negotiation=True) as conn:
        conn.send(
            encode.auth(b"x")
            + encode.pub("allowed", b"1")
            + encode.mpub("allowed", [b"2", b"3"])
            + encode.sub("allowed", "ch")
            + encode.rdy(5)
        )
        conn.expect_nothing(0.3)  # nothing runs before the auth server answers
        authd.delay.set()
        assert json.loads(conn.read_response())["permission_count"] == 1
        assert conn.read_response() == b"OK"
        assert conn.read_response() == b"OK"
        assert conn.read_response() == b"OK"
        assert sorted(m.body for m in conn.read_messages(3)) == [b"1", b"2", b"3"]


# An authorization's expiry and the re-query it causes are tested on the fake clock:
# tests/unit/server/test_auth_session.py.


def test_stats_show_auth(server: ServerThread) -> None:
    with authed_conn(server) as conn:
        conn.sub("allowed", "ch")
        body = urllib.request.urlopen(f"{server.http_url}/stats?format=json").read()
        entry = json.loads(body)["topics"][0]["channels"][0]["clients"][0]
        assert entry["authed"] is True
        assert entry["auth_identity"] == "id-1"
        assert entry["auth_identity_url"] == "http://example.com/id-1"


def test_tls_client_certificate_common_name(
    make_nsqd: MakeNSQD, authd: AuthServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    certs = Certs(tmp_path_factory.mktemp("certs"))
    server = make_nsqd(
        auth_http_addresses=[authd.address],
        **certs.server_options(
            tls_client_auth_policy="require-verify", tls_root_ca_file=certs.ca_file
        ),
    )
    conn, reply = secure_connect(server, certs.client_context(certs.client), tls_v1=True)
    with conn:
        assert reply["auth_required"] is True
        conn.auth(b"x")
        json.loads(conn.read_response())
        conn.pub("allowed", b"x")
        client = client_id(server)
        assert server.call(lambda: client.authed) is True
    query = dict(parse_qsl(urlsplit(authd.requests[0]["path"]).query, keep_blank_values=True))
    assert query == {
        "common_name": "client-cn",
        "remote_ip": "127.0.0.1",
        "secret": "x",
        "tls": "true",
    }


def test_pynsq_with_auth_secret(server: ServerThread, authd: AuthServer) -> None:
    import asyncio

    import nsq

    from tests.real_clients import run_tornado
    from tests.waiting import wait_for_async as wait_for

    addr = f"127.0.0.1:{server.tcp_port}"

    async def main() -> None:
        received: list[bytes] = []
        writer = nsq.Writer([addr], reconnect_interval=60, auth_secret=b"pynsq-secret")
        reader = nsq.Reader(
            topic="allowed",
            channel="pynsq",
            message_handler=lambda m: received.append(m.body) or True,
            nsqd_tcp_addresses=[addr],
            auth_secret=b"pynsq-secret",
        )
        try:
            await wait_for(lambda: bool(writer.conns), "the writer to connect")
            await asyncio.sleep(0.3)
            oks: list[Any] = []
            writer.pub("allowed", b"hello", callback=lambda c, d: oks.append(d))
            await wait_for(lambda: bool(oks), "the OK")
            assert oks == [b"OK"]
            await wait_for(lambda: bool(received), "the message")
            assert received == [b"hello"]
        finally:
            reader.close()
            for conn in list(writer.conns.values()):
                conn.close()

    run_tornado(main)
    secrets = {
        dict(parse_qsl(urlsplit(r["path"]).query, keep_blank_values=True))["secret"]
        for r in authd.requests
    }
    assert secrets == {"pynsq-secret"}


def test_gnsq_with_auth_secret(server: ServerThread, authd: AuthServer) -> None:
    gevent = pytest.importorskip("gevent")
    import gnsq

    addr = f"127.0.0.1:{server.tcp_port}"
    received: list[bytes] = []
    consumer = gnsq.Consumer(
        "allowed", "gnsq", nsqd_tcp_addresses=[addr], auth_secret=b"gnsq-secret"
    )

    @consumer.on_message.connect
    def handler(consumer: Any, message: Any) -> None:
        received.append(message.body)

    producer = gnsq.Producer([addr], auth_secret=b"gnsq-secret")
    try:
        with gevent.Timeout(30):
            producer.start()
            consumer.start(block=False)
            assert producer.publish("allowed", b"hello") == b"OK"
            while not received:
                gevent.sleep(0.01)
    finally:
        producer.close()
        consumer.close()
        producer.join(timeout=5)
        consumer.join(timeout=5)
    assert received == [b"hello"]
    secrets = {
        dict(parse_qsl(urlsplit(r["path"]).query, keep_blank_values=True))["secret"]
        for r in authd.requests
    }
    assert secrets == {"gnsq-secret"}
