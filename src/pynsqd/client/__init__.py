"""The blocking NSQ client shared by the Spark connector, the command-line tools and the tests
(``connection.py``). It speaks to pynsqd and Go nsqd alike."""

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
    "ClientOptions",
    "Connection",
    "NsqConnectionError",
    "NsqError",
    "NsqLookupError",
    "lookup_nodes",
    "lookup_producers",
    "parse_address",
]
