"""Every core of a host: Go nsqd at GOMAXPROCS=k against pynsqd ``--workers k``.

    python bench/cores.py --go-bin DIR [--cores 1,2,4,8] [--rounds 2] [--runfor 4] [--out F]

For each k the servers run side by side, alternating, fresh each time (new data directory), the
server's processes on cores 0..k-1 (``sched_setaffinity``; Go nsqd also with GOMAXPROCS=k) and
Go's own bench tools on the cores left (``--load-cores``, default the upper half of the host's),
with GOMAXPROCS=--tool-procs so that each tool opens that many connections. Three workloads per
server, each --runfor seconds: ``writer`` (bench_writer: MPUB of 200 messages of 200 bytes on
each connection), then ``reader`` (bench_reader: RDY 2500 per connection, draining the writer's
backlog), then ``pubsub`` (both at once, on a fresh topic). A k whose cores overlap the load's
(``--shared``) runs everything unpinned. Prints a table of medians and the ratio pynsqd / Go,
and writes every figure as JSON to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

OPS = re.compile(r"([0-9.]+)ops/s")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pin(cores: list[int] | None) -> Callable[[], None] | None:
    if not cores:
        return None

    def set_affinity() -> None:
        os.sched_setaffinity(0, cores)

    return set_affinity


def wait_tcp(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def start(
    kind: str,
    k: int,
    go_bin: str,
    cores: list[int] | None,
    data: str,
    py_flags: list[str] | None = None,
) -> tuple[subprocess.Popen[bytes], int]:
    py_flags = py_flags or []
    tcp, http = free_port(), free_port()
    common = [f"--tcp-address=127.0.0.1:{tcp}", f"--http-address=127.0.0.1:{http}"]
    env = dict(os.environ)
    if kind == "go":
        cmd = [os.path.join(go_bin, "nsqd"), *common, f"--data-path={data}"]
        env["GOMAXPROCS"] = str(k)
    else:
        cmd = [sys.executable, "-m", "pynsqd", *common, f"--data-path={data}", f"--workers={k}"]
        cmd += py_flags
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.path.join(ROOT, "src"), env.get("PYTHONPATH", "")) if p
        )
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(data, "server.log"), "ab"),  # noqa: SIM115
        env=env,
        preexec_fn=pin(cores),
    )
    wait_tcp(tcp)
    if kind == "py" and k > 1:
        # Every worker serving (the supervisor's lines), so no connection waits on a start.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with open(os.path.join(data, "server.log"), errors="replace") as f:
                if f.read().count(") serving") >= k:
                    break
            time.sleep(0.05)
    return proc, tcp


def tool(
    go_bin: str, name: str, port: int, topic: str, args: argparse.Namespace, cores: list[int] | None
) -> subprocess.Popen[str]:
    env = dict(os.environ, GOMAXPROCS=str(args.tool_procs))
    return subprocess.Popen(
        [
            os.path.join(go_bin, name),
            f"--nsqd-tcp-address=127.0.0.1:{port}",
            f"--topic={topic}",
            f"--runfor={args.runfor}s",
            "--size=200",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        preexec_fn=pin(cores),
    )


def ops(proc: subprocess.Popen[str]) -> float:
    out, _ = proc.communicate(timeout=120)
    found = OPS.findall(out)
    if not found:
        raise RuntimeError(f"no figure in: {out[-500:]}")
    return float(found[-1])


def one_round(kind: str, k: int, args: argparse.Namespace) -> dict[str, float]:
    shared = k in args.shared
    server_cores = None if shared else list(range(k))
    load_cores = None if shared else args.load_cores
    data = tempfile.mkdtemp(prefix=f"cores-{kind}{k}-")
    proc, port = start(kind, k, args.go_bin, server_cores, data, args.py_flags.split())
    try:
        result = {}
        result["writer"] = ops(tool(args.go_bin, "bench_writer", port, "w", args, load_cores))
        result["reader"] = ops(tool(args.go_bin, "bench_reader", port, "w", args, load_cores))
        w = tool(args.go_bin, "bench_writer", port, "ps", args, load_cores)
        r = tool(args.go_bin, "bench_reader", port, "ps", args, load_cores)
        result["pubsub_writer"] = ops(w)
        result["pubsub_reader"] = ops(r)
        return result
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)


def plot(json_path: str, png_path: str) -> None:
    """Messages per second against cores, one panel per workload, Go beside pynsqd."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(json_path) as f:
        doc = json.load(f)
    rows = doc["table"]
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    fig, axes = plt.subplots(1, len(workloads), figsize=(4 * len(workloads), 3.4))
    for ax, w in zip(axes, workloads, strict=True):
        pts = sorted((r["k"], r["go"], r["py"]) for r in rows if r["workload"] == w)
        ks = [k for k, _, _ in pts]
        ax.plot(ks, [g / 1e3 for _, g, _ in pts], "o-", label="Go nsqd (GOMAXPROCS=k)")
        ax.plot(ks, [p / 1e3 for _, _, p in pts], "s-", label="pynsqd (--workers k)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_title(w)
        ax.set_xlabel("cores (k)")
        ax.set_ylabel("k msgs/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=90)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--go-bin", required=True, help="Go NSQ 1.3.0's bin directory")
    p.add_argument("--cores", default="1,2,4,8", help="server core counts")
    p.add_argument("--shared", default="", help="core counts run unpinned (e.g. 16)")
    p.add_argument("--load-cores", default="", help="cores of the bench tools (default: top half)")
    p.add_argument("--tool-procs", type=int, default=16, help="GOMAXPROCS (connections) per tool")
    p.add_argument(
        "--py-flags",
        default="",
        help="more flags for pynsqd only, e.g. --retention-time=1h (a replayable topic)",
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--runfor", type=float, default=4.0)
    p.add_argument("--out", default="")
    p.add_argument("--plot", nargs=2, metavar=("JSON", "PNG"), help="only draw a run's curves")
    args = p.parse_args()
    if args.plot:
        plot(*args.plot)
        return 0
    n = os.cpu_count() or 1
    args.shared = {int(x) for x in args.shared.split(",") if x}
    ks = [int(x) for x in args.cores.split(",") if x] + sorted(args.shared)
    args.load_cores = (
        [int(x) for x in args.load_cores.split(",")] if args.load_cores else list(range(n // 2, n))
    )
    results: dict[str, dict[str, list[dict[str, float]]]] = {}
    for k in ks:
        for r in range(args.rounds):
            order = ("go", "py") if r % 2 == 0 else ("py", "go")
            for kind in order:
                res = one_round(kind, k, args)
                results.setdefault(str(k), {}).setdefault(kind, []).append(res)
                print(
                    f"k={k} round {r + 1} {kind}: "
                    + " ".join(f"{w}={v:,.0f}" for w, v in res.items()),
                    flush=True,
                )
    table: list[dict[str, Any]] = []
    print(f"\n{'k':>3} {'workload':<14} {'Go nsqd':>12} {'pynsqd':>12} {'ratio':>6}")
    for k in ks:
        runs = results[str(k)]
        for w in runs["go"][0]:
            go = statistics.median(x[w] for x in runs["go"])
            py = statistics.median(x[w] for x in runs["py"])
            table.append({"k": k, "workload": w, "go": go, "py": py, "ratio": py / go})
            print(f"{k:>3} {w:<14} {go:>12,.0f} {py:>12,.0f} {py / go:>6.2f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {
                    "host_cores": n,
                    "load_cores": args.load_cores,
                    "shared": sorted(args.shared),
                    "tool_procs": args.tool_procs,
                    "py_flags": args.py_flags,
                    "runfor": args.runfor,
                    "rounds": args.rounds,
                    "runs": results,
                    "table": table,
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
