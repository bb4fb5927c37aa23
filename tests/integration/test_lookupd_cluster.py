"""A real cluster on 127.0.0.1: one ``nsqlookupd`` and three ``nsqd`` processes (the console
scripts), and a pynsq Reader that is given only the lookupd's HTTP address."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ..processes import ServerProcess
from ..real_clients import run_tornado
from ..waiting import wait_for
from .lookupd_helpers import get_json, http

TOPIC = "clustered"
PER_NODE = 50


class Cluster:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.processes: list[ServerProcess] = []
        self.lookupd = self._start_lookupd("127.0.0.1:0", "127.0.0.1:0")
        self.lookupd_tcp = self.lookupd.port_of("TCP")
        self.lookupd_http = self.lookupd.port_of("HTTP")
        self.nodes = [self._start_nsqd(i) for i in range(3)]
        self.node_http = [node.port_of("HTTP") for node in self.nodes]

    def _start_lookupd(self, tcp: str, http_address: str) -> ServerProcess:
        proc = ServerProcess(
            "nsqlookupd",
            f"--tcp-address={tcp}",
            f"--http-address={http_address}",
            "--broadcast-address=127.0.0.1",
            "--tombstone-lifetime=2s",
            log=self.tmp / "nsqlookupd.log",
        )
        self.processes.append(proc)
        return proc

    def _start_nsqd(self, i: int) -> ServerProcess:
        data = self.tmp / f"nsqd{i}"
        data.mkdir()
        proc = ServerProcess(
            "nsqd",
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={data}",
            f"--lookupd-tcp-address=127.0.0.1:{self.lookupd_tcp}",
            "--broadcast-address=127.0.0.1",
            log=self.tmp / f"nsqd{i}.log",
        )
        self.processes.append(proc)
        return proc

    @property
    def lookupd_url(self) -> str:
        return f"http://127.0.0.1:{self.lookupd_http}"

    def lookup(self, topic: str = TOPIC) -> dict[str, Any]:
        status, body, _ = http(f"{self.lookupd_url}/lookup?topic={topic}")
        if status != 200:
            return {"channels": [], "producers": []}
        data: dict[str, Any] = json.loads(body)
        return data

    def producer_ports(self) -> list[int]:
        return sorted(p["http_port"] for p in self.lookup()["producers"])

    def restart_lookupd(self) -> None:
        self.lookupd.stop()
        self.lookupd = self._start_lookupd(
            f"127.0.0.1:{self.lookupd_tcp}", f"127.0.0.1:{self.lookupd_http}"
        )

    def stop(self) -> None:
        for proc in self.processes:
            proc.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        yield c
    finally:
        c.stop()


def publish(cluster: Cluster) -> list[bytes]:
    bodies = []
    for i, port in enumerate(cluster.node_http):
        lines = [f"node{i}-{j}".encode() for j in range(PER_NODE)]
        status, body, _ = http(
            f"http://127.0.0.1:{port}/mpub?topic={TOPIC}", "POST", b"\n".join(lines)
        )
        assert status == 200, body
        bodies += lines
    return bodies


def test_reader_given_only_lookupd_consumes_from_every_node(cluster: Cluster) -> None:
    import nsq

    expected = publish(cluster)
    wait_for(lambda: cluster.producer_ports() == sorted(cluster.node_http))

    async def main() -> None:
        received: list[bytes] = []

        def on_message(msg: nsq.Message) -> bool:
            received.append(msg.body)
            return True

        reader = nsq.Reader(
            topic=TOPIC,
            channel="ch",
            message_handler=on_message,
            lookupd_http_addresses=[cluster.lookupd_url],
            lookupd_poll_interval=1,
            max_in_flight=30,
        )
        try:
            deadline = time.monotonic() + 20
            while len(received) < len(expected):
                if time.monotonic() >= deadline:
                    pytest.fail(f"got {len(received)} of {len(expected)}")
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)  # a duplicate would show up here
            assert sorted(received) == sorted(expected)
            assert len(reader.conns) == 3
        finally:
            reader.close()

    run_tornado(main)
    # every node registered the reader's channel
    wait_for(lambda: cluster.lookup()["channels"] == ["ch"])


def test_tombstoned_node_is_hidden_for_the_lifetime(cluster: Cluster) -> None:
    publish(cluster)
    wait_for(lambda: cluster.producer_ports() == sorted(cluster.node_http))
    node = f"127.0.0.1:{cluster.node_http[0]}"
    status, _, _ = http(f"{cluster.lookupd_url}/topic/tombstone?topic={TOPIC}&node={node}", "POST")
    assert status == 200
    assert cluster.node_http[0] not in cluster.producer_ports()
    nodes = get_json(f"{cluster.lookupd_url}/nodes")["producers"]
    flags = {n["http_port"]: dict(zip(n["topics"], n["tombstones"], strict=True)) for n in nodes}
    assert flags[cluster.node_http[0]][TOPIC] is True
    assert flags[cluster.node_http[1]][TOPIC] is False
    # --tombstone-lifetime=2s later it is back
    wait_for(lambda: cluster.producer_ports() == sorted(cluster.node_http))


def test_lookupd_restart_is_healed_by_reregistration(cluster: Cluster) -> None:
    for port in cluster.node_http:
        url = f"http://127.0.0.1:{port}/channel/create?topic={TOPIC}&channel=ch"
        assert http(f"http://127.0.0.1:{port}/topic/create?topic={TOPIC}", "POST")[0] == 200
        assert http(url, "POST")[0] == 200
    wait_for(lambda: cluster.producer_ports() == sorted(cluster.node_http))
    cluster.restart_lookupd()
    # the new nsqlookupd knows nothing until the nodes reconnect and register everything again
    wait_for(lambda: cluster.producer_ports() == sorted(cluster.node_http), timeout=20)
    wait_for(lambda: cluster.lookup()["channels"] == ["ch"])
    assert len(get_json(f"{cluster.lookupd_url}/nodes")["producers"]) == 3


def test_stopped_node_disappears_from_lookup(cluster: Cluster) -> None:
    for port in cluster.node_http:
        assert http(f"http://127.0.0.1:{port}/topic/create?topic={TOPIC}", "POST")[0] == 200
    wait_for(lambda: cluster.producer_ports() == sorted(cluster.node_http), timeout=20)
    cluster.nodes[2].stop()
    rest = sorted(cluster.node_http[:2])
    wait_for(lambda: cluster.producer_ports() == rest)
    nodes = get_json(f"{cluster.lookupd_url}/nodes")["producers"]
    assert sorted(n["http_port"] for n in nodes) == rest
