"""How long a replicated node takes to join its cluster, and to take publishes, after a restart.

A real etcd and three pynsqd nodes on this machine, a topic at ``replicas=3``. Each cycle kills
node 1 (``kill -9``, or SIGTERM with ``--signal term``), waits until a peer leads its partition
(after kill -9) or until it has left, starts it again on the same ports, and measures:

- **join**: what the node's own "joined ... in N ms" line says (register, read the cluster's
  state, restore its channels' checkpoints);
- **accepting**: from the process's start to its TCP port accepting a connection (Python's
  start-up, opening the data, the join; nothing is accepted before the join);
- **first OK**: from the process's start to the first PUB to its own topic answered OK (after a
  kill -9 the node first catches up with the peer that took its partition over, then takes it
  back; a PUB refused meanwhile is sent again every 5 ms).

Prints the median and the worst of each, in ms (``docs/replication.md`` quotes them).

    .venv/bin/python bench/join_times.py --cycles 20
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
from replication_bench import _etcd, _free_port

NSQD = os.path.join(os.path.dirname(sys.executable), "nsqd")
TOPIC = "orders"
JOINED = re.compile(rb"joined \(etcd [^)]*\) in ([0-9.]+) ms")


def _http(port: int, method: str, path: str) -> Any:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", method=method, data=b"" if method == "POST" else None
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body.startswith(b"{") else body


class Node:
    def __init__(self, base: str, node_id: int, etcd: str) -> None:
        self.node_id = node_id
        self.tcp, self.web = _free_port(), _free_port()
        self.data = os.path.join(base, f"n{node_id}")
        os.makedirs(self.data)
        self.log = os.path.join(base, f"n{node_id}.log")
        self.etcd = etcd
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        with open(self.log, "ab") as f:
            started = time.monotonic()
            self.proc = subprocess.Popen(
                [
                    NSQD,
                    f"--tcp-address=127.0.0.1:{self.tcp}",
                    f"--http-address=127.0.0.1:{self.web}",
                    f"--data-path={self.data}",
                    f"--node-id={self.node_id}",
                    f"--etcd-endpoints={self.etcd}",
                    "--cluster-name=bench",
                    "--retention-time=1h",
                    "--etcd-lease-ttl=2s",
                ],
                stdout=subprocess.DEVNULL,
                stderr=f,
            )
        return started

    def partitions(self) -> list[dict[str, Any]]:
        try:
            return list(_http(self.web, "GET", f"/topic/replication?topic={TOPIC}")["partitions"])
        except OSError:
            return []


def _wait(pred: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.01)
    raise SystemExit(f"timed out waiting for {what}")


def _pub(port: int, body: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"  V2PUB " + TOPIC.encode() + b"\n" + struct.pack(">I", len(body)) + body)
        f = s.makefile("rb")
        size, _ = struct.unpack(">Ii", f.read(8))
        return bytes(f.read(size - 4))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--signal", choices=("kill", "term"), default="kill")
    ap.add_argument("--keep", action="store_true", help="keep the nodes' logs and data")
    args = ap.parse_args()
    base = tempfile.mkdtemp(prefix="pynsqd-join-")
    etcd, url = _etcd(base)
    nodes = [Node(base, i, url) for i in (1, 2, 3)]
    joins: list[float] = []
    accepting: list[float] = []
    first_ok: list[float] = []
    try:
        for n in nodes:
            n.start()
        for n in nodes:
            _wait(lambda n=n: b"joined (etcd" in Path(n.log).read_bytes(), "the first join")
            _wait(lambda n=n: n.partitions() is not None and _ping(n.web), "HTTP")
        for n in nodes:
            _http(n.web, "POST", f"/topic/create?topic={TOPIC}")
        _http(nodes[0].web, "POST", f"/topic/replication?topic={TOPIC}&replicas=3")
        victim, peers = nodes[0], nodes[1:]

        def in_sync() -> bool:
            return any(
                q["partition"] == 1 and q["role"] == "leader" and len(q["isr"]) == 3
                for q in victim.partitions()
            )

        _wait(in_sync, "partition 1 in sync")
        for cycle in range(args.cycles):
            assert _pub(victim.tcp, b"before-%d" % cycle) == b"OK"
            assert victim.proc is not None
            victim.proc.send_signal(signal.SIGKILL if args.signal == "kill" else signal.SIGTERM)
            victim.proc.wait(30)
            if args.signal == "kill":
                _wait(
                    lambda: any(
                        q["partition"] == 1 and q["role"] == "leader"
                        for p in peers
                        for q in p.partitions()
                    ),
                    "a takeover",
                )
            size = os.path.getsize(victim.log)
            started = victim.start()
            while True:
                try:
                    socket.create_connection(("127.0.0.1", victim.tcp), timeout=10).close()
                    break
                except ConnectionRefusedError:
                    time.sleep(0.0005)
            accepting.append((time.monotonic() - started) * 1000)
            while _pub(victim.tcp, b"after-%d" % cycle) != b"OK":
                time.sleep(0.005)
            first_ok.append((time.monotonic() - started) * 1000)
            with open(victim.log, "rb") as f:
                f.seek(size)
                m = JOINED.search(f.read())
            assert m is not None, "no joined line"
            joins.append(float(m.group(1)))
            _wait(in_sync, "partition 1 back in sync")
            print(
                f"cycle {cycle + 1}: join {joins[-1]:.1f} ms, accepting {accepting[-1]:.0f} ms, "
                f"first OK {first_ok[-1]:.0f} ms",
                flush=True,
            )
    finally:
        for n in nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.send_signal(signal.SIGTERM)
                n.proc.wait(30)
        etcd.send_signal(signal.SIGTERM)
        etcd.wait(30)
        if args.keep:
            print(f"logs and data kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    for name, xs in (("join", joins), ("accepting", accepting), ("first OK", first_ok)):
        print(
            f"{name}: median {statistics.median(xs):.1f} ms, worst {max(xs):.1f} ms (n={len(xs)})"
        )


def _ping(port: int) -> bool:
    try:
        return bool(_http(port, "GET", "/ping") == b"OK")
    except OSError:
        return False


if __name__ == "__main__":
    main()
