"""How cost grows: pynsqd beside another nsqd (Go's, say) as the work grows, and
docs/performance.md regenerated from one run.

    scripts/bench-curves [--compare NSQD_BINARY] [--backlog 10000000] [--quick]

Sweeps, each point on a fresh server and data directory, the servers alternating:
- message size: writer throughput (2 connections, MPUB) for 100 B ... 1 MB bodies;
- idle connections: N subscribers (SUB, RDY 1, nothing published) held open; the server's RSS
  and CPU over an idle window;
- topics x channels: N topics with one channel each (10 messages queued in each), idle; RSS and
  CPU over the window;
- disk backlog: N messages queued for a channel (beyond --mem-queue-size: on disk), then
  drained by 2 readers (RDY 2500); fill and drain msgs/s.

Then the side-by-side table of ``bench/bench.py --compare`` (writer, reader, pubsub, single PUB:
medians of --rounds rounds; the latency workload at 1k/10k/50k msgs/s). Writes the plots
(docs/images/perf-*.png), the figures (docs/performance.json) and docs/performance.md. Never part
of the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench as B

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


class Server:
    """One nsqd process (ours unless ``binary``) on ports chosen by the kernel."""

    def __init__(self, binary: str, extra: list[str] | None = None) -> None:
        self.data = tempfile.mkdtemp(prefix="pynsqd-curves-")
        nsqd = binary or shutil.which("nsqd", path=os.path.dirname(sys.executable)) or "nsqd"
        cmd = [
            nsqd,
            "--tcp-address=127.0.0.1:0",
            "--http-address=127.0.0.1:0",
            f"--data-path={self.data}",
            *(extra or []),
        ]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)
        assert self.proc.stderr is not None
        tcp = http = None
        import re

        for raw in self.proc.stderr:
            m = re.search(r"(TCP|HTTP): listening on ([\d.]+):(\d+)", raw.decode(errors="replace"))
            if m and m.group(1) == "TCP":
                tcp = (m.group(2), int(m.group(3)))
            elif m:
                http = (m.group(2), int(m.group(3)))
            if tcp and http:
                break
        if not (tcp and http):
            raise RuntimeError(f"{nsqd} did not start")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        self.tcp, self.http = tcp, http

    def usage(self) -> tuple[float, float]:
        """(CPU seconds so far, current RSS MiB)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        rss = 0.0
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) / 1024
        return cpu, rss

    def post(self, path: str) -> None:
        url = f"http://{self.http[0]}:{self.http[1]}{path}"
        urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30).read()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.data, ignore_errors=True)


def idle_window(srv: Server, secs: float) -> dict[str, float]:
    cpu0, _ = srv.usage()
    time.sleep(secs)  # the measurement itself: what an idle server spends in this window
    cpu1, rss = srv.usage()
    return {"rss_mib": rss, "cpu_pct": (cpu1 - cpu0) / secs * 100}


# -- the sweeps -----------------------------------------------------------------------------------


def size_point(binary: str, size: int, runfor: float) -> dict[str, float]:
    srv = Server(binary)
    try:
        batch = max(1, min(200, (4 << 20) // (size + 4)))
        deadline = time.time() + runfor
        t0 = time.time()
        counts = B._run_procs([(B.writer, (srv.tcp, "sizes", size, batch, deadline))] * 2)
        secs = time.time() - t0
        n = sum(counts)
        _, rss = srv.usage()
        return {"msgs_per_s": n / secs, "mb_per_s": n * size / secs / 1e6, "rss_mib": rss}
    finally:
        srv.stop()


def _hold_connections(addr: tuple[str, int], n: int, ready: Any, done: Any) -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, n + 100)), hard))
    socks = []
    for i in range(n):
        s = socket.create_connection(addr)
        s.sendall(b"  V2" + f"SUB idle ch{i % 10}\n".encode() + b"RDY 1\n")
        B._read_response(s)
        socks.append(s)
    ready.set()
    done.wait()
    for s in socks:
        s.close()


def connections_point(binary: str, n: int, window: float) -> dict[str, float]:
    import multiprocessing as mp

    srv = Server(binary)
    ctx = mp.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_connections, args=(srv.tcp, n, ready, done), daemon=True)
    holder.start()
    try:
        if not ready.wait(300):
            raise RuntimeError(f"{n} connections were not set up")
        return idle_window(srv, window)
    finally:
        done.set()
        holder.join(30)
        srv.stop()


