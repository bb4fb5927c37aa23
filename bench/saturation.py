"""Delivery under saturation: Go's writer and reader at once against a server on few cores.

    python bench/saturation.py --go-bin DIR [--cores 1] [--load-cores 1] [--rounds 3]

Go's bench_writer (MPUB, 200-byte messages) and bench_reader (RDY 2500 per connection), each
with --tool-procs connections, run together for --runfor seconds on one fresh topic of a
fresh server pinned to --cores (Go nsqd with GOMAXPROCS to match, pynsqd with ``--workers``
as many), the tools on --load-cores, alternating Go and pynsqd, several rounds. For each it
gives messages accepted (the writer's rate) and delivered (the reader's), their ratio, and
the backlog at the end of that window (queued, in flight and deferred), all from the
server's ``/stats`` counts over the middle 60% of the run (the tools' own rates include their
start and end, which a saturated server stretches; they are kept beside). A server that keeps
pace delivers about what it accepts (issue 53: delivered >= 0.9x accepted); one that lets its
publishers starve its consumers leaves a growing backlog.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cores import free_port, ops, pin, tool, wait_tcp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start(
    kind: str, k: int, args: argparse.Namespace, data: str
) -> tuple[subprocess.Popen[bytes], int, int]:
    tcp, http = free_port(), free_port()
    common = [
        f"--tcp-address=127.0.0.1:{tcp}",
        f"--http-address=127.0.0.1:{http}",
        f"--data-path={data}",
    ]
    env = dict(os.environ)
    if kind == "go":
        cmd = [os.path.join(args.go_bin, "nsqd"), *common]
        env["GOMAXPROCS"] = str(k)
    else:
        cmd = [sys.executable, "-m", "pynsqd", *common, f"--workers={k}", *args.py_flags.split()]
        env["PYTHONPATH"] = os.path.join(ROOT, "src")
    pinned = pin(args.cores)

    def place() -> None:
        if pinned is not None:
            pinned()
        if args.cgroup:
            with open(os.path.join(args.cgroup, "cgroup.procs"), "w") as f:
                f.write(str(os.getpid()))

    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=open(os.path.join(data, "server.log"), "ab"),  # noqa: SIM115
        env=env,
        preexec_fn=place,
    )
    wait_tcp(tcp)
    wait_tcp(http)
    return proc, tcp, http


def cpu_cgroup(percent: int) -> str:
    """A cgroup (v1 cpu controller) that gives its processes ``percent`` of one core, in 20 ms
    periods (5% at least): a server slower than its tools on a host with few cores."""
    path = f"/sys/fs/cgroup/cpu/pynsqd-saturation-{os.getpid()}"
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "cpu.cfs_period_us"), "w") as f:
        f.write("20000")
    with open(os.path.join(path, "cpu.cfs_quota_us"), "w") as f:
        f.write(str(percent * 200))
    return path


def counts(http: int, topic: str) -> tuple[int, int, int]:
    """The topic's messages accepted, its channels' messages finished, and what waits (queued
    and in flight), from ``/stats``: the same fields on Go nsqd and pynsqd."""
    with urllib.request.urlopen(f"http://127.0.0.1:{http}/stats?format=json&topic={topic}") as r:
        doc = json.load(r)
    doc = doc.get("data", doc)
    accepted = finished = waiting = 0
    for t in doc["topics"]:
        if t["topic_name"] != topic:
            continue
        accepted += t["message_count"]
        for c in t["channels"]:
            left = c["depth"] + c["in_flight_count"] + c["deferred_count"]
            waiting += left
            finished += c["message_count"] - left
    return accepted, finished, waiting


def one_round(kind: str, args: argparse.Namespace) -> dict[str, float]:
    k = len(args.cores)
    data = tempfile.mkdtemp(prefix=f"saturation-{kind}-")
    proc, tcp, http = start(kind, k, args, data)
    try:
        w = tool(args.go_bin, "bench_writer", tcp, "sat", args, args.load_cores)
        r = tool(args.go_bin, "bench_reader", tcp, "sat", args, args.load_cores)
        # The server's own counts over the middle of the run (the tools' figures include
        # their start and their end, which a saturated server slows).
        time.sleep(args.runfor * 0.2)
        a0, f0, _ = counts(http, "sat")
        t0 = time.monotonic()
        time.sleep(args.runfor * 0.6)
        a1, f1, waiting = counts(http, "sat")
        span = time.monotonic() - t0
        writer, reader = ops(w), ops(r)
        accepted, delivered = (a1 - a0) / span, (f1 - f0) / span
        return {
            "accepted": accepted,
            "delivered": delivered,
            "ratio": delivered / accepted,
            "backlog": waiting,
            "writer_tool": writer,
            "reader_tool": reader,
        }
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        subprocess.run(["rm", "-rf", data], check=False)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--go-bin", required=True, help="Go NSQ 1.3.0's bin directory")
    p.add_argument("--cores", default="0", help="the server's cores (comma-separated)")
    p.add_argument("--load-cores", default="1", help="the bench tools' cores")
    p.add_argument("--tool-procs", type=int, default=16, help="connections per tool")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--runfor", type=float, default=5.0)
    p.add_argument("--py-flags", default="", help="more pynsqd flags")
    p.add_argument("--only", choices=["go", "py"], help="one server only")
    p.add_argument(
        "--cpu-percent",
        type=int,
        default=0,
        help="the server's share of its core (a cgroup; saturates it where the tools are few)",
    )
    p.add_argument("--out", default="")
    args = p.parse_args()
    args.cgroup = cpu_cgroup(args.cpu_percent) if args.cpu_percent else ""
    args.cores = [int(c) for c in args.cores.split(",")]
    args.load_cores = [int(c) for c in args.load_cores.split(",")]
    kinds = [args.only] if args.only else ["go", "py"]
    runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in kinds}
    for i in range(args.rounds):
        for kind in kinds:
            res = one_round(kind, args)
            runs[kind].append(res)
            print(
                f"round {i + 1} {kind}: accepted {res['accepted']:,.0f}/s delivered "
                f"{res['delivered']:,.0f}/s ({res['ratio']:.2f}x) backlog {res['backlog']:,}",
                flush=True,
            )
    table = {}
    for kind, rs in runs.items():
        table[kind] = {f: statistics.median(r[f] for r in rs) for f in rs[0]}
        t = table[kind]
        print(
            f"{kind} median: accepted {t['accepted']:,.0f}/s delivered {t['delivered']:,.0f}/s "
            f"delivered/accepted {t['ratio']:.2f} backlog {t['backlog']:,.0f}"
        )
    if "go" in table and "py" in table:
        vs = table["py"]["delivered"] / table["go"]["delivered"]
        print(f"pynsqd delivered / Go delivered: {vs:.2f}x")
    if args.cgroup:
        os.rmdir(args.cgroup)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "table": table}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
