"""A log-mode streaming query in its own process (its own Spark driver), for the driver-kill
test: ``python log_query.py HTTP_ADDRESS TOPIC OUT CHECKPOINT`` runs until every record that was
in the log when it started is written to Parquet at OUT, then exits 0."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pyspark.sql import SparkSession

from pynsqd_spark import register


def main() -> int:
    http, topic, out, checkpoint = sys.argv[1:5]
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .getOrCreate()
    )
    register(spark)
    df = (
        spark.readStream.format("nsq")
        .option("mode", "log")
        .option("topic", topic)
        .option("nsqdHttpAddresses", http)
        .option("maxOffsetsPerTrigger", "500")
        .load()
    )
    query = (
        df.select("offset", "body")
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .start()
    )
    query.processAllAvailable()
    query.stop()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
