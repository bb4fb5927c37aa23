"""``docs/client.md``'s examples (``examples/*.py``) run as written against real servers and
print what the guide says they print."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from ..conftest import ServerThread
from ..integration.lookupd_helpers import LookupdThread
from ..integration.secure_client import AuthServer, Certs
from ..waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def run(example: str, *args: str) -> str:
    res = subprocess.run(
        [sys.executable, str(ROOT / "examples" / example), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_publish_then_consume_with_a_requeue(nsqd: ServerThread) -> None:
    addr = f"127.0.0.1:{nsqd.tcp_port}"
    assert run("publish.py", addr) == "published 5 messages\n"
    topic = nsqd.call(lambda: nsqd.nsqd.topics["orders"])
    assert nsqd.call(lambda: topic.message_count) == 5
    with nsqd.connect() as c:
        c.mpub("jobs", [b"job a", b"retry b", b"job c"])
    assert run("consume.py", addr, "3") == "job a\njob c\nretry b\n"
    ch = nsqd.call(lambda: nsqd.nsqd.topics["jobs"].channels["workers"])
    assert nsqd.call(lambda: (ch.depth, len(ch.in_flight), ch.requeue_count)) == (0, 0, 1)


def test_the_asyncio_client(nsqd: ServerThread) -> None:
    out = run("asyncio_pubsub.py", f"127.0.0.1:{nsqd.tcp_port}")
    assert out == "event 0 attempt 1\nevent 1 attempt 1\nevent 2 attempt 1\n"


def test_consuming_every_node_found_through_nsqlookupd(
    make_nsqd: Callable[..., ServerThread], tmp_path: Path
) -> None:
    lookupd = LookupdThread()
    try:
        host, port = lookupd.tcp_address
        flags = {"lookupd_tcp_addresses": [f"{host}:{port}"], "broadcast_address": "127.0.0.1"}
        nodes = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            nodes.append(make_nsqd(data_path=str(tmp_path / name), **flags))
        for i, node in enumerate(nodes):
            with node.connect() as c:
                c.mpub("clicks", [b"n%d-%d" % (i, j) for j in range(2)])
        wait_for(
            lambda: (
                len(lookupd.call(lambda: lookupd.lookupd.db.find_producers("topic", "clicks", "")))
                == 2
            ),
            "both nodes registered",
        )
        out = run("lookupd_consumer.py", lookupd.http_url.removeprefix("http://"), "4")
        assert out == "2 nodes have topic clicks\nn0-0 n0-1 n1-0 n1-1\n"
    finally:
        lookupd.stop()


def test_tls_and_auth(make_nsqd: Callable[..., ServerThread], tmp_path: Path) -> None:
    certs = Certs(tmp_path)
    authd = AuthServer()
    authd.reply["authorizations"] = [
        {"topic": "secure", "channels": [".*"], "permissions": ["publish"]}
    ]
    try:
        server = make_nsqd(
            **certs.server_options(tls_required="true"), auth_http_addresses=[authd.address]
        )
        out = run("tls_auth.py", f"127.0.0.1:{server.tcp_port}", certs.ca_file, "s3cret")
        assert out == "published over TLS with AUTH\n"
        assert b"secret=s3cret" in authd.requests[-1]["path"].encode()
        assert server.call(lambda: server.nsqd.topics["secure"].message_count) == 1
    finally:
        authd.close()


def test_reading_a_retained_log(make_nsqd: Callable[..., ServerThread]) -> None:
    server = make_nsqd(retention_time=3600.0)
    with server.connect() as c:
        c.mpub("audit", [b"a0", b"a1", b"a2"])
    out = run("read_log.py", f"127.0.0.1:{server.http_port}")
    assert out == "earliest 0 latest 3\n0 a0\n1 a1\n2 a2\n"
