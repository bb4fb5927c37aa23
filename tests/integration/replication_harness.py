"""A replicated cluster on this machine for the tests: a real etcd and real pynsqd processes.

``Etcd`` starts Debian's etcd on free 127.0.0.1 ports in a temporary directory; ``Cluster``
starts pynsqd nodes joined to it (distinct ``--node-id``, data directories and ports), kills and
restarts them. ``History`` and ``check`` are the checker, Jepsen's total-queue in small: every
publish is recorded as invoked, then ok or failed; after the faults every partition's committed
log is read from whichever node serves it, and the checker counts what was acknowledged and is
not there (lost), what is there and was never published (unexpected), and one partition offset
holding two different records anywhere (inconsistent). Duplicates are counted, not failed.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import threading
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pynsqd.client.connection import Connection
from pynsqd.client.options import ClientOptions
from pynsqd.protocol.log_record import decode_records

from ..processes import NSQD, START_GUARD, free_port
from ..processes import NsqdProcess as Proc
from ..waiting import wait_for

#: Debian's etcd-server: installed (as root), or unpacked into .venv/opt/etcd by scripts/bootstrap.
ETCD = shutil.which("etcd") or str(
    Path(__file__).resolve().parents[2] / ".venv" / "opt" / "etcd" / "usr" / "bin" / "etcd"
)


#: Every node run with ``--workers=N``: a local attack on replicated nodes with workers
#: (``PYNSQD_TEST_NODE_WORKERS=2 scripts/test tests/fault/test_replication.py``), not
#: the suite's (which runs them in ``test_workers.py``).
NODE_WORKERS = int(os.environ.get("PYNSQD_TEST_NODE_WORKERS", "1"))


class PortTaken(Exception):
    """An etcd member exited while starting (its port was taken meanwhile)."""


class Etcd:
    """etcd on this machine: one member, or three (a quorum of two survives one), each on free
    ports of ``host`` (``scripts/bootstrap`` installs Debian's etcd-server)."""

    def __init__(self, directory: Path, host: str = "127.0.0.1", members: int = 1) -> None:
        if not Path(ETCD).exists():
            pytest.fail("etcd is not installed: scripts/bootstrap installs etcd-server (as root)")
        self.directory = directory
        self.host = host
        self.names = ["a", "b", "c"][:members]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.log = (self.directory / "etcd.log").open("ab")
        for attempt in range(3):
            # A port found free may be taken by a parallel test before etcd binds it: etcd
            # exits at once, and starts again on other ports (with a data directory of its own).
            self.client = {n: free_port() for n in self.names}
            self.peer = {n: free_port() for n in self.names}
            self.urls = [f"http://{host}:{self.client[n]}" for n in self.names]
            self.url = self.urls[0]
            self.data_tag = f"-{attempt}" if attempt else ""
            try:
                self.start()
                return
            except PortTaken:
                self.stop(signal.SIGKILL)
                self.procs.clear()
            except BaseException:
                self.stop(signal.SIGKILL)
                raise
        pytest.fail("etcd could not bind free ports three times; see etcd.log")

    def start(self) -> None:
        """Start every member that is not running (again on its data, after a kill or a stop)."""
        if self.log.closed:
            self.log = (self.directory / "etcd.log").open("ab")
        initial = ",".join(f"{n}=http://{self.host}:{self.peer[n]}" for n in self.names)
        for n in self.names:
            if n in self.procs and self.procs[n].poll() is None:
                continue
            client, peer = (
                f"http://{self.host}:{self.client[n]}",
                f"http://{self.host}:{self.peer[n]}",
            )
            self.procs[n] = subprocess.Popen(
                [
                    ETCD,
                    f"--name={n}",
                    f"--data-dir={self.directory / ('etcd-' + n + self.data_tag)}",
                    f"--listen-client-urls={client}",
                    f"--advertise-client-urls={client}",
                    f"--listen-peer-urls={peer}",
                    f"--initial-advertise-peer-urls={peer}",
                    f"--initial-cluster={initial}",
                ],
                stdout=subprocess.DEVNULL,
                stderr=self.log,
            )

        def elected() -> bool:
            if any(p.poll() is not None for p in self.procs.values()):
                raise PortTaken
            return self.leader() is not None

        wait_for(elected, "etcd to elect a leader", 30)

    def _status(self, name: str) -> dict[str, Any] | None:
        if self.procs[name].poll() is not None:
            return None
        conn = http.client.HTTPConnection(self.host, self.client[name], timeout=1)
        try:
            conn.request("POST", "/v3/maintenance/status", body=b"{}")
            doc: dict[str, Any] = json.loads(conn.getresponse().read())
            return doc
        except (OSError, ValueError):
            return None
        finally:
            conn.close()

    def leader(self) -> str | None:
        """The name of the member that leads (None while there is no leader)."""
        for n in self.names:
            st = self._status(n)
            if st is not None and st.get("leader") and st["leader"] == st["header"]["member_id"]:
                return n
        return None

    def kill(self, name: str) -> None:
        self.procs[name].send_signal(signal.SIGKILL)
        self.procs[name].wait(timeout=20)

    def stop(self, sig: int = signal.SIGTERM) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(sig)
                p.wait(timeout=20)
        self.log.close()


class Node:
    def __init__(self, cluster: Cluster, node_id: int) -> None:
        self.cluster = cluster
        self.node_id = node_id
        #: Its members of the cluster (``--workers N``: a worker each, node ids ``--node-id``
        #: + i, the first ``10 * node_id`` so that nodes' ids never meet); one process: itself.
        workers = cluster.workers
        self.base_id = node_id if workers == 1 else 10 * node_id
        self.member_ids = [self.base_id + i for i in range(workers)]
        self.data = cluster.directory / f"node{node_id}"
        self.data.mkdir(exist_ok=True)
        self.log = cluster.directory / f"node{node_id}.log"
        self.log.touch()
        self.proc: Proc | NsProc | None = None
        #: Stopped by SIGSTOP: its sockets accept, nothing answers.
        self.paused = False
        #: Where it listens: 127.0.0.1, or its own address inside a network namespace.
        self.host = "127.0.0.1"
        self.netns = ""

    def start(self) -> None:
        if self.netns:
            self.proc = NsProc(self, *self.cluster.flags(self.node_id))
        else:
            self.proc = Proc(self.data, self.log, *self.cluster.flags(self.node_id))

    @property
    def joined(self) -> bool:
        """This run of the node has joined the cluster (it listens before it has: the test
        must not place a topic before every node is a member)."""
        text = self.log.read_text(errors="replace")
        if "WORKERS: " not in text:
            return "joined (etcd" in text.rpartition("INFO: nsqd v")[2]
        # --workers: every worker is a member of the cluster, each joins
        lines = text.splitlines()
        for i in range(self.cluster.workers):
            mine = "\n".join(line for line in lines if f" w{i}]" in line)
            if "joined (etcd" not in mine.rpartition("INFO: nsqd v")[2]:
                return False
        return True

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.p.poll() is None and not self.paused

    @property
    def store(self) -> Path:
        """Where the node keeps its logs (``--workers``: worker 0's directory)."""
        return self.data / "worker-0" if self.cluster.workers > 1 else self.data

    @property
    def stores(self) -> list[Path]:
        """Where each of its members keeps its logs (``--workers``: each worker's directory)."""
        if self.cluster.workers == 1:
            return [self.data]
        return [self.data / f"worker-{i}" for i in range(self.cluster.workers)]

    def send_signal(self, sig: int) -> None:
        """``sig`` to the node: its process, and with ``--workers`` its workers too (but
        SIGTERM, which the supervisor passes on itself)."""
        assert self.proc is not None
        pid = self.proc.p.pid
        workers: list[int] = []
        if self.cluster.workers > 1 and sig != signal.SIGTERM:
            out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
            workers = [int(x) for x in out.stdout.split()]
        for w in workers if sig != signal.SIGCONT else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, sig)
        self.proc.p.send_signal(sig)
        for w in workers if sig == signal.SIGCONT else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, sig)

    def pause(self) -> None:
        """SIGSTOP: the process holds its sockets and answers nothing."""
        self.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.send_signal(signal.SIGCONT)
        self.paused = False

    def kill(self, sig: int = signal.SIGKILL) -> None:
        assert self.proc is not None
        self.send_signal(sig)
        self.proc.p.wait(timeout=20)
        self.proc.log_file.close()

    def http(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, bytes]:
        assert self.proc is not None
        conn = http.client.HTTPConnection(self.host, self.proc.http_port, timeout=15)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.read()
        finally:
            conn.close()

    def get_with_headers(self, path: str) -> tuple[int, bytes, dict[str, str]]:
        assert self.proc is not None
        conn = http.client.HTTPConnection(self.host, self.proc.http_port, timeout=15)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            return r.status, r.read(), dict(r.getheaders())
        finally:
            conn.close()

    def json(self, method: str, path: str) -> Any:
        status, body = self.http(method, path)
        assert status == 200, (status, body)
        return json.loads(body)


