"""Start-up: from exec to ``GET /ping`` answering OK, for pynsqd (one process, ``--workers
N``) and, where given, Go nsqd, alternating, several rounds, medians (issue 53 item 2).

    .venv/bin/python bench/startup.py [--rounds 7] [--workers 4] [--go-nsqd PATH]
                                      [--compare OTHER_NSQD]

``--compare`` starts another pynsqd (an older checkout's, say) beside, alternating.

Each start gets a fresh data directory and free ports; the clock starts just before exec and
stops at the first ``200 OK`` from ``/ping`` (polled every millisecond over a fresh
connection). The process is then stopped with SIGTERM and waited for.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ping(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
        conn.request("GET", "/ping")
        ok = conn.getresponse().status == 200
        conn.close()
        return ok
    except OSError:
        return False


def one_start(argv: list[str], limit: float = 60.0) -> float:
    """Seconds from exec to the first OK of ``/ping``."""
    tcp, http_port = free_port(), free_port()
    data = tempfile.mkdtemp(prefix="startup-")
    cmd = [
        *argv,
        f"--tcp-address=127.0.0.1:{tcp}",
        f"--http-address=127.0.0.1:{http_port}",
        f"--data-path={data}",
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not ping(http_port):
            if proc.poll() is not None:
                raise SystemExit(f"{cmd[0]} exited with {proc.returncode} before /ping answered")
            if time.perf_counter() - start > limit:
                raise SystemExit(f"{cmd[0]}: /ping did not answer within {limit:g}s")
            time.sleep(0.001)
        return time.perf_counter() - start
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--nsqd", default=str(ROOT / ".venv" / "bin" / "nsqd"))
    parser.add_argument("--go-nsqd", default="", help="Go nsqd's binary, to start beside")
    parser.add_argument("--compare", default="", help="another pynsqd, to start beside")
    args = parser.parse_args()
    servers: dict[str, list[str]] = {
        "pynsqd": [args.nsqd],
        f"pynsqd --workers {args.workers}": [args.nsqd, f"--workers={args.workers}"],
    }
    if args.compare:
        servers["other"] = [args.compare]
        servers[f"other --workers {args.workers}"] = [args.compare, f"--workers={args.workers}"]
    if args.go_nsqd:
        servers["Go nsqd"] = [args.go_nsqd]
    times: dict[str, list[float]] = {name: [] for name in servers}
    for r in range(args.rounds):
        for name, argv in servers.items():
            times[name].append(one_start(argv))
        print(
            f"round {r + 1}/{args.rounds}: "
            + ", ".join(f"{n} {t[-1] * 1000:.0f} ms" for n, t in times.items()),
            file=sys.stderr,
        )
    print(f"exec to /ping OK, {args.rounds} rounds, {os.cpu_count()} cores")
    print("| server | median | worst |")
    print("|---|---|---|")
    for name, t in times.items():
        print(f"| {name} | {statistics.median(t) * 1000:.0f} ms | {max(t) * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
