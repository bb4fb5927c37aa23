"""Throughput of the PySpark nsq connector: source and sink rows/s (200-byte messages).

    .venv/bin/python bench/spark_bench.py [--rows 500000] [--size 200] [--mode all|source|sink]

Starts its own pynsqd (default flags, temporary data dir) and one SparkSession: ``local[2]`` (as
on the 2-core CI machine), or with ``--master standalone`` a Spark standalone cluster of two
one-core workers (executors in their own JVMs, as users run it), or ``--master both``: each in
turn in one run, each with a fresh nsqd.

Both are measured after a warm-up run of each (Python workers started, JVM JIT warm).

- source: publishes --rows messages first, then drains them with
  ``readStream.format("nsq")`` → ``noop`` sink, ``Trigger.AvailableNow``. Reports the whole run
  (query start to end, Spark start-up excluded) and the steady state (sum of the micro-batches'
  rows / their trigger durations, without the first batch, which includes Python worker start).
- log (also in ``all`` and ``source``): the log-mode source over the same number of rows of a
  retained topic, with --partitions tasks per batch (per-task rates show how it scales).
- sink: ``df.write.format("nsq")`` of --rows cached rows (binary body of --size bytes), and the
  same through ``writeStream`` (rate of the whole query).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

#: print every micro-batch's durations (--detail)
DETAIL = False


def start_nsqd(data: Path, extra: list[str]) -> tuple[subprocess.Popen[bytes], str, str]:
    log = data / "nsqd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "nsqd"),
                "--tcp-address=127.0.0.1:0",
                "--http-address=127.0.0.1:0",
                f"--data-path={data}",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        text = log.read_text()
        tcp = re.search(r"TCP: listening on (\S+)", text)
        http = re.search(r"HTTP: listening on (\S+)", text)
        if tcp and http:
            return proc, tcp.group(1), http.group(1)
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"nsqd did not start:\n{log.read_text()}")


def topic_count(http: str, topic: str) -> int:
    with urllib.request.urlopen(f"http://{http}/stats?format=json&topic={topic}") as r:
        topics = json.loads(r.read()).get("topics") or []
    return sum(t["message_count"] for t in topics if t["topic_name"] == topic)


def prefill(address: str, topic: str, rows: int, size: int) -> float:
    from pynsqd.client.connection import Connection

    t0 = time.perf_counter()
    with Connection(address).connect() as c:
        # The channel first, so that every message is queued for it.
        c.request(f"SUB {topic} bench\n".encode())
    batch = 5000
    with Connection(address).connect() as c:
        for start in range(0, rows, batch):
            n = min(batch, rows - start)
            c.mpub(topic, [b"%010d" % (start + i) + b"x" * (size - 10) for i in range(n)])
    return time.perf_counter() - t0


#: the parts of a micro-batch that run on the driver, not in tasks (Spark's progress durations)
DRIVER_PARTS = ("latestOffset", "queryPlanning", "getBatch", "walCommit", "commitOffsets")


def driver_share(progress: list[dict[str, Any]]) -> dict[str, float]:
    """Driver-side time per batch (the source's latestOffset, planning, the checkpoint's
    writes) and its share of the batches' whole time: what must stay small as tasks scale."""
    batches = [p for p in progress if p["numInputRows"]]
    if not batches:
        return {}
    drv = sum(sum(p["durationMs"].get(k, 0) for k in DRIVER_PARTS) for p in batches)
    total = sum(p["durationMs"]["triggerExecution"] for p in batches)
    lo = sum(p["durationMs"].get("latestOffset", 0) for p in batches)
    return {
        "driver_ms_per_batch": drv / len(batches),
        "source_latestOffset_ms_per_batch": lo / len(batches),
        "driver_share": drv / total if total else 0.0,
    }


def first_batch_end(progress: list[dict[str, Any]]) -> float:
    """Wall time at which the first batch with rows ended."""
    from datetime import datetime

    for p in progress:
        if p["numInputRows"]:
            start = datetime.fromisoformat(p["timestamp"].replace("Z", "+00:00")).timestamp()
            return start + p["durationMs"]["triggerExecution"] / 1000
    return 0.0


