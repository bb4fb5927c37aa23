"""``nsq_tail``: print a topic's messages to stdout, as Go's nsq_tail does.

It subscribes to an ``#ephemeral`` channel of its own (unless ``--channel`` is given) on every
``--nsqd-tcp-address``, or on every node ``--lookupd-http-address`` lists for the topic, and
writes each message body followed by a newline; ``--n`` stops after that many messages.
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from queue import Queue

from ..client import (
    ClientOptions,
    Connection,
    NsqConnectionError,
    NsqError,
    NsqLookupError,
    lookup_producers,
)
from ..internal.optiontable import opt
from .common import parse

PROGRAM = "nsq_tail"


@dataclass
class TailOptions:
    topic: str = opt("", "NSQ topic")
    channel: str = opt("", "NSQ channel")
    n: int = opt(0, "total messages to show (will wait if starved)")
    print_topic: bool = opt(False, "print topic name where message was received")
    max_in_flight: int = opt(200, "max number of messages to allow in flight")
    nsqd_tcp_addresses: list[str] = opt(
        [], "nsqd TCP address (may be given multiple times)", kind="list", flag="nsqd-tcp-address"
    )
    lookupd_http_addresses: list[str] = opt(
        [],
        "lookupd HTTP address (may be given multiple times)",
        kind="list",
        flag="lookupd-http-address",
    )


def main(argv: list[str] | None = None) -> int:
    opts = parse(PROGRAM, TailOptions, argv)
    if not opts.topic:
        print(f"{PROGRAM}: --topic is required", file=sys.stderr)
        return 1
    if bool(opts.nsqd_tcp_addresses) == bool(opts.lookupd_http_addresses):
        print(
            f"{PROGRAM}: use --nsqd-tcp-address or --lookupd-http-address, not both (or neither)",
            file=sys.stderr,
        )
        return 1
    channel = opts.channel or f"tail{random.randrange(1_000_000):06d}#ephemeral"
    client = ClientOptions(user_agent=f"{PROGRAM}/pynsqd")
    try:
        nodes = list(opts.nsqd_tcp_addresses)
        if opts.lookupd_http_addresses:
            nodes += lookup_producers(opts.lookupd_http_addresses, opts.topic)
        conns = [Connection(node, client).connect() for node in dict.fromkeys(nodes)]
    except (NsqError, NsqConnectionError, NsqLookupError, ValueError) as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr)
        return 1
    if not conns:
        print(f"{PROGRAM}: no nsqd has topic {opts.topic}", file=sys.stderr)
        return 1
    rdy = max(1, opts.max_in_flight // len(conns))
    out: Queue[tuple[Connection, bytes, bytes] | str] = Queue()

    def on_messages(
        conn: Connection, ts: list[int], att: list[int], ids: list[bytes], bodies: list[bytes]
    ) -> None:
        for msg_id, body in zip(ids, bodies, strict=True):
            out.put((conn, msg_id, body))

    def on_close(conn: Connection) -> None:
        out.put(f"{conn.address}: connection closed ({conn.close_reason})")

    try:
        for conn in conns:
            conn.subscribe(opts.topic, channel, on_messages, on_close=on_close, rdy=rdy)
    except (NsqError, NsqConnectionError) as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr)
        return 1
    shown = 0
    stdout = sys.stdout.buffer
    try:
        while not opts.n or shown < opts.n:
            item = out.get()
            if isinstance(item, str):
                print(f"{PROGRAM}: {item}", file=sys.stderr)
                return 1
            conn, msg_id, body = item
            if opts.print_topic:
                stdout.write(opts.topic.encode() + b" | ")
            stdout.write(body + b"\n")
            stdout.flush()
            conn.fin(msg_id)
            shown += 1
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    finally:
        for conn in conns:
            conn.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
