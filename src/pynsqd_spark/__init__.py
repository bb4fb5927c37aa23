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

__all__ = ["NsqDataSource", "check_workers_python", "register", "source_metrics"]


def register(spark: SparkSession) -> None:
    """Register the ``nsq`` data source with a SparkSession. In local mode it first checks
    that Spark's Python workers can import this package (one line saying what to set, rather
    than each task's long ModuleNotFoundError)."""
    from .datasource import NsqDataSource

    sc = spark.sparkContext
    if str(sc.master).startswith("local"):
        check_workers_python(str(sc.pythonExec or "python3"))
    spark.dataSource.register(NsqDataSource)


def check_workers_python(python: str) -> None:
    """Raises RuntimeError when ``python`` (the workers' interpreter) cannot import
    pynsqd_spark: PYSPARK_PYTHON names another interpreter, or is not set."""
    import os
    import shutil
    import subprocess
    import sys

    found = shutil.which(python)
    if found is not None and os.path.realpath(found) == os.path.realpath(sys.executable):
        return
    try:
        ok = found is not None and (
            subprocess.run(
                [found, "-c", "import pynsqd_spark"], capture_output=True, timeout=60
            ).returncode
            == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        raise RuntimeError(
            f"Spark's Python workers run {python!r}, which cannot import pynsqd_spark: set "
            f"PYSPARK_PYTHON (or spark.pyspark.python) to the interpreter it is installed in, "
            f"e.g. {sys.executable}, before the SparkSession starts"
        )


def __getattr__(name: str) -> Any:
    if name == "NsqDataSource":
        from .datasource import NsqDataSource

        return NsqDataSource
    if name == "source_metrics":
        from .progress import source_metrics

        return source_metrics
    raise AttributeError(name)
