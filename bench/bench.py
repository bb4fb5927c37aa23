"""pynsqd benchmark, modelled on nsq's bench_writer / bench_reader.

    scripts/bench [--mode all|writer|reader|pubsub|pub|logread|latency] [--runfor 10] ...

Starts its own nsqd (ours, default flags, a temporary data dir) unless --nsqd-tcp-address is
given, so the same command measures Go nsqd too. Each connection runs in its own process with a
raw socket and pre-built commands, so the load tools cost as little CPU as possible.

Modes (``all`` runs them in this order):
- writer: N connections, each a loop of MPUB of --batch-size messages, waiting for each OK.
- reader: N connections SUB with RDY --rdy and FIN every message, draining the writer's backlog.
- pubsub: writers and readers at once on a fresh topic; in ``all``, on a fresh server too (as
  pub), since the reader leaves part of the writer's backlog, which the server would still be
  moving from the topic's disk queue to the channel's.
- pub: one connection, PUB one message and wait for OK; prints latency percentiles, then the
  same against a do-nothing uvloop server ("floor"): the machine's own round-trip limit.

Not in ``all``:
- latency: a publisher at each --rates rate (PUBs paced in 1 ms slices) and a consumer with
  RDY 100 and default IDENTIFY; prints publish-to-receive p50/p99/p99.9.
- logread: replayable topics. Publishes --log-messages messages to a retained topic (the nsqd
  it starts gets --retention-time=1h), then reads the whole log over HTTP (GET /topic/log,
  64 MiB per request) with one reader, then with two at once; prints msgs/s for each.

--compare NSQD_BINARY runs the chosen mode(s) against our nsqd and that one (Go's nsqd, say)
alternately, --rounds times, each on a fresh server and data directory, with this same load
generator, and prints medians, ratios (>1: pynsqd better), server CPU seconds and peak RSS.

--retention starts nsqd with --retention-time=1h, so writer/pubsub measure a replayable topic
(compare with and without it). --tls, --snappy and --deflate make every connection negotiate
them after IDENTIFY (for the nsqd it starts, --tls makes a throwaway certificate with trustme),
to compare with plain TCP.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import re
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

_LEN = struct.Struct(">l")
_FRAME = struct.Struct(">ll")


def _connect(addr: tuple[str, int]) -> socket.socket:
    s = socket.create_connection(addr)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    s.sendall(b"  V2")
    return s


#: --tls / --snappy / --deflate: what every connection negotiates (set in main, kept by fork).
FEATURES: dict[str, Any] = {}


class _Compressed:
    """snappy (framed) or raw DEFLATE over a plain or TLS socket; recv never over-returns."""

    def __init__(self, sock: Any, kind: str, level: int = 6) -> None:
        self._sock = sock
        self._buf = b""
        if kind == "snappy":
            import cramjam

            self._dec: Any = _SnappyStream()
            self._enc = lambda data: bytes(cramjam.snappy.compress(data))
        else:
            comp = zlib.compressobj(level, zlib.DEFLATED, -15)
            self._dec = zlib.decompressobj(-15)
            self._enc = lambda data: comp.compress(data) + comp.flush(zlib.Z_SYNC_FLUSH)

    def sendall(self, data: bytes) -> None:
        self._sock.sendall(self._enc(data))

    def recv(self, n: int) -> bytes:
        while not self._buf:
            raw = self._sock.recv(max(n, 65536))
            if not raw:
                return b""
            self._buf = self._dec.decompress(raw)
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def settimeout(self, t: float | None) -> None:
        self._sock.settimeout(t)

    def close(self) -> None:
        self._sock.close()


class _SnappyStream:
    """A framed-snappy stream decoder for the bench client (whole chunks to cramjam)."""

    def __init__(self) -> None:
        self._buf = b""

    def decompress(self, data: bytes) -> bytes:
        import cramjam

        buf = self._buf + data
        pos = 0
        while len(buf) - pos >= 4:
            length = int.from_bytes(buf[pos + 1 : pos + 4], "little")
            if len(buf) - pos - 4 < length:
                break
            pos += 4 + length
        self._buf = buf[pos:]
        if not pos:
            return b""
        chunks = buf[:pos]
        if not chunks.startswith(b"\xff\x06\x00\x00sNaPpY"):
            chunks = b"\xff\x06\x00\x00sNaPpY" + chunks
        return bytes(cramjam.snappy.decompress(chunks))


def _identify(s: Any, data: dict[str, Any]) -> Any:
    """IDENTIFY, then the upgrades --tls/--snappy/--deflate ask for; returns the socket to use."""
    data = {**data, **{k: v for k, v in FEATURES.items() if k != "ca_file"}}
    if FEATURES:
        data["feature_negotiation"] = True
    body = json.dumps(data).encode()
    s.sendall(b"IDENTIFY\n" + _LEN.pack(len(body)) + body)
    reply = _read_response(s)
    if not FEATURES:
        return s
    features = json.loads(reply)
    if features.get("tls_v1"):
        ctx = ssl.create_default_context(cafile=FEATURES.get("ca_file"))
        s = ctx.wrap_socket(s, server_hostname="127.0.0.1")
        _read_response(s)
    for kind in ("snappy", "deflate"):
        if features.get(kind):
            s = _Compressed(s, kind, features.get("deflate_level", 6))
            _read_response(s)
    return s


def _recv_exact(s: Any, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("nsqd closed the connection")
        buf += chunk
    return buf


def _read_response(s: Any) -> bytes:
    while True:
        size, ftype = _FRAME.unpack(_recv_exact(s, 8))
        data = _recv_exact(s, size - 4)
        if ftype == 1:
            raise RuntimeError(data.decode())
        if data != b"_heartbeat_":
            return data
        s.sendall(b"NOP\n")


def writer(addr: tuple[str, int], topic: str, size: int, batch: int, deadline: float) -> int:
    s = _identify(_connect(addr), {})
    body = b"a" * size
    payload = b"".join(_LEN.pack(size) + body for _ in range(batch))
    cmd = f"MPUB {topic}\n".encode() + _LEN.pack(len(payload) + 4) + _LEN.pack(batch) + payload
    n = 0
    while time.time() < deadline:
        s.sendall(cmd)
        if _read_response(s) != b"OK":
            raise RuntimeError("MPUB failed")
        n += batch
    s.close()
    return n


def writer_n(addr: tuple[str, int], topic: str, size: int, batch: int, total: int) -> int:
    s = _identify(_connect(addr), {})
    body = b"a" * size
    payload = b"".join(_LEN.pack(size) + body for _ in range(batch))
    cmd = f"MPUB {topic}\n".encode() + _LEN.pack(len(payload) + 4) + _LEN.pack(batch) + payload
    n = 0
    while n < total:
        s.sendall(cmd)
        if _read_response(s) != b"OK":
            raise RuntimeError("MPUB failed")
        n += batch
    s.close()
    return n


def log_reader(http_addr: tuple[str, int], topic: str, total: int) -> tuple[int, float]:
    """Read the retained log from offset 0 until ``total`` records: (records, end time)."""
    import http.client

    conn = http.client.HTTPConnection(*http_addr, timeout=60)
    offset = n = 0
    buf = bytearray(64 << 20)
    view = memoryview(buf)
    while n < total:
        conn.request("GET", f"/topic/log?topic={topic}&offset={offset}&max_bytes={64 << 20}")
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"/topic/log: {r.status} {r.read()!r}")
        length = int(r.headers["Content-Length"])
        got = 0
        while got < length:
            k = r.readinto(view[got:length])
            if not k:
                raise RuntimeError("short body")
            got += k
        count = int(r.headers["X-Nsq-Count"])
        if not count:
            break
        n += count
        offset = int(r.headers["X-Nsq-Next-Offset"])
    conn.close()
    return n, time.time()


def reader(
    addr: tuple[str, int], topic: str, channel: str, rdy: int, deadline: float, idle_exit: bool
) -> tuple[int, float]:
    """FIN everything until the deadline (or, with idle_exit, until 1 s without messages)."""
    s = _identify(_connect(addr), {"feature_negotiation": True, "output_buffer_timeout": 250})
    s.sendall(f"SUB {topic} {channel}\n".encode())
    _read_response(s)
    s.sendall(b"RDY %d\n" % rdy)
    s.settimeout(0.5)
    buf = bytearray()
    n = 0
    last = time.time()
    unpack = _FRAME.unpack_from
    while time.time() < deadline:
        try:
            data = s.recv(1 << 20)
        except TimeoutError:
            if idle_exit and time.time() - last > 1.0:
                break
            continue
        if not data:
            break
        buf += data
        pos = 0
        end = len(buf)
        fins = []
        while end - pos >= 8:
            fsize, ftype = unpack(buf, pos)
            if end - pos - 4 < fsize:
                break
            if ftype == 2:
                fins.append(b"FIN " + bytes(buf[pos + 18 : pos + 34]) + b"\n")
            elif ftype == 0 and buf[pos + 8 : pos + 4 + fsize] == b"_heartbeat_":
                fins.append(b"NOP\n")
            elif ftype == 1:
                raise RuntimeError(bytes(buf[pos + 8 : pos + 4 + fsize]).decode())
            pos += 4 + fsize
        del buf[:pos]
        if fins:
            s.sendall(b"".join(fins))
            n += len(fins)
            last = time.time()
    s.close()
    return n, last


def pub_latency(addr: tuple[str, int], topic: str, size: int, deadline: float) -> list[float]:
    s = _identify(_connect(addr), {})
    body = b"a" * size
    cmd = f"PUB {topic}\n".encode() + _LEN.pack(size) + body
    lat: list[float] = []
    while (t0 := time.perf_counter()) < deadline - time.time() + t0 and time.time() < deadline:
        s.sendall(cmd)
        s.recv(64)  # "OK" is one 10-byte frame, read whole on loopback
        lat.append(time.perf_counter() - t0)
    s.close()
    return lat


def paced_publisher(addr: tuple[str, int], topic: str, size: int, rate: int, secs: float) -> int:
    """PUB ``rate`` messages a second for ``secs`` (in 1 ms slices, OKs read by a thread);
    each body starts with its send time (ns) for the consumer to measure."""
    import threading as _threading

    s = _identify(_connect(addr), {})
    pad = b"a" * max(0, size - 8)
    stop = _threading.Event()

    def drain_oks() -> None:
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                if not s.recv(1 << 16):
                    return
            except (TimeoutError, OSError):
                continue

    t = _threading.Thread(target=drain_oks, daemon=True)
    t.start()
    head = f"PUB {topic}\n".encode() + _LEN.pack(max(size, 8))
    start = time.perf_counter()
    sent = 0
    while (now := time.perf_counter()) - start < secs:
        due = int((now - start) * rate) + 1
        if due > sent:
            s.sendall(
                b"".join(head + struct.pack(">q", time.time_ns()) + pad for _ in range(due - sent))
            )
            sent = due
        else:
            time.sleep(0.0002)
    stop.set()
    t.join()
    s.close()
    return sent


def latency_consumer(
    addr: tuple[str, int], topic: str, channel: str, expect: int, secs: float
) -> list[float]:
    """SUB with RDY 100 and default IDENTIFY; publish-to-receive latency of each message (s)."""
    s = _identify(_connect(addr), {})
    s.sendall(f"SUB {topic} {channel}\n".encode())
    _read_response(s)
    s.sendall(b"RDY 100\n")
    s.settimeout(0.5)
    buf = bytearray()
    lat: list[float] = []
    deadline = time.time() + secs + 5
    unpack = _FRAME.unpack_from
    while len(lat) < expect and time.time() < deadline:
        try:
            data = s.recv(1 << 20)
        except TimeoutError:
            continue
        now = time.time_ns()
        if not data:
            break
        buf += data
        pos, end = 0, len(buf)
        fins = []
        while end - pos >= 8:
            fsize, ftype = unpack(buf, pos)
            if end - pos - 4 < fsize:
                break
            if ftype == 2:
                sent_ns = struct.unpack_from(">q", buf, pos + 34)[0]
                lat.append((now - sent_ns) / 1e9)
                fins.append(b"FIN " + bytes(buf[pos + 18 : pos + 34]) + b"\n")
            elif ftype == 0 and buf[pos + 8 : pos + 4 + fsize] == b"_heartbeat_":
                fins.append(b"NOP\n")
            pos += 4 + fsize
        del buf[:pos]
        if fins:
            s.sendall(b"".join(fins))
    s.close()
    return lat


class _OkServer:
    """The floor for single-PUB latency: a minimal uvloop server that answers OK to anything."""

    def __init__(self) -> None:
        ctx = mp.get_context("fork")
        parent, child = ctx.Pipe()
        self.proc = ctx.Process(target=self._serve, args=(child,), daemon=True)
        self.proc.start()
        self.addr: tuple[str, int] = ("127.0.0.1", parent.recv())

    @staticmethod
    def _serve(conn: Any) -> None:
        import asyncio

        import uvloop

        ok = _FRAME.pack(6, 0) + b"OK"

        class Proto(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.t = transport

            def data_received(self, data: bytes) -> None:
                self.t.write(ok)  # type: ignore[attr-defined]

        async def main() -> None:
            loop = asyncio.get_running_loop()
            srv = await loop.create_server(Proto, "127.0.0.1", 0)
            conn.send(srv.sockets[0].getsockname()[1])
            await asyncio.Event().wait()

        uvloop.run(main())

    def close(self) -> None:
        self.proc.terminate()
        self.proc.join(5)


def _latency_report(name: str, lat: list[float], size: int) -> dict[str, float]:
    lat = sorted(lat)
    r = _report(name, len(lat), sum(lat), size)
    pct = {q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e6 for q in (0.5, 0.99)}
    print(f"{'':9s}latency p50 {pct[0.5]:.0f} us, p99 {pct[0.99]:.0f} us")
    r.update(p50_us=pct[0.5], p99_us=pct[0.99])
    return r


def _run_procs(targets: list[tuple[Callable[..., Any], tuple[Any, ...]]]) -> list[Any]:
    with mp.get_context("fork").Pool(len(targets)) as pool:
        results = [pool.apply_async(fn, args) for fn, args in targets]
        return [r.get() for r in results]


def go_tool(
    directory: str, tool: str, addr: tuple[str, int], topic: str, args: argparse.Namespace
) -> subprocess.Popen[str]:
    """Go NSQ's own load generator (``bench_writer``/``bench_reader`` in ``directory``) against
    ``addr``, with this run's size, batch, RDY and duration. It prints one line of results."""
    cmd = [
        os.path.join(directory, tool),
        f"--nsqd-tcp-address={addr[0]}:{addr[1]}",
        f"--topic={topic}",
        f"--runfor={args.runfor}s",
        f"--size={args.size}",
    ]
    if tool == "bench_writer":
        cmd.append(f"--batch-size={args.batch_size}")
    else:
        cmd += [f"--channel={args.channel}", f"--rdy={args.rdy}"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def go_tool_result(proc: subprocess.Popen[str]) -> tuple[int, float]:
    """(messages, seconds) from a Go bench tool's line ``duration: 10.0s - ... - Nops/s``."""
    out, _ = proc.communicate(timeout=600)
    m = re.search(r"duration: ([\d.]+)(m?s) - .* - ([\d.]+)ops/s", out)
    if proc.returncode != 0 or m is None:
        raise RuntimeError(f"{proc.args[0]} failed: {out.strip()}")
    secs = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    return round(float(m.group(3)) * secs), secs


def _report(name: str, msgs: int, secs: float, size: int) -> dict[str, float]:
    rate = msgs / secs
    mbps = rate * size / 1e6
    print(f"{name:8s} {msgs:10d} msgs in {secs:5.2f}s: {rate:12,.0f} msgs/s {mbps:8.2f} MB/s")
    return {"msgs": msgs, "msgs_per_s": rate, "mb_per_s": mbps}


def _start_nsqd(
    args: argparse.Namespace,
) -> tuple[subprocess.Popen[bytes], tuple[str, int], tuple[str, int] | None, str]:
    data = tempfile.mkdtemp(prefix="pynsqd-bench-")
    nsqd = args.nsqd_binary or shutil.which("nsqd", path=os.path.dirname(sys.executable)) or "nsqd"
    http = "127.0.0.1:0" if args.mode == "logread" or args.nsqd_binary else ""
    cmd = [nsqd, "--tcp-address=127.0.0.1:0", f"--http-address={http}", f"--data-path={data}"]
    cmd += args.nsqd_args.split()
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    tcp: tuple[str, int] | None = None
    http_addr: tuple[str, int] | None = None
    for raw in proc.stderr:
        line = raw.decode(errors="replace")
        m = re.search(r"(TCP|HTTP): listening on ([\d.]+):(\d+)", line)
        if m and m.group(1) == "TCP":
            tcp = (m.group(2), int(m.group(3)))
        elif m:
            http_addr = (m.group(2), int(m.group(3)))
        if tcp is not None and (http_addr is not None or not http):
            # Keep draining stderr so that nsqd never blocks on a full pipe.
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, tcp, http_addr, data
    raise RuntimeError("nsqd did not start")


def _stop_nsqd(proc: subprocess.Popen[bytes], data_dir: str | None) -> None:
    proc.terminate()
    proc.wait(timeout=30)
    if data_dir:
        shutil.rmtree(data_dir, ignore_errors=True)


def _server_usage(pid: int) -> dict[str, float]:
    """CPU seconds and peak RSS of the server process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    rss = 0.0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                rss = int(line.split()[1]) / 1024
    return {"cpu_s": cpu, "peak_rss_mib": rss}


def _compare(args: argparse.Namespace, argv: list[str]) -> int:
    """Run every mode against our nsqd and ``--compare``'s binary alternately, ``--rounds``
    times, a fresh server and data directory each run; print medians and ratios."""
    import statistics

    rest: list[str] = []
    skip = False
    for a in argv:  # drop --compare/--rounds/--json, keep the rest
        if skip:
            skip = False
            continue
        if a in ("--compare", "--rounds"):
            skip = True
            continue
        if a.startswith(("--compare=", "--rounds=")) or a == "--json":
            continue
        rest.append(a)
    servers = {"pynsqd": "", "other": args.compare}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in servers}
    for r in range(args.rounds):
        for name, binary in servers.items():
            print(f"-- round {r + 1}/{args.rounds}: {name}", flush=True)
            cmd = [sys.executable, os.path.abspath(__file__), *rest, "--json"]
            if binary:
                cmd.append(f"--nsqd-binary={binary}")
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            runs[name].append(json.loads(out.strip().splitlines()[-1]))
    print(f"\nmedians of {args.rounds} rounds (pynsqd vs {args.compare}):")
    print(f"{'workload':14s} {'pynsqd':>14s} {'other':>14s} {'ratio':>7s}")
    keys = [k for k in runs["pynsqd"][0] if k != "server" and not k.startswith("pub_floor")]
    summary: dict[str, Any] = {}
    for k in keys:
        for metric in ("msgs_per_s", "p50_us", "p99_us"):
            if metric not in runs["pynsqd"][0][k]:
                continue
            ours = statistics.median(x[k][metric] for x in runs["pynsqd"])
            theirs = statistics.median(x[k][metric] for x in runs["other"])
            if not (ours and theirs):  # a mode with nothing to do (reader with no backlog)
                ratio = float("nan")
            else:
                ratio = ours / theirs if metric == "msgs_per_s" else theirs / ours
            print(f"{k + ' ' + metric:28s} {ours:12,.0f} {theirs:12,.0f} {ratio:6.2f}x")
            summary[f"{k}.{metric}"] = {"pynsqd": ours, "other": theirs, "ratio": ratio}
    for metric in ("cpu_s", "peak_rss_mib"):
        ours = statistics.median(x["server"][metric] for x in runs["pynsqd"])
        theirs = statistics.median(x["server"][metric] for x in runs["other"])
        print(f"{'server ' + metric:28s} {ours:12.1f} {theirs:12.1f}")
        summary[f"server.{metric}"] = {"pynsqd": ours, "other": theirs}
    if args.json:
        print(json.dumps(summary))
    return 0


def _make_certs(directory: str) -> tuple[str, str]:
    """A throwaway CA and server certificate for 127.0.0.1 (trustme, a dev dependency)."""
    import trustme

    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1")
    ca_file = os.path.join(directory, "ca.pem")
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    ca.cert_pem.write_to_path(ca_file)
    server.cert_chain_pems[0].write_to_path(cert)
    server.private_key_pem.write_to_path(key)
    return ca_file, f"--tls-cert={cert} --tls-key={key}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "--mode",
        default="all",
        choices=["all", "writer", "reader", "pubsub", "pub", "logread", "latency"],
    )
    p.add_argument(
        "--rates",
        type=lambda t: [int(x) for x in t.split(",")],
        default=[1000, 10000],
        help="latency: publish rates (msgs/s), comma-separated",
    )
    p.add_argument("--retention", action="store_true", help="nsqd with --retention-time=1h")
    p.add_argument("--log-messages", type=int, default=2_000_000, help="logread: log size")
    p.add_argument("--runfor", type=float, default=10.0, help="seconds per phase")
    p.add_argument("--size", type=int, default=200, help="message size in bytes")
    p.add_argument("--batch-size", type=int, default=200, help="messages per MPUB")
    p.add_argument("--rdy", type=int, default=2500)
    p.add_argument("--conns", type=int, default=2, help="connections (processes) per role")
    p.add_argument("--topic", default="sub_bench")
    p.add_argument("--channel", default="ch")
    p.add_argument("--nsqd-tcp-address", default="", help="use a running nsqd (host:port)")
    p.add_argument("--nsqd-args", default="", help="extra flags for the nsqd we start")
    p.add_argument("--nsqd-binary", default="", help="start this nsqd instead of ours")
    p.add_argument(
        "--compare",
        default="",
        metavar="NSQD_BINARY",
        help="run each mode against ours and this nsqd alternately; print medians and ratios",
    )
    p.add_argument("--rounds", type=int, default=3, help="--compare: rounds")
    p.add_argument(
        "--go-bench-dir",
        default="",
        help="drive writer, reader and pubsub with Go NSQ's bench_writer/bench_reader from "
        "this directory instead of this script's own client",
    )
    p.add_argument("--json", action="store_true", help="print the results as JSON too")
    p.add_argument("--tls", action="store_true", help="upgrade every connection to TLS")
    p.add_argument("--tls-ca-file", default="", help="CA for --tls with --nsqd-tcp-address")
    p.add_argument("--snappy", action="store_true", help="negotiate snappy compression")
    p.add_argument("--deflate", action="store_true", help="negotiate deflate compression")
    p.add_argument("--deflate-level", type=int, default=6)
    args = p.parse_args(argv)
    if args.compare:
        return _compare(args, sys.argv[1:] if argv is None else argv)
    cert_dir = None
    if args.tls:
        FEATURES["tls_v1"] = True
        if args.tls_ca_file:
            FEATURES["ca_file"] = args.tls_ca_file
        elif not args.nsqd_tcp_address:
            cert_dir = tempfile.mkdtemp(prefix="pynsqd-bench-certs-")
            FEATURES["ca_file"], flags = _make_certs(cert_dir)
            args.nsqd_args = f"{args.nsqd_args} {flags}"
    if args.snappy:
        FEATURES["snappy"] = True
    if args.deflate:
        FEATURES["deflate"] = True
        FEATURES["deflate_level"] = args.deflate_level

    if args.retention or args.mode == "logread":
        args.nsqd_args = f"{args.nsqd_args} --retention-time=1h"
    proc = None
    data_dir = None
    http_addr = None
    if args.nsqd_tcp_address:
        host, _, port = args.nsqd_tcp_address.rpartition(":")
        addr = (host, int(port))
    else:
        proc, addr, http_addr, data_dir = _start_nsqd(args)
    results: dict[str, Any] = {}
    usage: list[dict[str, float]] = []  # of each server this run started and stopped
    try:
        modes = ["writer", "reader", "pubsub", "pub"] if args.mode == "all" else [args.mode]
        for mode in modes:
            if mode in ("pubsub", "pub") and len(modes) > 1 and proc is not None:
                # A fresh server: the reader leaves the writer's undrained backlog (about
                # 460k messages in 4 s runs), which the server then moves from the topic's
                # disk queue to the channel's during the next workload.
                usage.append(_server_usage(proc.pid))
                _stop_nsqd(proc, data_dir)
                proc, addr, http_addr, data_dir = _start_nsqd(args)
            n = args.conns
            if args.go_bench_dir and mode in ("writer", "reader", "pubsub"):
                # Go's bench_writer and bench_reader (one connection per core each), as the
                # figures of record: no number then depends on our own client.
                topic = args.topic + ("_pubsub" if mode == "pubsub" else "")
                tools = {"writer": ["bench_writer"], "reader": ["bench_reader"]}.get(
                    mode, ["bench_reader", "bench_writer"]
                )
                procs = [go_tool(args.go_bench_dir, t, addr, topic, args) for t in tools]
                got = dict(zip(tools, [go_tool_result(p) for p in procs], strict=True))
                names = {"bench_writer": "pubsub_in", "bench_reader": "pubsub_out"}
                for tool, (msgs, secs) in got.items():
                    name = names[tool] if mode == "pubsub" else mode
                    results[name] = _report(name, msgs, secs, args.size)
            elif mode == "writer":
                deadline = time.time() + args.runfor
                t0 = time.time()
                counts = _run_procs(
                    [(writer, (addr, args.topic, args.size, args.batch_size, deadline))] * n
                )
                results[mode] = _report(mode, sum(counts), time.time() - t0, args.size)
            elif mode == "reader":
                deadline = time.time() + args.runfor
                t0 = time.time()
                done = _run_procs(
                    [(reader, (addr, args.topic, args.channel, args.rdy, deadline, True))] * n
                )
                secs = max(t for _, t in done) - t0
                results[mode] = _report(mode, sum(c for c, _ in done), secs, args.size)
            elif mode == "pubsub":
                topic = args.topic + "_pubsub"
                deadline = time.time() + args.runfor
                targets: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
                    (reader, (addr, topic, args.channel, args.rdy, deadline, False))
                ] * n
                targets += [(writer, (addr, topic, args.size, args.batch_size, deadline))] * n
                counts = _run_procs(targets)
                subbed = sum(c for c, _ in counts[:n])
                results["pubsub_in"] = _report("pub in", sum(counts[n:]), args.runfor, args.size)
                results["pubsub_out"] = _report("sub out", subbed, args.runfor, args.size)
            elif mode == "latency":
                for rate in args.rates:
                    topic = f"{args.topic}_lat{rate}"
                    secs = min(args.runfor, 5.0)
                    expect = int(secs * rate)
                    done = _run_procs(
                        [
                            (latency_consumer, (addr, topic, args.channel, expect, secs)),
                            (paced_publisher, (addr, topic, args.size, rate, secs)),
                        ]
                    )
                    lat = sorted(done[0])
                    if not lat:
                        raise RuntimeError("no message arrived")
                    p = {
                        q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1e6
                        for q in (0.5, 0.99, 0.999)
                    }
                    print(
                        f"latency @{rate:>6}/s: {len(lat)} msgs  p50 {p[0.5]:8.0f} us  "
                        f"p99 {p[0.99]:8.0f} us  p99.9 {p[0.999]:8.0f} us"
                    )
                    results[f"latency_{rate}"] = {
                        "msgs": len(lat),
                        "p50_us": p[0.5],
                        "p99_us": p[0.99],
                        "p999_us": p[0.999],
                    }
            elif mode == "logread":
                if http_addr is None:
                    raise SystemExit("logread needs the nsqd this bench starts")
                topic = args.topic + "_log"
                total = args.log_messages
                per = -(-total // n // args.batch_size) * args.batch_size
                t0 = time.time()
                written = sum(
                    _run_procs([(writer_n, (addr, topic, args.size, args.batch_size, per))] * n)
                )
                results["log_write"] = _report("log pub", written, time.time() - t0, args.size)
                for readers in (1, 2):
                    t0 = time.time()
                    done = _run_procs([(log_reader, (http_addr, topic, written))] * readers)
                    secs = max(t for _, t in done) - t0
                    got = sum(c for c, _ in done)
                    results[f"log_read_{readers}"] = _report(
                        f"log rd x{readers}", got, secs, args.size
                    )
            elif mode == "pub":
                secs = min(args.runfor, 5.0)
                lat = pub_latency(addr, args.topic + "_pub", args.size, time.time() + secs)
                results[mode] = _latency_report("pub", lat, args.size)
                # The same client against a server that does nothing: what this machine's
                # loopback and scheduler allow right now (it varies several-fold on a VM).
                floor = _OkServer()
                try:
                    lat = pub_latency(floor.addr, "t", args.size, time.time() + secs)
                finally:
                    floor.close()
                results["pub_floor"] = _latency_report("floor", lat, args.size)
    finally:
        if proc is not None:
            with contextlib.suppress(OSError):
                usage.append(_server_usage(proc.pid))
            _stop_nsqd(proc, data_dir)
        if usage:
            results["server"] = {
                "cpu_s": sum(u["cpu_s"] for u in usage),
                "peak_rss_mib": max(u["peak_rss_mib"] for u in usage),
            }
        if cert_dir:
            shutil.rmtree(cert_dir, ignore_errors=True)
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
