"""PySpark connector for NSQ: ``format("nsq")`` as a Structured Streaming source and a sink.

    from pynsqd_spark import register
    register(spark)
    df = (spark.readStream.format("nsq").option("topic", "events").option("channel", "spark")
          .option("nsqdTcpAddresses", "127.0.0.1:4150").load())

Install with ``pip install '.[spark]'`` from a clone. The NSQ client it uses is pynsqd's own
(``pynsqd.client``), shared with the command-line tools. The pynsqd server never imports this
package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["NsqDataSource", "register", "source_metrics"]


def register(spark: SparkSession) -> None:
    """Register the ``nsq`` data source with a SparkSession."""
    from .datasource import NsqDataSource

    spark.dataSource.register(NsqDataSource)


def __getattr__(name: str) -> Any:
    if name == "NsqDataSource":
        from .datasource import NsqDataSource

        return NsqDataSource
    if name == "source_metrics":
        from .progress import source_metrics

        return source_metrics
    raise AttributeError(name)
