"""``nsq_tail``: print a topic's messages to stdout, as Go's nsq_tail does.

It subscribes to an ``#ephemeral`` channel of its own (unless ``--channel`` is given) on every
``--nsqd-tcp-address``, or on every node ``--lookupd-http-address`` lists for the topic, and
writes each message body followed by a newline; ``--n`` stops after that many messages. Like
go-nsq's consumer it rides out a node restarting, picks up nodes that appear, and waits for a
topic nobody has yet (``tools/consumer.py``).
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass
from queue import Empty

from ..client import NsqConnectionError, NsqError, NsqLookupError
from ..internal.optiontable import opt
from .common import go_client, parse
from .consumer import Subscription

PROGRAM = "nsq_tail"


@dataclass
class TailOptions:
    topic: str = opt("", "NSQ topic")
    channel: str = opt("", "NSQ channel")
    n: int = opt(0, "total messages to show (will wait if starved)")
    print_topic: bool = opt(False, "print topic name where message was received")
    max_in_flight: int = opt(200, "max number of messages to allow in flight")
    consumer_opts: list[str] = opt(
        [],
        "option to passthrough to nsq.Consumer (may be given multiple times, http://godoc.org/github.com/nsqio/go-nsq#Config)",
        kind="list",
        flag="consumer-opt",
    )
    nsqd_tcp_addresses: list[str] = opt(
        [], "nsqd TCP address (may be given multiple times)", kind="list", flag="nsqd-tcp-address"
    )
    lookupd_http_addresses: list[str] = opt(
        [],
        "lookupd HTTP address (may be given multiple times)",
        kind="list",
        flag="lookupd-http-address",
    )
    lookupd_poll_interval: float = opt(
        60.0, "how often to ask nsqlookupd for the nodes that have the topic", kind="duration"
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
    client, max_in_flight = go_client(PROGRAM, "consumer-opt", opts.consumer_opts)
    sub = Subscription(
        PROGRAM,
        opts.topic,
        channel,
        opts.nsqd_tcp_addresses,
        opts.lookupd_http_addresses,
        client,
        max_in_flight or opts.max_in_flight,
        opts.lookupd_poll_interval,
    )
    shown = 0
    stdout = sys.stdout.buffer
    try:
        sub.start()
        while not opts.n or shown < opts.n:
            try:
                conn, msg_id, body = sub.incoming.get(timeout=0.5)
            except Empty:
                continue
            if opts.print_topic:
                stdout.write(opts.topic.encode() + b" | ")
            stdout.write(body + b"\n")
            stdout.flush()
            sub.finish(conn, msg_id)
            shown += 1
    except (NsqError, NsqConnectionError, NsqLookupError, ValueError) as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    finally:
        sub.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
