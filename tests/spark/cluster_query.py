"""A Spark driver of its own (client mode) for the standalone-cluster tests: each job runs
in this process so that the test can kill it (and the test process keeps its local Spark).

    python cluster_query.py MASTER_URL JOB ARGS...

- ``batch LOOKUPD TOPIC OUT``: a log-mode batch read through nsqlookupd into Parquet at OUT;
- ``log LOOKUPD TOPIC OUT CHECKPOINT`` and ``channel LOOKUPD TOPIC OUT CHECKPOINT``: a stream
  (Trigger.AvailableNow, small batches) into Parquet, from the log or from channel ``spark``;
- ``nodes HTTP_ADDRESSES TOPIC OUT CHECKPOINT``: as ``log`` but from the nsqd addresses
  given (comma-separated), 500 records a batch (MASTER ``local[2]`` for a local driver);
- ``sink LOOKUPD TOPIC ROWS``: ``df.write`` of ROWS bodies over 4 tasks into TOPIC.
- ``relay LOOKUPD TOPIC OUT_TOPIC CHECKPOINT FAIL_ON MARKER``: a log-mode stream of TOPIC
  through the nsq sink into OUT_TOPIC (exactly-once); the task that meets body FAIL_ON fails
  once (MARKER says it did: the row is null that once), after the sink published the rows
  before it.

Exits 0 once the job is done."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession

from pynsqd_spark import register

#: Records per micro-batch of the streams: many batches, so the faults land mid-query.
PER_TRIGGER = "4000"


#: Spark gives a Python process it starts for a streaming source a fixed 10 s to connect back
#: (``PythonWorkerFactory.createSimpleWorker``); on a saturated 2-core machine that start can
#: take longer, and the query fails before its first batch.
WORKER_TIMEOUT = "Python worker failed to connect back"


def run_to_the_end(start: Callable[[], Any]) -> None:
    """Start the query and wait for it; a query that Spark's slow Python start failed is
    started again from its checkpoint (what a driver's supervisor does), at most 3 times."""
    for attempt in range(3):
        try:
            start().awaitTermination()
            return
        except StreamingQueryException as err:
            if WORKER_TIMEOUT not in str(err) or attempt == 2:
                raise
            print(f"cluster_query: {WORKER_TIMEOUT}: starting the query again", file=sys.stderr)


def main() -> int:
    master, job, *args = sys.argv[1:]
    spark = (
        SparkSession.builder.master(master)
        .appName(f"pynsqd-cluster-{job}")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        # The sink publishes as the rows come (a task fails mid-way with part of them sent).
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "250")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        # As the tests' own JVMs (tests/spark/conftest.py JVM_OPTS, through SPARK_SUBMIT_OPTS).
        .config("spark.executor.extraJavaOptions", os.environ.get("SPARK_SUBMIT_OPTS", ""))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    lookupd, topic = args[0], args[1]
    if job == "batch":
        (
            spark.read.format("nsq")
            .option("mode", "log")
            .option("topic", topic)
            .option("nsqlookupdHttpAddresses", lookupd)
            .option("minPartitions", "4")
            .load()
            .select("nsqd_address", "offset", "body")
            .write.mode("overwrite")
            .parquet(args[2])
        )
    elif job in ("log", "channel", "nodes"):
        reader = spark.readStream.format("nsq").option("topic", topic)
        if job == "nodes":
            reader = (
                reader.option("mode", "log")
                .option("nsqdHttpAddresses", lookupd)
                .option("maxOffsetsPerTrigger", "500")
            )
        elif job == "log":
            reader = (
                reader.option("nsqlookupdHttpAddresses", lookupd)
                .option("mode", "log")
                .option("maxOffsetsPerTrigger", PER_TRIGGER)
            )
        else:
            reader = (
                reader.option("nsqlookupdHttpAddresses", lookupd)
                .option("mode", "channel")
                .option("channel", "spark")
                .option("maxMessagesPerBatch", PER_TRIGGER)
            )
        columns = ["body"] if job == "channel" else ["offset", "body"]
        run_to_the_end(
            lambda: (
                reader.load()
                .select(*columns)
                .writeStream.format("parquet")
                .option("path", args[2])
                .option("checkpointLocation", args[3])
                .trigger(availableNow=True)
                .start()
            )
        )
    elif job == "relay":
        from pyspark import TaskContext
        from pyspark.sql.functions import udf
        from pyspark.sql.types import BinaryType

        out_topic, checkpoint, fail_on, marker = args[2], args[3], args[4].encode(), args[5]

        def fail_once(body: bytes) -> bytes | None:
            # A null body the first time: the sink has published the rows before it (in
            # record batches of 250) and fails the task naming the row; the retry has it.
            if body == fail_on and not os.path.exists(marker):
                ctx = TaskContext.get()
                with open(marker, "w") as f:
                    f.write(f"partition {ctx.partitionId() if ctx else '?'}")
                return None
            return body

        run_to_the_end(
            lambda: (
                spark.readStream.format("nsq")
                .option("mode", "log")
                .option("topic", topic)
                .option("nsqlookupdHttpAddresses", lookupd)
                .option("maxOffsetsPerTrigger", PER_TRIGGER)
                .load()
                .select(udf(fail_once, BinaryType())("body").alias("body"))
                .writeStream.format("nsq")
                .option("topic", out_topic)
                .option("nsqlookupdHttpAddresses", lookupd)
                .option("checkpointLocation", checkpoint)
                .trigger(availableNow=True)
                .start()
            )
        )
    elif job == "sink":
        (
            spark.range(int(args[2]), numPartitions=4)
            .selectExpr("cast(id as string) as body")
            .write.format("nsq")
            .mode("append")
            .option("topic", topic)
            .option("nsqlookupdHttpAddresses", lookupd)
            .save()
        )
    else:
        raise SystemExit(f"unknown job {job!r}")
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
