"""Example pipeline: events published to pynsqd, aggregated by a Spark streaming job, written to
Parquet and to another NSQ topic.

    scripts/example-pipeline [--events 50000] [--seconds 10] [--out /tmp/nsq-pipeline]

1. starts a pynsqd (unless --nsqd-tcp-address is given) in a temporary directory, with
   retention on, so that topic ``events`` is replayable;
2. a publisher thread MPUBs JSON events ``{"user", "kind", "amount"}`` to topic ``events``
   for ``--seconds``;
3. a Structured Streaming query reads ``events`` with the ``nsq`` source in log mode (by offset,
   on the executors), parses the JSON and keeps running totals per kind (count, sum of amount);
   ``--channel-mode`` reads channel ``pipeline`` instead (what works against Go nsqd);
4. each micro-batch's updated totals are appended to Parquet (``<out>/totals``) and published as
   JSON to topic ``event_totals`` with the ``nsq`` sink;
5. when every event has been counted, the query stops; the script prints the totals read back
   from Parquet, checks them against what was published and shows the last ``event_totals``
   message of each kind.

In log mode the source is exactly-once with the checkpoint: a restarted query reads the same
offsets again (tests/spark/test_log_mode.py kills a driver mid-query and checks it). The channel
source is at-least-once. This demo runs one query start to finish, so the totals must match
exactly either way.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

KINDS = ("click", "view", "purchase", "signup")


def start_nsqd(data_path: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    nsqd = Path(sys.executable).parent / "nsqd"
    log = data_path / "nsqd.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                str(nsqd),
                "--tcp-address=127.0.0.1:0",
                "--http-address=127.0.0.1:0",
                f"--data-path={data_path}",
                "--retention-time=1h",  # topic "events" keeps a log readable by offset
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
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"nsqd did not start:\n{log.read_text()}")


def publish(address: str, events: int, seconds: float, totals: dict[str, list[float]]) -> None:
    """MPUB ``events`` events spread over ``seconds``; record what was sent in ``totals``."""
    from pynsqd.client.connection import Connection

    rng = random.Random(42)
    batch = 500
    pause = seconds / max(1, events // batch)
    with Connection(address).connect() as conn:
        for start in range(0, events, batch):
            bodies = []
            for i in range(start, min(events, start + batch)):
                kind = rng.choice(KINDS)
                amount = round(rng.uniform(1, 100), 2)
                totals[kind][0] += 1
                totals[kind][1] += amount
                bodies.append(
                    json.dumps(
                        {"id": i, "user": f"u{rng.randrange(1000)}", "kind": kind, "amount": amount}
                    ).encode()
                )
            conn.mpub("events", bodies)
            time.sleep(pause)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=50000)
    ap.add_argument("--seconds", type=float, default=10.0, help="how long to keep publishing")
    ap.add_argument("--nsqd-tcp-address", help="use this nsqd instead of starting one")
    ap.add_argument("--nsqd-http-address", help="its HTTP address (log mode)")
    ap.add_argument(
        "--channel-mode", action="store_true", help="read a channel instead of the topic's log"
    )
    ap.add_argument(
        "--out",
        help="output directory, new or empty (default: a temporary directory, removed at exit)",
    )
    args = ap.parse_args()
    if args.out and os.path.isdir(args.out) and os.listdir(args.out):
        ap.error(f"--out {args.out} is not empty: give a new or empty directory")

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

    work = Path(tempfile.mkdtemp(prefix="nsq-pipeline-"))
    # The work directory (nsqd's data, the checkpoint, the default output) goes at exit;
    # registered first, so that it runs after nsqd was stopped.
    atexit.register(shutil.rmtree, work, True)
    out = Path(args.out) if args.out else work / "out"
    proc = None
    address, http = args.nsqd_tcp_address, args.nsqd_http_address
    if not address:
        (work / "nsqd").mkdir()
        proc, address, http = start_nsqd(work / "nsqd")
        atexit.register(proc.terminate)  # also when the job fails
        print(f"pynsqd listening on {address} (data in {work / 'nsqd'})")

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from pynsqd.client.connection import Connection
    from pynsqd_spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("nsq-pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    sent: dict[str, list[float]] = {k: [0, 0.0] for k in KINDS}
    # Make sure the topic and channel exist before publishing starts, so nothing is missed.
    with Connection(address).connect() as c:
        c.request(b"SUB events pipeline\n")
    publisher = threading.Thread(target=publish, args=(address, args.events, args.seconds, sent))

    if args.channel_mode or not http:
        events = (
            spark.readStream.format("nsq")
            .option("topic", "events")
            .option("channel", "pipeline")
            .option("nsqdTcpAddresses", address)
            .option("maxMessagesPerBatch", "20000")
            .load()
        )
    else:
        events = (
            spark.readStream.format("nsq")
            .option("mode", "log")
            .option("topic", "events")
            .option("nsqdHttpAddresses", http)
            .option("maxOffsetsPerTrigger", "20000")
            .load()
        )
    schema = "id long, user string, kind string, amount double"
    totals = (
        events.select(F.from_json(F.col("body").cast("string"), schema).alias("e"))
        .groupBy("e.kind")
        .agg(F.count("*").alias("events"), F.round(F.sum("e.amount"), 2).alias("amount"))
    )
    latest: dict[str, int] = {}  # kind -> running count, as last written

    def sink(batch: Any, batch_id: int) -> None:
        batch = batch.withColumn("batch_id", F.lit(batch_id)).cache()
        rows = batch.collect()
        if rows:
            batch.write.mode("append").parquet(str(out / "totals"))
            batch.select(
                F.to_json(F.struct("kind", "events", "amount", "batch_id")).alias("body")
            ).write.format("nsq").mode("append").option("topic", "event_totals").option(
                "nsqdTcpAddresses", address
            ).save()
            latest.update({r.kind: r.events for r in rows})
        batch.unpersist()

    # Running totals per kind: "update" mode emits the kinds that changed in each micro-batch.
    query = (
        totals.writeStream.outputMode("update")
        .foreachBatch(sink)
        .option("checkpointLocation", str(work / "checkpoint"))
        .trigger(processingTime="2 seconds")
        .start()
    )
    t0 = time.time()
    publisher.start()
    publisher.join()
    print(f"published {args.events} events in {time.time() - t0:.1f}s; waiting for the query")
    deadline = time.time() + 300
    while sum(latest.values()) < args.events and time.time() < deadline:
        if query.exception():
            raise SystemExit(f"query failed: {query.exception()}")
        time.sleep(0.5)
    query.stop()

    final = (
        spark.read.parquet(str(out / "totals"))
        .groupBy("kind")
        .agg(
            F.max_by("events", "batch_id").alias("events"),
            F.max_by("amount", "batch_id").alias("amount"),
        )
        .orderBy("kind")
        .collect()
    )
    kept = "" if args.out else " (a temporary directory, removed at exit: --out DIR keeps it)"
    print(f"\ntotals from Parquet ({out / 'totals'}{kept}):")
    ok = True
    for r in final:
        want_n, want_amount = sent[r.kind]
        match = r.events == want_n and abs(r.amount - want_amount) < 0.01 * max(1, want_n)
        ok &= match
        verdict = "ok" if match else f"expected {want_n} events, {want_amount:.2f}"
        print(f"  {r.kind:10s} events={r.events:7d} amount={r.amount:12.2f}  {verdict}")
    ok &= sum(r.events for r in final) == args.events

    last: dict[str, Any] = {}
    got: list[bytes] = []

    def on_messages(c: Any, ts: Any, att: Any, ids: list[bytes], bodies: list[bytes]) -> None:
        got.extend(bodies)
        c.fin_many(ids)

    with Connection(address).connect() as c:
        c.subscribe("event_totals", "print", on_messages, rdy=1000)
        time.sleep(1.0)
    for body in got:
        rec = json.loads(body)
        if rec["kind"] not in last or rec["batch_id"] >= last[rec["kind"]]["batch_id"]:
            last[rec["kind"]] = rec
    print(f"\n{len(got)} messages on topic event_totals; the latest per kind:")
    for kind in sorted(last):
        print(f"  {json.dumps(last[kind])}")
    spark.stop()
    if proc is not None:
        proc.terminate()
        proc.wait(10)
    print("\nOK: totals match what was published" if ok else "\nMISMATCH")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
