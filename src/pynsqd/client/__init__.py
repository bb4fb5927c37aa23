"""pynsqd's NSQ client, over the sans-IO protocol package: a blocking front end
(``connection.py``: the Spark connector, the command-line tools and the tests use it) and an
asyncio one (``aio.py``). It speaks to pynsqd and Go nsqd alike."""

from .aio import AsyncConnection
from .connection import (
    ClientOptions,
    Connection,
    NsqConnectionError,
    NsqError,
    NsqLookupError,
    lookup_nodes,
    lookup_producers,
    parse_address,
)

__all__ = [
    "AsyncConnection",
    "ClientOptions",
    "Connection",
    "NsqConnectionError",
    "NsqError",
    "NsqLookupError",
    "lookup_nodes",
    "lookup_producers",
    "parse_address",
]