class NsProc:
    """A pynsqd process inside its node's network namespace, listening on the node's address."""

    def __init__(self, node: Node, *flags: str) -> None:
        self.log_file = node.log.open("ab")
        start = node.log.stat().st_size
        self.p = subprocess.Popen(
            [
                "ip",
                "netns",
                "exec",
                node.netns,
                NSQD,
                f"--tcp-address={node.host}:0",
                f"--http-address={node.host}:0",
                f"--data-path={node.data}",
                *flags,
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log_file,
        )
        ports: dict[str, int] = {}
        pattern = re.compile(rf"(TCP|HTTP): listening on {re.escape(node.host)}:(\d+)")

        def listening() -> bool:
            assert self.p.poll() is None, node.log.read_text()
            text = node.log.read_bytes()[start:].decode(errors="replace")
            ports.update((k, int(v)) for k, v in pattern.findall(text))
            return len(ports) == 2

        try:
            wait_for(listening, "nsqd to listen in its namespace", START_GUARD)
        except BaseException:
            self.p.kill()
            self.p.wait(timeout=20)
            self.log_file.close()
            raise
        self.port, self.http_port = ports["TCP"], ports["HTTP"]


class Network:
    """Each node in a network namespace of its own, joined by a bridge (made by the test, as
    root): ``cut`` drops a node's traffic to and from chosen addresses with iptables inside its
    namespace (a silent partition), ``heal`` restores it. etcd listens on the bridge's
    ``ETCD`` address, the test itself reaches the nodes from the bridge's ``HARNESS`` address,
    so cutting a node from etcd leaves the test able to watch it.

    Two things the kernel does that would make the network itself fail the tests: a bridge
    whose address is not set takes the lowest address of its ports, so it changes as nodes join
    and a node's cached ARP entry for etcd then points at an address the bridge no longer
    answers (frames to it are "for another host" and dropped); so the bridge's address is set.
    And a deleted namespace is torn down in the background, its veth pair lingering for
    seconds to minutes; so each Network has names of its own, and ``close`` deletes each veth
    pair itself (which is immediate) before the namespace."""

    _made = 0

    def __init__(self) -> None:
        if os.geteuid() != 0 or shutil.which("iptables") is None:
            pytest.skip("network partitions need root and iptables (scripts/bootstrap as root)")
        Network._made += 1
        # Names of its own per parallel worker (gw0, gw1, ...) and per network it makes.
        worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
        number = 20 + (worker % 7) * 30 + Network._made % 30
        self.tag = f"{number}"
        self.prefix = f"10.{self.tag}.77"
        self.bridge = f"brpq{self.tag}"
        self.harness = f"{self.prefix}.254"
        self.etcd = f"{self.prefix}.253"
        #: Locally administered, fixed: the bridge keeps it whatever ports join.
        self.address = f"02:70:71:{number:02x}:77:fe"
        self.namespaces: list[str] = []
        self.veths: list[str] = []
        # A run killed before its close left these names behind: they go first.
        subprocess.run(["ip", "link", "del", self.bridge], check=False, capture_output=True)
        _ip("link", "add", self.bridge, "address", self.address, "type", "bridge")
        _ip("addr", "add", f"{self.harness}/24", "dev", self.bridge)
        _ip("addr", "add", f"{self.etcd}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def add(self, node: Node) -> None:
        ns = f"pq{self.tag}n{node.node_id}"
        veth = f"vpq{self.tag}n{node.node_id}"
        subprocess.run(["ip", "link", "del", veth], check=False, capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        _ip("netns", "add", ns)
        self.namespaces.append(ns)
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        self.veths.append(veth)
        _ip("link", "set", veth, "master", self.bridge)
        _ip("link", "set", veth, "up")
        node.host = f"{self.prefix}.{node.node_id}"
        node.netns = ns
        _ip("-n", ns, "addr", "add", f"{node.host}/24", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("-n", ns, "link", "set", "lo", "up")

    def bridge_address(self) -> str:
        shown = subprocess.run(
            ["ip", "-j", "link", "show", self.bridge], check=True, capture_output=True, text=True
        )
        return str(json.loads(shown.stdout)[0]["address"])

    def cut(self, node: Node, addresses: list[str]) -> None:
        for addr in addresses:
            for chain, side in (("INPUT", "-s"), ("OUTPUT", "-d")):
                rule = ["-A", chain, side, addr, "-j", "DROP"]
                subprocess.run(["ip", "netns", "exec", node.netns, "iptables", *rule], check=True)

    def heal(self, node: Node) -> None:
        subprocess.run(["ip", "netns", "exec", node.netns, "iptables", "-F"], check=True)

    def close(self) -> None:
        for veth in self.veths:
            subprocess.run(["ip", "link", "del", veth], check=False, capture_output=True)
        for ns in self.namespaces:
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], check=False, capture_output=True)


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


class Cluster:
    def __init__(
        self,
        directory: Path,
        etcd: Etcd,
        size: int,
        *extra: str,
        network: Network | None = None,
    ) -> None:
        self.directory = directory
        self.etcd = etcd
        self.extra = extra
        counts = [int(f.split("=", 1)[1]) for f in extra if f.startswith("--workers=")]
        self.workers = counts[-1] if counts else NODE_WORKERS
        self.nodes = [Node(self, i + 1) for i in range(size)]
        try:
            for n in self.nodes:
                if network is not None:
                    network.add(n)
                n.start()
            for n in self.nodes:
                wait_for(lambda n=n: n.joined, f"node {n.node_id} to join the cluster", 60)
        except BaseException:
            self.stop()
            raise

    def flags(self, node_id: int) -> list[str]:
        node = self.node(node_id)
        # In a namespace of its own a node is reached at its own address (nsqlookupd gives
        # consumers the broadcast address).
        own = [f"--broadcast-address={node.host}"] if node.netns else []
        # A node of several workers has a host of its own: its workers' copies go to the
        # other nodes first (the nodes of a test share one machine).
        host = [f"--host-label=node{node_id}"] if self.workers > 1 else []
        return [
            f"--node-id={node.base_id}",
            *own,
            *host,
            *(f"--etcd-endpoints={url}" for url in self.etcd.urls),
            "--cluster-name=test",
            "--retention-time=1h",
            "--etcd-lease-ttl=2s",
            "--replica-replace-after=10s",  # five leases, as it was tied to before
            *([f"--workers={NODE_WORKERS}"] if NODE_WORKERS > 1 and not flagged(self) else []),
            *self.extra,
        ]

    def node(self, node_id: int) -> Node:
        return self.nodes[node_id - 1]

    def owner(self, member: int) -> Node:
        """The node whose member (its own partition) ``member`` is."""
        return next(n for n in self.nodes if member in n.member_ids)

    @property
    def origins(self) -> list[int]:
        """Every member's partition (a node's, or with ``--workers`` each of its workers')."""
        return [m for n in self.nodes for m in n.member_ids]

    def live(self) -> list[Node]:
        return [n for n in self.nodes if n.alive]

    def stop(self) -> None:
        for n in self.nodes:
            if n.paused and n.proc is not None:
                n.resume()
            if n.alive:
                n.kill(signal.SIGTERM)

    def partition(self, topic: str, origin: int) -> dict[str, Any] | None:
        """The partition as its serving leader reports it (None: no live node leads it)."""
        for n in self.live():
            doc = n.json("GET", f"/topic/replication?topic={topic}")
            for p in doc["partitions"]:
                if p["partition"] == origin and p["role"] == "leader":
                    # ``node``: the node; ``member``: its worker's node id (--workers)
                    return dict(p, node=n.node_id, member=p.get("node_id", n.node_id))
        return None

    def read_own(self, topic: str, node: Node) -> list[tuple[int, bytes, bytes]]:
        """The committed records of ``node``'s own partitions (one per member), as it serves
        them, partition after partition."""
        return [r for m in node.member_ids for r in self.read_partition(topic, m, node)]

    def committed_own(self, topic: str, node: Node) -> int:
        """How many records ``node``'s own partitions committed, as their leaders report."""
        parts = [self.partition(topic, m) for m in node.member_ids]
        return sum(p["committed"] for p in parts if p is not None)

    def read_partition(self, topic: str, origin: int, node: Node) -> list[tuple[int, bytes, bytes]]:
        """Every committed record of a partition, as ``node`` serves it: (offset, id, body)."""
        out: list[tuple[int, bytes, bytes]] = []
        q = {"topic": topic, "partition": str(origin)}
        status, body = node.http("GET", "/topic/offsets?" + urllib.parse.urlencode(q))
        assert status == 200, body
        offsets = json.loads(body)
        offset = offsets["earliest"]
        while offset < offsets["latest"]:
            q["offset"] = str(offset)
            status, data = node.http("GET", "/topic/log?" + urllib.parse.urlencode(q))
            assert status == 200, data
            records = list(decode_records(data))
            assert records, f"no records at {offset} of {offsets}"
            out.extend((r.offset, r.id, r.body) for r in records)
            offset = records[-1].offset + 1
        return out


def power_loss(cluster: Cluster, ledger: Path) -> int:
    """Every node killed at once, then each retained-log segment zeroed after the end its last
    fsync covered (``storage/durable.py`` records them in ``ledger``): what losing the page cache
    does to an append-only file. Returns the bytes taken away (other than zeros)."""
    for n in cluster.nodes:
        if n.alive:
            n.send_signal(signal.SIGKILL)
    for n in cluster.nodes:
        if n.proc is not None:
            n.proc.p.wait(timeout=20)
            n.proc.log_file.close()
    segments = [
        seg
        for n in cluster.nodes
        for store in n.stores
        for seg in [*store.glob("*.log/*.log"), *store.glob("replicas/*/*/*.log")]
    ]
    return lose_unsynced(segments, ledger)


def lose_unsynced(segments: list[Path], ledger: Path) -> int:
    """Each segment zeroed after the end its last fsync covered (``storage/durable.py`` records
    them in ``ledger``): what losing the page cache does to an append-only file. The processes
    are dead. Returns the bytes taken away (other than zeros); the ledger then holds the sizes
    now on disk."""
    durable: dict[str, int] = {}
    if ledger.exists():
        for line in ledger.read_text().splitlines():
            path, _, synced = line.rpartition("\t")
            durable[path] = int(synced)
    lost = 0
    for seg in segments:
        keep = durable.get(str(seg), 0)
        size = seg.stat().st_size
        if size > keep:
            # What was written after the last fsync is gone: zeros in its place (what a
            # file with zeros written ahead, ``TopicLog.preallocate``, is left with; XFS
            # leaves a grown file so too). The recovery takes a zero tail as the end.
            with seg.open("r+b") as f:
                f.seek(keep)
                gone = f.read()
                f.seek(keep)
                f.write(bytes(size - keep))
            lost += len(gone) - gone.count(0)
    ledger.write_text("")  # the sizes now on disk are the durable ones
    with ledger.open("a") as f:
        for seg in segments:
            f.write(f"{seg}\t{seg.stat().st_size}\n")
    return lost


def partition_digest(cluster: Cluster, topic: str, origin: int, node: Node) -> tuple[int, str]:
    """(next offset, sha256) of a partition's committed records as ``node`` serves them: the
    record bytes themselves, so equal digests mean byte-identical copies."""
    digest = hashlib.sha256()
    offset = 0
    while True:
        q = {"topic": topic, "partition": str(origin), "offset": str(offset)}
        q["max_bytes"] = str(16 << 20)
        status, body, headers = node.get_with_headers("/topic/log?" + urllib.parse.urlencode(q))
        assert status == 200, body
        if not body:
            return offset, digest.hexdigest()
        digest.update(body)
        offset = int(headers["X-Nsq-Next-Offset"])


@dataclass
class History:
    """Every publish: invoked, then ``ok`` (acknowledged) or ``failed``/``unknown``."""

    ok: set[bytes] = field(default_factory=set)
    failed: set[bytes] = field(default_factory=set)
    invoked: set[bytes] = field(default_factory=set)
    #: The fault phase the test is in (it sets it; 0: none): publishes and OKs are tagged with
    #: it, so the order of a fault and an OK is read from the history, not from a clock.
    phase: int = 0
    #: Which node answered each acknowledged body, and in which phase.
    acked_by: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    #: The phase each body's publish was sent in.
    sent_in: dict[bytes, int] = field(default_factory=dict)
    #: The producers are threads: each write, and each read that walks the history, holds it.
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def sent(self, batch: list[bytes]) -> None:
        """A publish of ``batch`` is about to go out, in the current phase."""
        with self.lock:
            self.invoked.update(batch)
            self.sent_in.update((b, self.phase) for b in batch)

    def acknowledged(self, batch: list[bytes], node_id: int) -> None:
        """Node ``node_id`` answered OK to ``batch``, in the current phase."""
        with self.lock:
            self.ok.update(batch)
            at = (node_id, self.phase)
            self.acked_by.update((b, at) for b in batch)

    def not_acknowledged(self, batch: list[bytes]) -> None:
        """The publish of ``batch`` failed, or its answer never came: it may or may not be in."""
        with self.lock:
            self.failed.update(batch)

    def acknowledged_so_far(self) -> set[bytes]:
        with self.lock:
            return set(self.ok)

    def acked_in(self, node_id: int, phase: int) -> list[bytes]:
        """The bodies sent in ``phase`` and answered OK by ``node_id`` in that same phase."""
        with self.lock:
            return [
                b
                for b, at in self.acked_by.items()
                if at == (node_id, phase) and self.sent_in[b] == phase
            ]


@dataclass
class Verdict:
    lost: list[bytes]
    unexpected: list[bytes]
    inconsistent: list[tuple[int, int]]
    duplicates: int
    recovered: int
    read: int


def check(
    history: History, reads: dict[tuple[int, str], list[tuple[int, bytes, bytes]]]
) -> Verdict:
    """``reads``: for each (origin, reader) the records of that partition as one node served
    them. Every reader of one partition must agree offset by offset."""
    seen: Counter[bytes] = Counter()
    at: dict[tuple[int, int], tuple[bytes, bytes]] = {}
    inconsistent: list[tuple[int, int]] = []
    by_partition: dict[int, set[bytes]] = {}
    for (origin, _), records in reads.items():
        bodies = by_partition.setdefault(origin, set())
        for offset, msg_id, body in records:
            key = (origin, offset)
            if key in at and at[key] != (msg_id, body):
                inconsistent.append(key)
            at.setdefault(key, (msg_id, body))
            bodies.add(body)
    for (_origin, _offset), (_, body) in at.items():
        seen[body] += 1
    present = set(seen).union(*by_partition.values())
    lost = sorted(history.ok - present)
    unexpected = sorted(present - history.invoked)
    return Verdict(
        lost=lost,
        unexpected=unexpected,
        inconsistent=inconsistent,
        duplicates=sum(c - 1 for c in seen.values() if c > 1),
        recovered=len(history.failed & present),
        read=len(present),
    )


def wait_leader(cluster: Cluster, topic: str, origin: int, timeout: float = 20) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def led() -> bool:
        p = cluster.partition(topic, origin)
        if p is not None:
            found.update(p)
        return p is not None

    wait_for(led, f"a leader of partition {topic}/{origin}", timeout=timeout)
    return found


def led_elsewhere(cluster: Cluster, victim: Node, topic: str = "orders") -> bool:
    """Some node other than ``victim`` leads each of ``victim``'s partitions (one per member;
    ``victim`` is not asked: it may be cut off)."""
    led = {
        q["partition"]
        for n in cluster.nodes
        if n is not victim and n.alive
        for q in n.json("GET", f"/topic/replication?topic={topic}")["partitions"]
        if q["role"] == "leader"
    }
    return set(victim.member_ids) <= led


def replicate(cluster: Cluster, topic: str = "orders", **settings: object) -> None:
    """``topic`` created on every node and replicated (replicas=3 unless ``settings`` say),
    each partition led by its origin with all three in sync."""
    query = "&".join(f"{k}={v}" for k, v in {"replicas": 3, **settings}.items())
    for n in cluster.nodes:
        status, body = n.http("POST", f"/topic/create?topic={topic}")
        assert status == 200, body
    status, body = cluster.node(1).http("POST", f"/topic/replication?topic={topic}&{query}")
    assert status == 200, body
    for n in cluster.nodes:
        for member in n.member_ids:
            wait_in_sync(cluster, topic, member)


def flagged(cluster: Cluster) -> bool:
    return any(f.startswith("--workers=") for f in cluster.extra)


def wait_in_sync(cluster: Cluster, topic: str, origin: int, size: int = 3) -> None:
    def full() -> bool:
        p = cluster.partition(topic, origin)
        return p is not None and p["member"] == origin and len(p["isr"]) == size

    # A guard against a hang (60 s: a loaded machine starts three nodes slowly), not a wait.
    wait_for(full, f"partition {topic}/{origin} led by its origin with {size} in sync", 60)


def wait_node_in_sync(cluster: Cluster, topic: str, node: Node, size: int = 3) -> None:
    """Each of ``node``'s partitions (one per member) led by its origin with ``size`` in
    sync."""
    for member in node.member_ids:
        wait_in_sync(cluster, topic, member, size)


#: The topic the producers publish to.
TOPIC = "orders"


class Producer(threading.Thread):
    """Publishes unique bodies to the live nodes in turn, TCP PUB and MPUB; a failure moves it
    to the next node (NSQ's standing advice). Every attempt is in the history."""

    def __init__(self, cluster: Cluster, history: History, name: str) -> None:
        super().__init__(daemon=True)
        self.cluster = cluster
        self.history = history
        self.tag = name
        self.stopping = threading.Event()
        self.seq = 0

    def run(self) -> None:
        rng = random.Random(self.tag)
        while not self.stopping.is_set():
            live = self.cluster.live()
            if not live:
                continue
            node = rng.choice(live)
            try:
                assert node.proc is not None
                conn = Connection(
                    f"{node.host}:{node.proc.port}", ClientOptions(connect_timeout=2, timeout=10)
                ).connect()
            except (OSError, ConnectionError, AssertionError):
                continue
            try:
                for _ in range(50):
                    if self.stopping.is_set():
                        break
                    batch = [
                        f"{self.tag}-{self.seq + i}".encode() for i in range(rng.choice((1, 10)))
                    ]
                    self.seq += len(batch)
                    self.history.sent(batch)
                    try:
                        if len(batch) == 1:
                            conn.pub(TOPIC, batch[0])
                        else:
                            conn.mpub(TOPIC, batch)
                    except Exception:
                        self.history.not_acknowledged(batch)
                        break
                    self.history.acknowledged(batch, node.node_id)
            finally:
                conn.close()


@contextlib.contextmanager
def producing(cluster: Cluster, history: History, tag: str = "p") -> Iterator[None]:
    """Two producers publishing into ``history`` for the duration of the block."""
    producers = [Producer(cluster, history, f"{tag}{i}") for i in range(2)]
    for p in producers:
        p.start()
    try:
        yield
    finally:
        for p in producers:
            p.stopping.set()
        for p in producers:
            p.join(30)


def checkpoint(node: Node, holder: int, partition: int | None = None) -> dict[str, Any]:
    """``holder``'s checkpoint of its channels of ``partition`` (as etcd holds it), asked of
    ``node``; ``partition`` None: ``node``'s own (one process: its node id; ``--workers``:
    its first member's)."""
    part = node.base_id if partition is None else partition
    doc = node.json("GET", f"/topic/replication?topic={TOPIC}")
    for p in doc["partitions"]:
        if p["partition"] == part:
            found: dict[str, Any] = p["checkpoints"].get(str(holder), {})
            return found
    return {}
