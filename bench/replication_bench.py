"""Replicated against unreplicated, side by side on this machine (``docs/performance.md``).

Each round runs both set-ups, alternating which goes first, each on fresh servers:

- **unreplicated**: one pynsqd with ``--retention-time=1h`` (a retained topic, as replication
  needs), ``--writers`` MPUB connections;
- **replicated**: a real etcd and three pynsqd nodes on this machine, the topic at
  ``replicas=3`` (min_insync 2, acks=all), the same number of MPUB connections spread over the
  three nodes (each publishes into its own partition); once with ``durability=fsync`` (every
  replica fsyncs each batch before it acknowledges it: the default) and once with
  ``durability=pagecache`` (the copies are in the page cache of three processes: the same
  durability as the unreplicated node, which does not fsync per batch either, and as Kafka's
  acks=all with its default flush settings).

Reported per set-up (medians over the rounds): aggregate MPUB messages/s and single-PUB round
trip p50/p99 (one client, PUB then wait for OK), and the ratios. All processes share this
machine's cores, which is the point of the ratio: three nodes and etcd on two cores.
``--go-nsqd PATH`` adds Go's nsqd (one node, its defaults) to every round, and the MPUB ratios
against it.

    .venv/bin/python bench/replication_bench.py --rounds 5 --runfor 5 \
        --go-nsqd GO_NSQD     # Go nsqd 1.3.0's binary, from NSQ's release

On a many-core machine (issue 52: three nodes of ``--workers 4``, each on its own 4 cores,
against one unreplicated ``--workers 4`` node with retention and Go nsqd on 4 cores):

    python bench/replication_bench.py --cores-per-node 4 --writers 12 --go-nsqd GO_NSQD \
        --setups "unreplicated w4,replicated fsync w4"

``--cores-per-node K`` pins node i (0, 1, 2) to cores iK..iK+K-1 (the unreplicated node and
Go nsqd, with GOMAXPROCS=K, to the first K), etcd and the load to the cores after 3K (all of
them where none are left); a process is pinned from its start, so a node's workers are too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import bench


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _etcd(directory: str, binary: str = "") -> tuple[subprocess.Popen[bytes], str]:
    client, peer = _free_port(), _free_port()
    url = f"http://127.0.0.1:{client}"
    proc = subprocess.Popen(
        [
            binary
            or shutil.which("etcd")
            or os.path.join(
                os.path.dirname(__file__), "..", ".venv", "opt", "etcd", "usr", "bin", "etcd"
            ),
            "--name=b",
            f"--data-dir={directory}/etcd",
            f"--listen-client-urls={url}",
            f"--advertise-client-urls={url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=b=http://127.0.0.1:{peer}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=1) as r:
                if b"true" in r.read():
                    return proc, url
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("etcd did not start")


@contextlib.contextmanager
def _pinned(cores: list[int] | None) -> Iterator[None]:
    """This process (and so what it starts meanwhile, and its children's children) on
    ``cores``; None: as it was."""
    if not cores:
        yield
        return
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)


def _cores(args: argparse.Namespace, i: int) -> list[int] | None:
    """Node ``i``'s cores (0, 1, 2); ``i`` 3: etcd's and the load's."""
    k = args.cores_per_node
    if not k:
        return None
    n = os.cpu_count() or 1
    if i < 3:
        return [c % n for c in range(i * k, (i + 1) * k)]
    return list(range(3 * k, n)) or list(range(n))


def _node(
    extra: str, cores: list[int] | None = None
) -> tuple[subprocess.Popen[bytes], tuple[str, int], tuple[str, int], str]:
    args = argparse.Namespace(mode="logread", nsqd_binary="", nsqd_args=extra)
    with _pinned(cores):
        proc, tcp, http, data = bench._start_nsqd(args)
    assert http is not None
    return proc, tcp, http, data


def _http(addr: tuple[str, int], method: str, path: str) -> Any:
    req = urllib.request.Request(f"http://{addr[0]}:{addr[1]}{path}", method=method, data=b"")
    with urllib.request.urlopen(req, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body.startswith(b"{") else body


def _run(setup: str, args: argparse.Namespace) -> dict[str, float]:
    """One set-up on fresh servers; a set-up ending in " @baseline" runs its nodes on the
    sources at ``--baseline-src`` (PYTHONPATH), for an A/B of a change in one run."""
    if setup.endswith(" @baseline"):
        saved = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = args.baseline_src
        try:
            return _run(setup.removesuffix(" @baseline"), args)
        finally:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved
    procs: list[subprocess.Popen[bytes]] = []
    dirs: list[str] = []
    topic = "rep_bench"
    # "replicated fsync w2": durability fsync, each node --workers=2.
    words = setup.split()
    durability = words[1] if len(words) > 1 and words[0] == "replicated" else ""
    workers = next((int(w[1:]) for w in words[1:] if w[:1] == "w" and w[1:].isdigit()), 1)
    try:
        if setup == "go nsqd":
            args_go = argparse.Namespace(mode="logread", nsqd_binary=args.go_nsqd, nsqd_args="")
            env_before = os.environ.get("GOMAXPROCS")
            if args.cores_per_node:
                os.environ["GOMAXPROCS"] = str(args.cores_per_node)
            try:
                with _pinned(_cores(args, 0)):
                    proc, tcp, http, data = bench._start_nsqd(args_go)
            finally:
                os.environ.pop("GOMAXPROCS", None)
                if env_before is not None:
                    os.environ["GOMAXPROCS"] = env_before
            assert http is not None
            procs.append(proc)
            dirs.append(data)
            tcps = [tcp]
            _http(http, "POST", f"/topic/create?topic={topic}")
        elif words[0] == "unreplicated":
            flags = "--retention-time=1h" + (f" --workers={workers}" if workers > 1 else "")
            proc, tcp, http, data = _node(flags, _cores(args, 0))
            procs.append(proc)
            dirs.append(data)
            tcps = [tcp]
            _http(http, "POST", f"/topic/create?topic={topic}")
        else:
            base = tempfile.mkdtemp(prefix="pynsqd-repbench-")
            dirs.append(base)
            with _pinned(_cores(args, 3)):
                etcd, url = _etcd(base, args.etcd)
            procs.append(etcd)
            nodes = []
            # A node of several workers has a member (a node id) per worker: ids 10 apart.
            bases = [i if workers == 1 else 10 * i for i in (1, 2, 3)]
            for i, b in zip((1, 2, 3), bases, strict=True):
                flags = f"--retention-time=1h --node-id={b} --etcd-endpoints={url}"
                if workers > 1:
                    flags += f" --workers={workers} --host-label=node{i}"
                nodes.append(_node(flags, _cores(args, i - 1)))
            procs += [n[0] for n in nodes]
            dirs += [n[3] for n in nodes]
            tcps = [n[1] for n in nodes]
            for n in nodes:
                _http(n[2], "POST", f"/topic/create?topic={topic}")
            query = f"replicas=3&min_insync={args.min_insync}&durability={durability}"
            _http(nodes[0][2], "POST", f"/topic/replication?topic={topic}&{query}")
            deadline = time.time() + 30
            for i, n in zip(bases, nodes, strict=True):
                # Its own partitions led, 3 in sync: one per worker where each is a member
                # (the copies are named by member, ``node_id``), else the node's one.
                while True:
                    parts = _http(n[2], "GET", f"/topic/replication?topic={topic}")["partitions"]
                    mine = range(i, i + workers) if parts and "node_id" in parts[0] else [i]
                    own = [p for p in parts if p["partition"] in mine and p["role"] == "leader"]
                    if len(own) == len(mine) and all(len(p["isr"]) == 3 for p in own):
                        break
                    if time.time() > deadline:
                        raise RuntimeError(f"node {i} did not lead its partition with 3 in sync")
                    time.sleep(0.05)
        deadline = time.time() + args.runfor
        targets = [
            (bench.writer, (tcps[i % len(tcps)], topic, args.size, args.batch_size, deadline))
            for i in range(args.writers)
        ]
        with _pinned(_cores(args, 3)):
            t0 = time.time()
            counts = bench._run_procs(targets)  # type: ignore[arg-type]
            mpub = sum(counts) / (time.time() - t0)
            lat = sorted(bench.pub_latency(tcps[0], topic, args.size, time.time() + args.runfor))
        return {
            "mpub_msgs_per_s": mpub,
            "pub_p50_ms": lat[len(lat) // 2] * 1e3,
            "pub_p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] * 1e3,
        }
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--runfor", type=float, default=5.0, help="seconds per phase")
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=200, help="messages per MPUB")
    p.add_argument("--writers", type=int, default=3, help="MPUB connections in all")
    p.add_argument("--min-insync", type=int, default=2)
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--cores-per-node",
        type=int,
        default=0,
        help="pin each node to its own K cores (etcd and the load after them); 0: no pinning",
    )
    p.add_argument("--etcd", default="", help="etcd's binary (default: on PATH, or .venv's)")
    p.add_argument(
        "--go-nsqd", default="", help="also run Go's nsqd (unreplicated) in each round: its path"
    )
    p.add_argument(
        "--setups",
        default="unreplicated,replicated fsync,replicated pagecache",
        help="comma-separated set-ups to run (the first is the ratios' base); "
        "'replicated fsync w2' runs each node with --workers=2",
    )
    p.add_argument(
        "--baseline-src",
        default="",
        help="also run each replicated set-up on these sources (a src/ directory): A/B",
    )
    args = p.parse_args(argv)
    setups = args.setups.split(",")
    if args.baseline_src:
        setups += [f"{s} @baseline" for s in setups if s.startswith("replicated")]
    if args.go_nsqd:
        setups.append("go nsqd")
    results: dict[str, list[dict[str, float]]] = {s: [] for s in setups}
    for r in range(args.rounds):
        order = setups[r % len(setups) :] + setups[: r % len(setups)]
        for setup in order:
            res = _run(setup, args)
            results[setup].append(res)
            print(
                f"round {r + 1} {setup:21s} MPUB {res['mpub_msgs_per_s']:10,.0f} msgs/s  "
                f"PUB p50 {res['pub_p50_ms']:.2f} ms p99 {res['pub_p99_ms']:.2f} ms",
                flush=True,
            )
    med = {s: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for s, rs in results.items()}
    u = med[setups[0]]
    print(
        f"\nmedians over {args.rounds} rounds ({args.runfor:g}s phases, {args.size}-byte "
        f"messages, {args.writers} MPUB connections of {args.batch_size}):"
    )
    print("| set-up | MPUB msgs/s | ratio | PUB p50 | PUB p99 | p99 added |")
    print("|---|---|---|---|---|---|")
    names = {
        "unreplicated": "one node, unreplicated",
        "replicated fsync": "three nodes, replicas=3, durability=fsync",
        "replicated pagecache": "three nodes, replicas=3, durability=pagecache",
        "replicated fsync w2": "three nodes of --workers 2, replicas=3, durability=fsync",
        "replicated fsync w4": "three nodes of --workers 4, replicas=3, durability=fsync",
        "unreplicated w4": "one node of --workers 4, unreplicated",
        "go nsqd": "Go nsqd 1.3.0, one node (no retention, no replication)",
    }
    summary: dict[str, dict[str, float]] = {}
    for setup in setups:
        m = med[setup]
        ratio = m["mpub_msgs_per_s"] / u["mpub_msgs_per_s"]
        extra = m["pub_p99_ms"] - u["pub_p99_ms"]
        summary[setup] = {"ratio": ratio, "p99_extra_ms": extra}
        name = names.get(setup.removesuffix(" @baseline"), setup)
        if setup.endswith(" @baseline"):
            name += " (baseline sources)"
        print(
            f"| {name} | {m['mpub_msgs_per_s']:,.0f} | {ratio:.2f}x "
            f"| {m['pub_p50_ms']:.2f} ms | {m['pub_p99_ms']:.2f} ms | {extra:+.2f} ms |"
        )
    if args.go_nsqd:
        go = med["go nsqd"]["mpub_msgs_per_s"]
        print("\nagainst Go nsqd in the same run (MPUB msgs/s ratio):")
        for setup in setups[:-1]:
            print(f"  {names.get(setup, setup)}: {med[setup]['mpub_msgs_per_s'] / go:.2f}x")
    if args.json:
        print(json.dumps({"medians": med, "summary": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
