"""The ``nsq`` data source: registration entry point for the source and the sinks."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .options import NsqOptionError, SinkOptions, SourceOptions
from .sink import NsqArrowWriter, NsqStreamArrowWriter
from .source import SOURCE_SCHEMA, NsqStreamReader


class NsqDataSource(DataSource):
    """``format("nsq")``: ``readStream`` reads a topic/channel; ``write``/``writeStream`` publish.

    Register it with ``spark.dataSource.register(NsqDataSource)`` (or ``pynsqd_spark.register``).
    """

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> StructType:
        return SOURCE_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return NsqStreamReader(SourceOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise NsqOptionError("the nsq sink only appends: use mode 'append'")
        return NsqArrowWriter(
            SinkOptions.parse(self.options, "topic" in schema.fieldNames()), schema
        )

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return NsqStreamArrowWriter(
            SinkOptions.parse(self.options, "topic" in schema.fieldNames()), schema
        )
