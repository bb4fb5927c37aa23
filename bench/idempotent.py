"""MPUB throughput into a retained topic with identities (idempotent publishing) against without,
side by side in one run.

A fresh pynsqd (``--retention-time=1h``, default flags otherwise) per round, the two variants
alternating, a new topic each time; the publisher sends pre-encoded MPUBs of ``--batch``
``--size``-byte messages (200) on ``--conns`` connections, ``--pipeline`` MPUBs in flight on
each, for ``--seconds``. Reports messages per second per round, the medians, and their ratio
(on / off), and the server's CPU time per message (user + system, from /proc: steadier than
throughput when the publisher shares the cores).

    .venv/bin/python bench/idempotent.py --rounds 5
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
import threading
import time
from pathlib import Path

from pynsqd.protocol import encode

BIN = Path(sys.executable).parent
NSQD = str(BIN / "nsqd") if (BIN / "nsqd").exists() else (shutil.which("nsqd") or "nsqd")


def start(data: str) -> tuple[subprocess.Popen[bytes], int]:
    log = Path(data) / "nsqd.log"
    with open(log, "wb") as err:
        p = subprocess.Popen(
            [
                NSQD,
                "--tcp-address=127.0.0.1:0",
                "--http-address=127.0.0.1:0",
                f"--data-path={data}",
                "--retention-time=1h",
            ],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = re.search(r"TCP: listening on \S+:(\d+)", log.read_text(errors="replace"))
        if m:
            return p, int(m.group(1))
        time.sleep(0.05)
    raise RuntimeError(log.read_text())


def publisher(
    port: int, topic: str, producer: str | None, args: argparse.Namespace, out: list[int]
) -> None:
    body = b"x" * args.size
    bodies = [body] * args.batch
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"  V2" + encode.identify({"idempotent_publish": True}))
    pending = b""
    while pending.count(b"OK") < 1:
        pending += s.recv(4096)
    # Pre-encoded: the client's work is the same for both variants.
    n_cmds = 4000
    cmds = [
        encode.mpub(topic, bodies, None if producer is None else (producer, i * args.batch))
        for i in range(n_cmds)
    ]
    sent = acked = 0
    buf = b""
    ok_frame = b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    stop = time.monotonic() + args.seconds
    while time.monotonic() < stop and sent < n_cmds:
        while sent - acked < args.pipeline and sent < n_cmds:
            s.sendall(cmds[sent])
            sent += 1
        buf += s.recv(65536)
        n = buf.count(ok_frame)
        acked += n
        buf = buf.replace(ok_frame, b"")
    out.append(acked * args.batch)
    s.close()


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def round_(identities: bool, args: argparse.Namespace, tag: str) -> tuple[float, float]:
    """(messages per second, server CPU microseconds per message)."""
    with tempfile.TemporaryDirectory() as data:
        p, port = start(data)
        try:
            out: list[int] = []
            threads = [
                threading.Thread(
                    target=publisher,
                    args=(port, f"t{tag}", f"bench-{tag}-{i}" if identities else None, args, out),
                )
                for i in range(args.conns)
            ]
            cpu0 = cpu_seconds(p.pid)
            t0 = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            elapsed = time.monotonic() - t0
            cpu = cpu_seconds(p.pid) - cpu0
        finally:
            p.terminate()
            p.wait(30)
    return sum(out) / elapsed, cpu / max(sum(out), 1) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--size", type=int, default=200, help="message bytes")
    ap.add_argument("--conns", type=int, default=2)
    ap.add_argument("--pipeline", type=int, default=4)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args()
    results: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    for r in range(args.rounds):
        for variant in ("off", "on") if r % 2 == 0 else ("on", "off"):
            rate, us = round_(variant == "on", args, f"{r}{variant}")
            results[variant].append(rate)
            cpu[variant].append(us)
            print(
                f"round {r + 1} identities {variant:3}: {rate:12,.0f} msgs/s, "
                f"server CPU {us:.2f} us/msg",
                flush=True,
            )
    med = {k: statistics.median(v) for k, v in results.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    ratio = med["on"] / med["off"]
    cpu_ratio = med_cpu["on"] / med_cpu["off"]
    print(
        f"median off {med['off']:,.0f}  on {med['on']:,.0f}  on/off {ratio:.3f}; server CPU "
        f"per message off {med_cpu['off']:.2f} us  on {med_cpu['on']:.2f} us  "
        f"on/off {cpu_ratio:.3f}"
    )
    if args.json:
        doc = {
            "args": vars(args),
            "rounds": results,
            "median": med,
            "ratio": ratio,
            "cpu_us_per_msg": cpu,
            "median_cpu_us_per_msg": med_cpu,
            "cpu_ratio": cpu_ratio,
        }
        Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
