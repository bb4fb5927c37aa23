"""pynsqd's NSQ client, over the sans-IO protocol package, by job:

- ``errors.py``: what it raises, and how it reads an address;
- ``connection.py``: the blocking TCP connection (producers, subscribers, the ``Reactor`` that
  reads many subscribed connections on one thread); the Spark connector, the command-line
  tools and the tests use it;
- ``aio.py``: the same over asyncio streams;
- ``cluster.py``: the cluster's HTTP side: nsqlookupd (the one reader: nodes, producers,
  topics), a node's ``/stats``, a replayable topic's offsets and log (checked records):
  ``read_log`` returns a ``LogChunk`` of ``LogRecord`` (offset, timestamp in ns, id,
  attempts, defer_ms, body), each CRC checked;
- ``logs.py``: a topic's logs across a cluster (``survey_logs``: one per node, or one per
  replicated partition with its in-sync copies) and ``read_range`` with failover between
  copies; the Spark connector and ``nsq_log`` use it.

It speaks to pynsqd and Go nsqd alike."""

from ..protocol.log_record import LogRecord
from .aio import AsyncConnection
from .cluster import (
    LogChunk,
    LogOffsetOutOfRange,
    NodeHTTPError,
    channel_depth,
    channel_stats,
    find_nodes,
    lookup_http_addresses,
    lookup_nodes,
    lookup_producers,
    lookup_topics,
    node_stats,
    producer_address,
    producers_of,
    read_log,
    report_reader,
    topic_offsets,
    topics_of,
)
from .connection import Connection, Reactor
from .errors import NsqConnectionError, NsqError, NsqLookupError, parse_address
from .logs import LogIdentityError, NodeLog, RangeUnreadable, read_range, survey_logs
from .options import ClientOptions

__all__ = [
    "AsyncConnection",
    "ClientOptions",
    "Connection",
    "LogChunk",
    "LogIdentityError",
    "LogOffsetOutOfRange",
    "LogRecord",
    "NodeHTTPError",
    "NodeLog",
    "NsqConnectionError",
    "NsqError",
    "NsqLookupError",
    "RangeUnreadable",
    "Reactor",
    "channel_depth",
    "channel_stats",
    "find_nodes",
    "lookup_http_addresses",
    "lookup_nodes",
    "lookup_producers",
    "lookup_topics",
    "node_stats",
    "parse_address",
    "producer_address",
    "producers_of",
    "read_log",
    "read_range",
    "report_reader",
    "survey_logs",
    "topic_offsets",
    "topics_of",
]
