"""``nsq_tail``: print a topic's messages to stdout, as Go's nsq_tail does.

It subscribes to an ``#ephemeral`` channel of its own (unless ``--channel`` is given) on every
``--nsqd-tcp-address``, or on every node ``--lookupd-http-address`` lists for the topic, and
writes each message body followed by a newline; ``--n`` stops after that many messages.
"""

from __future__ import annotations

import random
import sys
import threading
from dataclasses import dataclass
from queue import Queue

from ..client import Connection, NsqError, lookup_nodes
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
    try:
        nodes = list(opts.nsqd_tcp_addresses)
        for lookupd in opts.lookupd_http_addresses:
            nodes += [n for n in lookup_nodes(lookupd, opts.topic) if n not in nodes]
        conns = [Connection(node, user_agent=f"{PROGRAM}/pynsqd") for node in nodes]
    except NsqError as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr)
        return 1
    if not conns:
        print(f"{PROGRAM}: no nsqd has topic {opts.topic}", file=sys.stderr)
        return 1
    rdy = max(1, opts.max_in_flight // len(conns))
    out: Queue[tuple[Connection, bytes, bytes] | NsqError] = Queue(maxsize=opts.max_in_flight)

    def read(conn: Connection) -> None:
        try:
            conn.subscribe(opts.topic, channel, rdy)
            for m in conn.messages():
                out.put((conn, m.id, m.body))
        except NsqError as err:
            out.put(err)

    for conn in conns:
        threading.Thread(target=read, args=(conn,), daemon=True).start()
    shown = 0
    stdout = sys.stdout.buffer
    try:
        while not opts.n or shown < opts.n:
            item = out.get()
            if isinstance(item, NsqError):
                print(f"{PROGRAM}: {item}", file=sys.stderr)
                return 1
            conn, msg_id, body = item
            if opts.print_topic:
                stdout.write(opts.topic.encode() + b" | ")
            stdout.write(body + b"\n")
            stdout.flush()
            conn.finish(msg_id)
            shown += 1
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    finally:
        for conn in conns:
            conn.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
