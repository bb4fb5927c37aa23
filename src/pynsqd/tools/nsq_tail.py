"""``nsq_tail``: print a topic's messages to stdout, as Go's nsq_tail does.

It subscribes to an ``#ephemeral`` channel of its own (unless ``--channel`` is given) on every
``--nsqd-tcp-address``, or on every node ``--lookupd-http-address`` lists for the topic, and
writes each message body followed by a newline; ``--n`` stops after that many messages.
``--topic`` may be given several times: every topic is tailed (``--print-topic`` says which).
Like go-nsq's consumer it rides out a node restarting, picks up nodes that appear, and waits
for a topic nobody has yet (``tools/consumer.py``).
"""

from __future__ import annotations

import random
import sys
import threading
from dataclasses import dataclass
from queue import Empty, Queue

from ..client import Connection, NsqConnectionError, NsqError, NsqLookupError
from ..internal.optiontable import many, opt
from .common import header_line, parse
from .consumer import ConsumerOptions, Pairs, Subscription, subscriptions

PROGRAM = "nsq_tail"


@dataclass
class TailOptions(ConsumerOptions):
    topics: list[str] = many("NSQ topic", flag="topic")
    channel: str = opt("", "NSQ channel")
    n: int = opt(0, "total messages to show (will wait if starved)")
    print_topic: bool = opt(False, "print topic name where message was received")


Tagged = tuple[Subscription, Connection, bytes, bytes, Pairs]


def _forward(sub: Subscription, out: Queue[Tagged], stop: threading.Event) -> None:
    """One topic's messages into the queue of them all, with their subscription."""
    while not stop.is_set():
        try:
            conn, msg_id, body, hdrs = sub.incoming.get(timeout=0.2)
        except Empty:
            continue
        out.put((sub, conn, msg_id, body, hdrs))


def main(argv: list[str] | None = None) -> int:
    opts = parse(PROGRAM, TailOptions, argv)
    channel = opts.channel or f"tail{random.randrange(1_000_000):06d}#ephemeral"
    topics = list(dict.fromkeys(opts.topics))
    subs = subscriptions(PROGRAM, opts, topics, channel)
    merged: Queue[Tagged] = Queue()
    stop = threading.Event()
    shown = 0
    stdout = sys.stdout.buffer
    try:
        for sub in subs:
            sub.start()
            threading.Thread(target=_forward, args=(sub, merged, stop), daemon=True).start()
        while not opts.n or shown < opts.n:
            try:
                sub, conn, msg_id, body, hdrs = merged.get(timeout=0.5)
            except Empty:
                continue
            if opts.print_topic:
                stdout.write(sub.topic.encode() + b" | ")
            if opts.message_headers:  # the headers' JSON, a tab, the body
                stdout.write(header_line(hdrs) + b"\t")
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
        stop.set()
        for sub in subs:
            sub.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