def runner_cpu(cpu: SourceRunnerCPU, progress: list[dict[str, Any]]) -> dict[str, float]:
    total = cpu.stop()
    data = [p for p in progress if p["numInputRows"]]
    steady = cpu.after(first_batch_end(progress))
    steady_s = sum(p["durationMs"]["triggerExecution"] for p in data[1:]) / 1000
    return {
        "source_runner_cpu_s": total,
        "source_runner_cpu_ms_per_steady_batch": steady * 1000 / max(1, len(data) - 1),
        "source_runner_cpu_share_steady": steady / steady_s if steady_s else 0.0,
    }


class SourceRunnerCPU:
    """CPU seconds of the driver-side Python process that runs the streaming source (Spark
    starts ``pyspark.sql.streaming.python_streaming_source_runner`` per query: latestOffset,
    partitions, commit). Sampled from /proc while the query runs, since it exits with it."""

    MARK = b"python_streaming_source_runner"

    def __init__(self) -> None:
        import threading

        self._seen: dict[int, float] = {}
        #: (wall time, CPU seconds so far) at every sample
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        tick = os.sysconf("SC_CLK_TCK")
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if self.MARK not in f.read():
                        continue
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            self._seen[int(pid)] = (int(fields[11]) + int(fields[12])) / tick
        self.samples.append((time.time(), sum(self._seen.values())))

    def after(self, wall: float) -> float:
        """CPU seconds spent after wall time ``wall`` (the end of the first batch: what is
        left is the per-batch work, without the process's start-up and imports)."""
        before = [c for t, c in self.samples if t <= wall]
        return sum(self._seen.values()) - (before[-1] if before else 0.0)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self._sample()

    def stop(self) -> float:
        self._sample()
        self._stop.set()
        self._thread.join()
        return sum(self._seen.values())


def bench_source(
    spark: Any, address: str, rows: int, size: int, batch: int, work: Path, topic: str = "source"
) -> dict[str, Any]:
    pub_s = prefill(address, topic, rows, size)
    df = (
        spark.readStream.format("nsq")
        .option("topic", topic)
        .option("channel", "bench")
        .option("nsqdTcpAddresses", address)
        .option("maxMessagesPerBatch", str(batch))
        .load()
    )
    t0 = time.perf_counter()
    cpu = SourceRunnerCPU()
    q = (
        df.writeStream.format("noop")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(work / f"ck-{topic}"))
        .start()
    )
    q.awaitTermination(600)
    wall = time.perf_counter() - t0
    progress = q.recentProgress
    cpu_figures = runner_cpu(cpu, progress)
    q.stop()
    got = sum(p["numInputRows"] for p in progress)
    data = [p for p in progress if p["numInputRows"]]
    if DETAIL:
        for p in progress:
            print(
                f"  batch {p['batchId']}: {p['numInputRows']} rows {p['durationMs']}",
                file=sys.stderr,
            )
    steady = data[1:] or data
    all_s = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    steady_rows = sum(p["numInputRows"] for p in steady)
    steady_s = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000
    return {
        "mode": "source",
        "rows": got,
        "prefill_rows_per_s": rows / pub_s,
        "wall_s": wall,
        "rows_per_s_wall": got / wall,
        "rows_per_s_batches": got / all_s if all_s else 0.0,
        "rows_per_s_steady": steady_rows / steady_s if steady_s else 0.0,
        "batches": len(data),
        **cpu_figures,
        **driver_share(progress),
    }


