"""``to_nsq``: publish each line of stdin to a topic, as Go's to_nsq does.

Each ``--delimiter``-separated record (without the delimiter; empty ones skipped) is published
to every ``--nsqd-tcp-address``; ``--rate`` caps messages per second (0: as fast as nsqd takes
them).

pynsqd: with ``--producer-id``, record i of the input is published with that producer and
sequence number i (idempotent publishing, ``core/dedup.py``; the topic must retain a log). A
publish that fails is retried on a new connection with the same identity, and running the same
input again with the same ``--producer-id`` after a crash skips what the topic already has:
each record once in the topic.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

from ..client import ClientOptions, Connection, NsqConnectionError, NsqError
from ..client.errors import check_names
from ..internal.names import is_valid_producer
from ..internal.optiontable import many, opt
from ..protocol import headers as header_codec
from ..protocol.headers import HeaderError
from .common import go_config, parse

PROGRAM = "to_nsq"
#: --producer-id: how many times a publish is retried on a new connection.
RETRIES = 4


@dataclass
class ToNsqOptions:
    topic: str = opt("", "NSQ topic to publish to")
    delimiter: str = opt("\n", "character to split input from stdin")
    rate: int = opt(0, "Throttle messages per second")
    producer_opts: list[str] = opt(
        [],
        "option to passthrough to nsq.Producer (may be given multiple times, http://godoc.org/github.com/nsqio/go-nsq#Config)",
        kind="list",
        flag="producer-opt",
    )
    nsqd_tcp_addresses: list[str] = many("destination nsqd TCP address", flag="nsqd-tcp-address")
    producer_id: str = opt(
        "",
        "pynsqd: publish record i with this producer id and sequence number i: retries "
        "and a re-run of the same input write each record once (a retained topic)",
    )
    message_headers: list[str] = many(
        "pynsqd: a header NAME=VALUE of every message (repeatable; docs/headers.md)",
        flag="message-header",
    )


def main(argv: list[str] | None = None) -> int:
    opts = parse(PROGRAM, ToNsqOptions, argv)
    if not opts.topic:
        print(f"{PROGRAM}: --topic required", file=sys.stderr)
        return 1
    try:
        check_names(opts.topic)
    except ValueError as err:  # a space would split the command: it published to "bad"
        print(f"{PROGRAM}: --topic: {err}", file=sys.stderr)
        return 1
    if len(opts.delimiter.encode()) != 1:
        print(f"{PROGRAM}: --delimiter must be a single byte", file=sys.stderr)
        return 1
    if not opts.nsqd_tcp_addresses:
        print(f"{PROGRAM}: --nsqd-tcp-address required", file=sys.stderr)
        return 1
    if opts.producer_id and not is_valid_producer(opts.producer_id.encode()):
        print(f"{PROGRAM}: --producer-id: 1-128 of A-Z a-z 0-9 . _ : -", file=sys.stderr)
        return 1
    pairs: list[tuple[str, bytes]] = []
    for given in opts.message_headers:
        name, eq, value = given.partition("=")
        pairs.append((name, value.encode()))
        try:
            if not eq:
                raise HeaderError("give it as NAME=VALUE")
            header_codec.encode(pairs)
        except HeaderError as err:
            print(f"{PROGRAM}: --message-header {given!r}: {err}", file=sys.stderr)
            return 1
    hdrs = pairs or None
    try:
        client, _ = go_config(
            "producer-opt",
            opts.producer_opts,
            ClientOptions(user_agent=f"{PROGRAM}/pynsqd", headers=bool(pairs)),
        )
        conns = [Connection(a, client).connect() for a in opts.nsqd_tcp_addresses]
    except (NsqError, NsqConnectionError, ValueError) as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr)
        return 1
    delim = opts.delimiter.encode()
    interval = 1.0 / opts.rate if opts.rate > 0 else 0.0
    next_at = time.monotonic()
    sent = 0
    #: --producer-id: publishes (a record to a node) the topic already had: not written again.
    already = 0
    try:
        for record in _records(sys.stdin.buffer, delim):
            if interval:
                now = time.monotonic()
                if next_at > now:
                    time.sleep(next_at - now)
                next_at = max(next_at, now) + interval
            if opts.producer_id:
                for i, conn in enumerate(conns):
                    conns[i], duplicates = _pub_again(conn, client, opts, record, sent, hdrs)
                    already += duplicates
            else:
                for conn in conns:
                    conn.pub(opts.topic, record, headers=hdrs)
            sent += 1
    except (NsqError, NsqConnectionError) as err:
        # What was acknowledged, and that the record at hand may or may not have been written.
        print(
            f"{PROGRAM}: {err} (record {sent + 1}: not acknowledged; the {sent} records "
            "before it were)",
            file=sys.stderr,
        )
        return 1
    finally:
        for conn in conns:
            conn.close()
    if opts.producer_id:
        # A record an earlier run wrote is acknowledged, and the OK says it was there.
        written = sent * len(conns) - already
        print(
            f"{PROGRAM}: {sent} records acknowledged on {opts.topic} as producer "
            f"{opts.producer_id} (sequences 0-{sent - 1}): {written} written"
            + (f", {already} were already in the topic (not written again)" if already else "")
            if sent
            else f"{PROGRAM}: no records to publish",
            file=sys.stderr,
        )
    else:
        print(f"{PROGRAM}: published {sent} messages to {opts.topic}", file=sys.stderr)
    return 0


def _pub_again(
    conn: Connection,
    client: ClientOptions,
    opts: ToNsqOptions,
    record: bytes,
    seq: int,
    hdrs: list[tuple[str, bytes]] | None = None,
) -> tuple[Connection, int]:
    """An idempotent PUB, retried on a new connection (a few times, backing off) when the
    connection breaks: the identity makes a retry of a publish that was written a no-op.
    Returns the connection to go on with, and 1 if the topic already had the record."""
    identity = (opts.producer_id, seq)
    for attempt in range(RETRIES + 1):
        try:
            if conn.closed:
                conn = Connection(conn.address, client).connect()
            return conn, conn.pub(opts.topic, record, identity=identity, headers=hdrs)
        except NsqConnectionError as err:
            conn.close()
            if attempt == RETRIES:
                raise NsqConnectionError(
                    f"{err}; run the same input again with --producer-id={opts.producer_id} "
                    f"to go on: the {seq} records before this one are skipped",
                    conn.address,
                ) from err
            time.sleep(0.1 * 2**attempt)
    raise AssertionError("unreachable")


def _records(stream: BinaryIO, delim: bytes) -> Iterator[bytes]:
    """The non-empty records of ``stream`` split at ``delim`` (the last one may lack it)."""
    rest = b""
    while chunk := stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16):
        parts = (rest + chunk).split(delim)
        rest = parts.pop()
        yield from (p for p in parts if p)
    if rest:
        yield rest


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