def topics_point(binary: str, n: int, window: float) -> dict[str, float]:
    srv = Server(binary)
    try:
        s = B._identify(B._connect(srv.tcp), {})
        body = b"x" * 100
        payload = b"".join(B._LEN.pack(len(body)) + body for _ in range(10))
        for i in range(n):
            srv.post(f"/topic/create?topic=t{i}")
            srv.post(f"/channel/create?topic=t{i}&channel=c")
            s.sendall(f"MPUB t{i}\n".encode() + B._LEN.pack(len(payload) + 4) + B._LEN.pack(10))
            s.sendall(payload)
            B._read_response(s)
        s.close()
        return idle_window(srv, window)
    finally:
        srv.stop()


def backlog_point(binary: str, total: int) -> dict[str, float]:
    srv = Server(binary)
    try:
        srv.post("/topic/create?topic=backlog")
        srv.post("/channel/create?topic=backlog&channel=ch")
        t0 = time.time()
        B._run_procs([(B.writer_n, (srv.tcp, "backlog", 200, 200, total // 2))] * 2)
        fill = time.time() - t0
        t0 = time.time()
        done = B._run_procs(
            [(B.reader, (srv.tcp, "backlog", "ch", 2500, time.time() + 3600, True))] * 2
        )
        drained = sum(c for c, _ in done)
        secs = max(t for _, t in done) - t0
        _, rss = srv.usage()
        return {
            "fill_msgs_per_s": total / fill,
            "drain_msgs_per_s": drained / secs,
            "drained": drained,
            "rss_mib": rss,
        }
    finally:
        srv.stop()


def sweep(
    name: str,
    xs: list[int],
    servers: dict[str, str],
    point: Callable[[str, int], dict[str, float]],
) -> dict[str, list[dict[str, float]]]:
    out: dict[str, list[dict[str, float]]] = {s: [] for s in servers}
    for x in xs:
        for label, binary in servers.items():
            print(f"-- {name} {x:,}: {label}", flush=True)
            r = point(binary, x)
            r["x"] = x
            out[label].append(r)
            print("   " + "  ".join(f"{k}={v:,.1f}" for k, v in r.items()), flush=True)
    return out


def side_by_side(compare: str, rounds: int, runfor: float) -> dict[str, Any]:
    """bench.py --compare: the table of workloads, medians and ratios."""
    table: dict[str, Any] = {}
    runs = [
        ["--mode", "all", "--rounds", str(rounds)],
        ["--mode", "latency", "--rates", "1000,10000,50000", "--rounds", "3"],
    ]
    go_tools = Path(compare).parent
    if (go_tools / "bench_writer").exists() and (go_tools / "bench_reader").exists():
        # The figures of record drive both servers with Go's own bench_writer/bench_reader.
        runs.append(["--mode", "all", "--rounds", str(rounds), "--go-bench-dir", str(go_tools)])
    for extra in runs:
        cmd = [
            sys.executable,
            str(ROOT / "bench" / "bench.py"),
            "--compare",
            compare,
            "--runfor",
            str(runfor),
            "--json",
            *extra,
        ]
        print("-- " + " ".join(cmd[2:]), flush=True)
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        got = json.loads(out.strip().splitlines()[-1])
        if table:  # the server's CPU and RSS rows are those of the throughput workloads
            got = {k: v for k, v in got.items() if not k.startswith("server.")}
        if "--go-bench-dir" in extra:
            got = {
                f"go_tools.{k}": v
                for k, v in got.items()
                if k.split(".")[0] in ("writer", "reader", "pubsub_in", "pubsub_out")
            }
        table.update(got)
    return table


# -- output ---------------------------------------------------------------------------------------


def plot(results: dict[str, Any], images: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    images.mkdir(parents=True, exist_ok=True)
    made = []
    specs = [
        ("sizes", "msgs_per_s", "message size (bytes)", "writer msgs/s", True),
        ("sizes", "mb_per_s", "message size (bytes)", "writer MB/s", True),
        ("connections", "rss_mib", "idle subscribers", "RSS (MiB)", False),
        ("connections", "cpu_pct", "idle subscribers", "CPU (% of a core)", False),
        ("topics", "rss_mib", "topics (one channel each)", "RSS (MiB)", False),
        ("topics", "cpu_pct", "topics (one channel each)", "CPU (% of a core)", False),
    ]
    for sweep_name, metric, xlabel, ylabel, logx in specs:
        data = results.get(sweep_name)
        if not data:
            continue
        fig, ax = plt.subplots(figsize=(5, 3.2), dpi=100)
        names = {"other": results["meta"].get("other_name", "other")}
        for label, points in data.items():
            ax.plot(
                [p["x"] for p in points],
                [p[metric] for p in points],
                marker="o",
                label=names.get(label, label),
            )
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fname = f"perf-{sweep_name}-{metric.replace('_', '-')}.png"
        fig.savefig(images / fname)
        plt.close(fig)
        made.append(fname)
    return made


def server_name(binary: str) -> str:
    """The other server as people call it: ``Go nsqd 1.3.0`` from its ``--version``."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except OSError:
        return binary
    text = out.stdout + out.stderr
    m = re.search(r"nsqd v(\S+)", text)
    if m is None:
        return binary
    return f"{'Go ' if 'go1' in text else ''}nsqd {m.group(1)}"


def _ratio_rows(table: dict[str, Any], other: str) -> list[str]:
    rows = [f"| workload | pynsqd | {other} | ratio (>1: pynsqd better) |", "|---|---|---|---|"]
    for k, v in table.items():
        if "ratio" in v:
            unit = "µs" if k.endswith("_us") else "msgs/s"
            rows.append(
                f"| {k} | {v['pynsqd']:,.0f} {unit} | {v['other']:,.0f} {unit} | "
                f"{v['ratio']:.2f}x |"
            )
        else:
            rows.append(f"| {k} | {v['pynsqd']:,.1f} | {v['other']:,.1f} | |")
    return rows


def _sweep_rows(results: dict[str, Any], name: str, metrics: list[str], xlabel: str) -> list[str]:
    data = results.get(name)
    if not data:
        return []
    labels = list(data)
    names = {"pynsqd": "pynsqd", "other": results["meta"].get("other_name", "other")}
    head = (
        f"| {xlabel} | "
        + " | ".join(f"{m} ({names.get(lab, lab)})" for m in metrics for lab in labels)
        + " |"
    )
    rows = [head, "|" + "---|" * (1 + len(metrics) * len(labels))]
    for i, p in enumerate(data[labels[0]]):
        cells = [f"{data[lab][i][m]:,.1f}" for m in metrics for lab in labels]
        rows.append(f"| {p['x']:,} | " + " | ".join(cells) + " |")
    return rows


def shown(path: str) -> str:
    """A compared server's path as the docs show it: a path in this repository as it is, any
    other as ``GO_NSQD`` (a reader's clone has no file of the machine that ran it)."""
    inside = not Path(path).is_absolute() and not path.startswith("..")
    return path if inside else "GO_NSQD"


def write_markdown(results: dict[str, Any], images: list[str], path: Path) -> None:
    meta = results["meta"]
    other = shown(meta.get("compare") or "(none)")
    name = meta.get("other_name", "other")
    where = (
        "the `nsqd` of NSQ's release (https://github.com/nsqio/nsq/releases/tag/v1.3.0), "
        "given as `GO_NSQD`"
        if other == "GO_NSQD"
        else f"`{other}`"
    )
    lines = [
        "# Performance: pynsqd beside Go nsqd",
        "",
        "Written by `scripts/bench-curves "
        + (f"--compare {other}" if meta.get("compare") else "")
        + f"` on {meta['date']} ({meta['cores']} cores). Every point is a fresh server and data",
        "directory; the servers alternate. This machine's speed varies from minute to minute:",
        f"read ratios measured side by side, not absolute figures. {name} is {where}. The",
        "README's benchmark table comes from this same run.",
        "",
    ]
    if "table" in results:
        lines += [
            "## Side by side",
            "",
            f"`bench/bench.py --compare`, 200-byte messages, medians of {meta['rounds']} rounds "
            f"of {meta['runfor']} s (latency: medians of 3 rounds):",
            "",
            *_ratio_rows(results["table"], name),
            "",
        ]
    lines += [
        "## How cost grows",
        "",
        "### Message size",
        "",
        "Two writers, MPUB of up to 200 messages (at most 4 MiB per MPUB), for "
        f"{meta['runfor']} s per point.",
        "",
        *_sweep_rows(results, "sizes", ["msgs_per_s", "mb_per_s"], "bytes"),
        "",
        *[f"![{i}](images/{i})" for i in images if "sizes" in i],
        "",
        "### Idle connections",
        "",
        "N subscribers (SUB to one of 10 channels, RDY 1), nothing published; RSS and CPU over a "
        f"{meta['window']} s idle window.",
        "",
        *_sweep_rows(results, "connections", ["rss_mib", "cpu_pct"], "connections"),
        "",
        *[f"![{i}](images/{i})" for i in images if "connections" in i],
        "",
        "### Topics and channels",
        "",
        "N topics, one channel each, 10 messages queued in each; RSS and CPU over a "
        f"{meta['window']} s idle window.",
        "",
        *_sweep_rows(results, "topics", ["rss_mib", "cpu_pct"], "topics"),
        "",
        *[f"![{i}](images/{i})" for i in images if "topics" in i],
        "",
        "### A disk backlog",
        "",
        f"{meta['backlog']:,} messages of 200 bytes queued for a channel (all but "
        "`--mem-queue-size` of them on disk), then drained by two readers (RDY 2500).",
        "",
        *_sweep_rows(
            results, "backlog", ["fill_msgs_per_s", "drain_msgs_per_s", "rss_mib"], "messages"
        ),
        "",
    ]
    notes = DOCS / "performance-notes.md"
    if notes.exists():  # what the figures mean: written by hand, kept across regenerations
        lines += [notes.read_text().strip(), ""]
    path.write_text("\n".join(lines))


#: The README's benchmark table, rewritten between these lines by every run with --compare.
README_START = "<!-- benchmarks: written by scripts/bench-curves -->"
README_END = "<!-- end of benchmarks -->"


X = "\u00d7"  # the multiplication sign of the README's ratios


def _k(v: float) -> str:
    return f"{v / 1000:,.0f}k" if v >= 10_000 else f"{v / 1000:,.1f}k"


def readme_table(results: dict[str, Any]) -> list[str]:
    """The side-by-side table for people: the figures of docs/performance.md's first table."""
    t, meta = results["table"], results["meta"]
    name = meta.get("other_name", "other")

    def pair(key: str) -> tuple[float, float, float]:
        v = t[key]
        return v["pynsqd"], v["other"], v.get("ratio", 0.0)

    rows = [
        f"`scripts/bench-curves --compare <{name}>` on {meta['date']}: `bench/bench.py --compare`,",
        f"fresh servers alternating, medians of {meta['rounds']} rounds of {meta['runfor']} s "
        "(latency: of 3); the same run as `docs/performance.md`.",
        "",
        f"| workload | pynsqd | {name} | ratio (>1: pynsqd better) |",
        "|---|---|---|---|",
    ]

    def throughput(prefix: str, conns: str) -> None:
        w, wo, wr = pair(f"{prefix}writer.msgs_per_s")
        rows.append(f"| MPUB writer (batch 200{conns}) | {_k(w)} msgs/s | {_k(wo)} | {wr:.2f}{X} |")
        r, ro, rr = pair(f"{prefix}reader.msgs_per_s")
        rows.append(
            f"| reader draining a backlog (RDY 2500{conns}) | {_k(r)} | {_k(ro)} | {rr:.2f}{X} |"
        )
        i, io, ir = pair(f"{prefix}pubsub_in.msgs_per_s")
        o, oo, orr = pair(f"{prefix}pubsub_out.msgs_per_s")
        rows.append(
            f"| writer + reader together, in / out | {_k(i)} / {_k(o)} | {_k(io)} / {_k(oo)} | "
            f"{ir:.2f}{X} / {orr:.2f}{X} |"
        )

    if "go_tools.writer.msgs_per_s" in t:
        rows.append("| *Go's own `bench_writer` and `bench_reader`* | | | |")
        throughput("go_tools.", ", a connection per core")
        rows.append("| *this repository's load generator (`bench/bench.py`)* | | | |")
    throughput("", ", 2 connections")
    p, po, pr = pair("pub.msgs_per_s")
    p50, p50o, _ = pair("pub.p50_us")
    p99, p99o, _ = pair("pub.p99_us")
    rows.append(
        f"| single PUB waiting for OK | {_k(p)}/s (p50 {p50:.0f} µs, p99 {p99:.0f} µs) | "
        f"{_k(po)}/s (p50 {p50o:.0f} µs, p99 {p99o:.0f} µs) | {pr:.2f}{X} |"
    )
    rates = sorted({int(k.split(".")[0].split("_")[1]) for k in t if k.startswith("latency_")})
    for n, rate in enumerate(rates):
        a50, b50, r50 = pair(f"latency_{rate}.p50_us")
        a99, b99, r99 = pair(f"latency_{rate}.p99_us")
        what = "publish → receive p50 / p99" if n == 0 else "…"
        rows.append(
            f"| {what} at {rate:,} msgs/s | {a50 / 1000:.2f} / {a99 / 1000:.2f} ms | "
            f"{b50 / 1000:.2f} / {b99 / 1000:.2f} ms | {r50:.1f}{X} / {r99:.1f}{X} |"
        )
    if "server.peak_rss_mib" in t:
        a, b, _ = pair("server.peak_rss_mib")
        rows.append(f"| server peak RSS (throughput workloads) | {a:.0f} MiB | {b:.0f} MiB | |")
    if "server.cpu_s" in t:
        a, b, _ = pair("server.cpu_s")
        rows.append(f"| server CPU seconds (throughput workloads) | {a:.1f} | {b:.1f} | |")
    return rows


def write_readme(results: dict[str, Any], readme: Path) -> None:
    text = readme.read_text()
    start, end = text.find(README_START), text.find(README_END)
    if start < 0 or end < start:
        print(f"{readme}: no benchmark markers; the README table was not written", flush=True)
        return
    table = "\n".join(readme_table(results))
    readme.write_text(text[: start + len(README_START)] + "\n" + table + "\n" + text[end:])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--compare", default="", help="the other nsqd binary (Go's)")
    ap.add_argument("--backlog", type=int, default=10_000_000, help="messages in the backlog")
    ap.add_argument("--runfor", type=float, default=4.0, help="seconds per throughput point")
    ap.add_argument("--window", type=float, default=5.0, help="idle window, seconds")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the side-by-side table")
    ap.add_argument("--quick", action="store_true", help="small sweeps (a smoke run)")
    ap.add_argument("--out", default=str(DOCS), help="where performance.md and images/ go")
    ap.add_argument(
        "--rewrite",
        action="store_true",
        help="measure nothing: write performance.md, its plots and the README table again "
        "from the run in performance.json",
    )
    args = ap.parse_args()
    if args.rewrite:
        out = Path(args.out)
        results = json.loads((out / "performance.json").read_text())
        compare = results["meta"].get("compare")
        if compare and "other_name" not in results["meta"]:
            results["meta"]["other_name"] = server_name(compare)
            (out / "performance.json").write_text(json.dumps(results, indent=1))
        images = plot(results, out / "images")
        write_markdown(results, images, out / "performance.md")
        if "table" in results and out.resolve() == DOCS.resolve():
            write_readme(results, ROOT / "README.md")
        return 0
    servers = {"pynsqd": ""}
    if args.compare:
        servers["other"] = args.compare
        other_name = server_name(args.compare)
    sizes = [100, 1000, 10_000, 100_000, 1_000_000]
    conns = [1000, 2500, 5000, 10_000]
    topics = [10, 100, 500, 2000]
    if args.quick:
        sizes, conns, topics, args.backlog = [100, 10_000], [100, 500], [10, 100], 200_000
    results: dict[str, Any] = {
        "meta": {
            "date": time.strftime("%Y-%m-%d"),
            "cores": os.cpu_count(),
            "compare": args.compare,
            "rounds": args.rounds,
            "runfor": args.runfor,
            "window": args.window,
            "backlog": args.backlog,
        }
    }
    if args.compare:
        results["meta"]["other_name"] = other_name
    results["sizes"] = sweep("size", sizes, servers, lambda b, x: size_point(b, x, args.runfor))
    results["connections"] = sweep(
        "connections", conns, servers, lambda b, x: connections_point(b, x, args.window)
    )
    results["topics"] = sweep(
        "topics", topics, servers, lambda b, x: topics_point(b, x, args.window)
    )
    results["backlog"] = sweep("backlog", [args.backlog], servers, backlog_point)
    if args.compare:
        results["table"] = side_by_side(args.compare, args.rounds, args.runfor)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "performance.json").write_text(json.dumps(results, indent=1))
    images = plot(results, out / "images")
    write_markdown(results, images, out / "performance.md")
    if "table" in results and out.resolve() == DOCS.resolve():
        write_readme(results, ROOT / "README.md")
    print(f"wrote {out / 'performance.md'} and {len(images)} plots", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