def bench_log_source(
    spark: Any,
    address: str,
    http: str,
    rows: int,
    size: int,
    batch: int,
    work: Path,
    partitions: int,
    topic: str = "logsource",
    more: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The log-mode source: executors read offset ranges over HTTP (nsqd has retention).
    ``more``: other nodes (tcp, http); the rows are then spread evenly over all of them."""
    nodes = [(address, http), *(more or [])]
    share = rows // len(nodes)
    for tcp_address, http_address in nodes:
        if topic_count(http_address, topic) < share:
            prefill(tcp_address, topic, share - topic_count(http_address, topic), size)
    http = ",".join(h for _, h in nodes)
    df = (
        spark.readStream.format("nsq")
        .option("mode", "log")
        .option("topic", topic)
        .option("nsqdHttpAddresses", http)
        .option("maxOffsetsPerTrigger", str(batch))
        .option("minPartitions", str(partitions))
        .load()
    )
    t0 = time.perf_counter()
    cpu = SourceRunnerCPU()
    q = (
        df.writeStream.format("noop")
        .trigger(availableNow=True)
        .option("checkpointLocation", str(work / f"ck-{topic}-{partitions}"))
        .start()
    )
    q.awaitTermination(600)
    wall = time.perf_counter() - t0
    progress = q.recentProgress
    cpu_figures = runner_cpu(cpu, progress)
    q.stop()
    data = [p for p in progress if p["numInputRows"]]
    got = sum(p["numInputRows"] for p in data)
    steady = data[1:] or data
    steady_rows = sum(p["numInputRows"] for p in steady)
    steady_s = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000
    return {
        "mode": f"log source x{partitions}" + (f" on {len(nodes)} nodes" if more else ""),
        "rows": got,
        "wall_s": wall,
        "rows_per_s_wall": got / wall,
        "rows_per_s_steady": steady_rows / steady_s if steady_s else 0.0,
        "rows_per_s_per_task_steady": steady_rows / steady_s / partitions if steady_s else 0.0,
        "batches": len(data),
        **cpu_figures,
        **driver_share(progress),
    }


def bench_sink(
    spark: Any, address: str, http: str, rows: int, size: int, work: Path, topic: str = "sink"
) -> list[dict[str, Any]]:
    from pyspark.sql import functions as F

    df = (
        spark.range(rows, numPartitions=2)
        .select(
            F.concat(F.lpad(F.col("id").cast("string"), 10, "0"), F.lit("x" * (size - 10)))
            .cast("binary")
            .alias("body")
        )
        .cache()
    )
    df.count()
    out = []
    t0 = time.perf_counter()
    df.write.format("nsq").mode("append").option("topic", topic).option(
        "nsqdTcpAddresses", address
    ).save()
    s = time.perf_counter() - t0
    assert topic_count(http, topic) == rows, "sink lost messages"
    out.append({"mode": "sink (batch write)", "rows": rows, "wall_s": s, "rows_per_s": rows / s})

    # Streaming: the same rows through writeStream (a file source of the cached rows' Parquet).
    src = work / f"{topic}-src"
    df.write.parquet(str(src))
    sdf = spark.readStream.schema(df.schema).parquet(str(src))
    t0 = time.perf_counter()
    q = (
        sdf.writeStream.format("nsq")
        .option("topic", f"{topic}_stream")
        .option("nsqdTcpAddresses", address)
        .option("checkpointLocation", str(work / f"ck-{topic}"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(600)
    s = time.perf_counter() - t0
    progress = q.recentProgress
    q.stop()
    assert topic_count(http, f"{topic}_stream") == rows, "stream sink lost messages"
    data = [p for p in progress if p["numInputRows"]]
    batch_s = sum(p["durationMs"]["triggerExecution"] for p in data) / 1000
    out.append(
        {
            "mode": "sink (writeStream)",
            "rows": rows,
            "wall_s": s,
            "rows_per_s": rows / s,
            "rows_per_s_batches": rows / batch_s if batch_s else 0.0,
        }
    )
    df.unpersist()
    return out


def run_on(master: str, args: argparse.Namespace, work: Path) -> list[dict[str, Any]]:
    """Every benchmark of ``--mode`` on one Spark: ``local[2]``, or a standalone cluster of two
    one-core workers started here (``tests/spark/standalone.py``) with the driver in this
    process, in client mode. Each gets its own nsqd."""
    (work / "nsqd").mkdir()
    # Retention on: the log-mode source reads the topic's log (the channel source is unaffected).
    flags = ["--retention-time=1h", *args.nsqd_args.split()]
    proc, address, http = start_nsqd(work / "nsqd", flags)
    others: list[subprocess.Popen[bytes]] = []
    cluster = None
    from pyspark.sql import SparkSession

    from pynsqd_spark import register

    builder = SparkSession.builder.master(master)
    if master == "standalone":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.spark.standalone import StandaloneCluster

        cluster = StandaloneCluster(work / "spark", worker_memory="2g").start()
        builder = (
            SparkSession.builder.master(cluster.master_url)
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.executor.memory", "1g")
            .config("spark.executor.cores", "1")
            .config("spark.cores.max", "2")
            .config("spark.pyspark.python", sys.executable)
        )
    spark = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    results: list[dict[str, Any]] = []
    try:
        # Warm-up: start the Python workers and let the JVM's JIT compile the paths of full-size
        # batches (two of them: the first 100k-row batches of a fresh JVM take 2-3x longer), so
        # the figures are steady state.
        warm = min(args.rows, 2 * args.batch)
        bench_source(spark, address, warm, args.size, args.batch, work, topic="warm")
        bench_sink(
            spark, address, http, min(args.rows, 200_000), args.size, work, topic="warm_sink"
        )
        if args.mode in ("all", "sink"):
            results += bench_sink(spark, address, http, args.rows, args.size, work)
        if args.mode in ("all", "source"):
            results.append(bench_source(spark, address, args.rows, args.size, args.batch, work))
        if args.mode in ("all", "source", "log"):
            bench_log_source(spark, address, http, warm, args.size, args.batch, work, 2, "warmlog")
            for n in (int(x) for x in args.partitions.split(",")):
                results.append(
                    bench_log_source(
                        spark, address, http, args.rows, args.size, args.batch, work, n
                    )
                )
            if args.nodes > 1:  # the same rows spread over more nsqd, a task per node
                extra = []
                for i in range(1, args.nodes):
                    (work / f"nsqd{i}").mkdir()
                    p, tcp_i, http_i = start_nsqd(work / f"nsqd{i}", flags)
                    others.append(p)
                    extra.append((tcp_i, http_i))
                results.append(
                    bench_log_source(
                        spark,
                        address,
                        http,
                        args.rows,
                        args.size,
                        args.batch,
                        work,
                        args.nodes,
                        "logspread",
                        extra,
                    )
                )
    finally:
        spark.stop()
        for p in [proc, *others]:
            p.terminate()
            p.wait(10)
        if cluster is not None:
            cluster.stop()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=600_000)
    ap.add_argument("--size", type=int, default=200)
    ap.add_argument("--batch", type=int, default=100_000, help="source maxMessagesPerBatch")
    ap.add_argument("--mode", choices=["all", "source", "sink", "log"], default="all")
    ap.add_argument("--nodes", type=int, default=1, help="log source: also run on this many nsqd")
    ap.add_argument(
        "--partitions",
        default="1,2,4",
        help="log source: tasks per batch to try (minPartitions), comma-separated",
    )
    ap.add_argument("--nsqd-args", default="", help="extra flags for the nsqd we start")
    ap.add_argument(
        "--master",
        choices=["local[2]", "standalone", "both"],
        default="local[2]",
        help="Spark: local[2], a standalone cluster of two one-core workers started here, or "
        "both in one run",
    )
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--detail", action="store_true", help="print each source micro-batch's timings")
    args = ap.parse_args()
    global DETAIL
    DETAIL = args.detail
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    base = Path(tempfile.mkdtemp(prefix="nsq-spark-bench-"))
    masters = ["local[2]", "standalone"] if args.master == "both" else [args.master]
    results: list[dict[str, Any]] = []
    try:
        for master in masters:
            work = base / master.replace("[", "").replace("]", "")
            work.mkdir()
            results += [{"master": master, **r} for r in run_on(master, args, work)]
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for r in results:
        if args.json:
            print(json.dumps(r))
        else:
            print(
                "  ".join(
                    f"{k}={v:,.1f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()
                )
            )


if __name__ == "__main__":
    main()
