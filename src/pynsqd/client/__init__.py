"""A small blocking NSQ client over pynsqd's sans-IO protocol package, for the command-line
tools (``pynsqd.tools``). It speaks to pynsqd and Go nsqd alike."""

from .blocking import Connection, NsqError, lookup_nodes

__all__ = ["Connection", "NsqError", "lookup_nodes"]
