"""Helpers shared by the integration tests (a test module imports no other test module): HTTP
requests to a server and its stats, a retained log read back, a channel drained over TCP, the
console tools run, nsqadmin in a thread."""

from __future__ import annotations

import http.client
import http.server
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from pynsqd.nsqadmin.options import AdminOptions
from pynsqd.nsqadmin.server import AdminService
from pynsqd.protocol.log_record import Follow, LogRecord, decode_records, follow_after

from ..conftest import LoopThread, ServerThread
from ..processes import NsqdProcess as Proc


class Reply:
    def __init__(self, resp: http.client.HTTPResponse) -> None:
        self.status = resp.status
        self.headers = {k.lower(): v for k, v in resp.getheaders()}
        self.body = resp.read()

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def message(self) -> str:
        assert self.headers["content-type"] == "application/json; charset=utf-8"
        return str(self.json["message"])

    @property
    def v1(self) -> bool:
        return self.headers.get("x-nsq-content-type") == V1


def request(
    server: ServerThread,
    method: str,
    path: str,
    body: bytes | None = None,
    *,
    chunked: bool = False,
    headers: dict[str, str] | None = None,
) -> Reply:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        if chunked:
            conn.putrequest(method, path)
            conn.putheader("Transfer-Encoding", "chunked")
            conn.endheaders()
            data = body or b""
            for i in range(0, len(data), 4096):
                chunk = data[i : i + 4096]
                conn.send(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            conn.send(b"0\r\n\r\n")
        else:
            conn.request(method, path, body=body, headers=headers or {})
        return Reply(conn.getresponse())
    finally:
        conn.close()


def stats(server: ServerThread, query: str = "") -> Any:
    reply = request(server, "GET", "/stats?format=json" + query)
    assert reply.status == 200
    return reply.json


def channel_stats(server: ServerThread, topic: str, channel: str) -> Any:
    for t in stats(server)["topics"]:
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return c
    raise AssertionError(f"no channel {topic}:{channel}")


def read_log(
    server: ServerThread | Proc, query: str, follow: Follow | None = None
) -> tuple[dict[str, str], list[LogRecord]]:
    port = server.http_port
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/topic/log?" + query)
        r = conn.getresponse()
        body = r.read()
        assert r.status == 200, body
        headers = {k.lower(): v for k, v in r.getheaders()}
    finally:
        conn.close()
    assert int(headers["content-length"]) == len(body)
    return headers, list(decode_records(body, follow=follow))


def read_everything(
    server: ServerThread | Proc, topic: str, offset: int = 0, partition: int | None = None
) -> list[LogRecord]:
    out: list[LogRecord] = []
    named = "" if partition is None else f"&partition={partition}"
    while True:
        follow = follow_after(out[-1]) if out else None  # an MPUB's run may go on
        headers, records = read_log(server, f"topic={topic}&offset={offset}{named}", follow)
        out += records
        if not records:
            return out
        offset = int(headers["x-nsq-next-offset"])


def offsets(server: ServerThread | Proc, topic: str) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        conn.request("GET", f"/topic/offsets?topic={topic}")
        r = conn.getresponse()
        body = r.read()
        assert r.status == 200, body
        return dict(json.loads(body))
    finally:
        conn.close()


def read_partitions(server: ServerThread | Proc, topic: str) -> dict[int, list[LogRecord]]:
    """A ``--workers`` node's retained topic: every partition's records, by partition."""
    return {
        p["partition"]: read_everything(server, topic, partition=p["partition"])
        for p in offsets(server, topic)["partitions"]
    }


def drain(server: ServerThread, topic: str, channel: str, n: int) -> list[bytes]:
    """Subscribe, take ``n`` messages, FINning each as it comes (a read times out, failing, if
    one is missing), and check that nothing more comes: the bodies in order of arrival."""
    with server.connect() as c:
        c.sub(topic, channel, rdy=1000)
        got = []
        for _ in range(n):
            m = c.read_message()
            got.append(m.body)
            c.fin(m.id)
        c.expect_nothing()
    return got


BIN = Path(sys.executable).parent


def tool(name: str, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    path = BIN / name
    command = [str(path)] if path.exists() else [sys.executable, "-m", f"pynsqd.tools.{name}"]
    return subprocess.run(
        [*command, *args], input=stdin, capture_output=True, timeout=60, check=False
    )


class AdminThread(LoopThread):
    def __init__(self, **overrides: Any) -> None:
        super().__init__()
        self.opts = AdminOptions(http_address="127.0.0.1:0")
        for key, value in overrides.items():
            setattr(self.opts, key, value)
        self.service: AdminService = self.call_async(self._start)

    async def _start(self) -> AdminService:
        service = AdminService(self.opts)
        await service.start()
        return service

    @property
    def port(self) -> int:
        return int(self.service.address.rsplit(":", 1)[1])

    def request(self, method: str, path: str, body: Any = None, **headers: str) -> tuple[int, Any]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers=headers)
            r = conn.getresponse()
            raw = r.read()
        finally:
            conn.close()
        if r.getheader("Content-Type", "").startswith("application/json"):
            return r.status, json.loads(raw)
        return r.status, raw

    def stop(self) -> None:
        self.stop_loop(self.service.stop)


V1 = "nsq; version=1.0"
