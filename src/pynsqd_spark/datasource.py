"""The ``nsq`` data source: registration entry point for the source and the sinks."""

from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from .channel_source import SOURCE_SCHEMA, SOURCE_SCHEMA_WITH_HEADERS, NsqStreamReader
from .log_source import (
    LOG_SCHEMA,
    LOG_SCHEMA_WITH_HEADERS,
    NsqLogBatchReader,
    NsqLogStreamReader,
    retained_everywhere,
)
from .options import LogOptions, NsqOptionError, SinkOptions, SourceOptions
from .sink import NsqArrowWriter, NsqStreamArrowWriter

#: What a batch read needs, after the reason it cannot have it.
BATCH_NEEDS_LOG = (
    "batch reads (spark.read) need a replayable topic, which a channel cannot be (it is read "
    "once). Give the topic retention on every node (nsqd --retention-time, or POST "
    "/topic/retention) and name the nodes with 'nsqdHttpAddresses' or "
    "'nsqlookupdHttpAddresses'; for a channel use spark.readStream"
)


class NsqDataSource(DataSource):
    """``format("nsq")``: ``readStream`` reads a topic/channel; ``write``/``writeStream`` publish.

    Register it with ``spark.dataSource.register(NsqDataSource)`` (or ``pynsqd_spark.register``).
    """

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def _mode(self) -> str:
        """``mode``: ``log`` (a replayable topic, read by offset on the executors), ``channel``
        (a channel, through the driver) or ``auto`` (log when every nsqd found, in
        ``nsqdHttpAddresses`` and through ``nsqlookupdHttpAddresses``, has the topic
        retained)."""
        mode = str(self.options.get("mode") or "auto").strip().lower()
        if mode not in ("auto", "log", "channel"):
            raise NsqOptionError(f"option 'mode' must be auto, log or channel, got {mode!r}")
        if mode == "auto":
            self._why_not_log = retained_everywhere(self.options)
            mode = "log" if self._why_not_log is None else "channel"
        return mode

    def schema(self) -> StructType:
        """Called by ``load()``: the options are checked here, so that a misspelled or missing
        one is refused at ``load()``, naming it, not when the query starts."""
        if self._mode() == "log":
            if LogOptions.parse(self.options).include_headers:
                return LOG_SCHEMA_WITH_HEADERS
            return LOG_SCHEMA
        try:
            SourceOptions.parse(self.options)
        except NsqOptionError as err:
            why = getattr(self, "_why_not_log", None)
            if why is None:
                raise
            # Mode auto could not read the log, and the options do not make a channel either:
            # the log's reason first (a batch read needs it), then the channel's.
            raise NsqOptionError(
                f"{why}: the topic cannot be read as a log, and not as a channel either "
                f"({err}). {BATCH_NEEDS_LOG}"
            ) from None
        if SourceOptions.parse(self.options).include_headers:
            return SOURCE_SCHEMA_WITH_HEADERS
        return SOURCE_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self._mode() == "log":
            return NsqLogStreamReader(LogOptions.parse(self.options))
        return NsqStreamReader(SourceOptions.parse(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        if self._mode() != "log":
            why = getattr(self, "_why_not_log", None) or "option 'mode' is 'channel'"
            raise NsqOptionError(f"{why}: {BATCH_NEEDS_LOG}")
        return NsqLogBatchReader(LogOptions.parse(self.options))

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
