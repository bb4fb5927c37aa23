"""``nsq_to_nsq``: copy topics from some nsqd to others, as Go's nsq_to_nsq does.

Each ``--topic`` is consumed on ``--channel`` (``tools/consumer.py``: every
``--nsqd-tcp-address`` or every node ``--lookupd-http-address`` lists, kept connected) and each
message is published to ``--destination-topic`` (default: the same topic) on one of the
``--destination-nsqd-tcp-address`` nodes, then FIN'd: only after the destination's OK, so a
failure anywhere delivers again rather than loses (at-least-once). ``--mode round-robin`` takes
the destinations in turn; ``hostpool`` and ``epsilon-greedy`` (Go's default and its variant)
keep to the first one that works and fail over to the next. With ``--require-json-field`` (and
``--require-json-value``) only JSON messages with that field (and value) pass, the others are
FIN'd unpublished; ``--whitelist-json-field`` publishes only those fields. Every
``--status-every`` messages per destination a line says how many went there.

pynsqd: with ``--idempotent`` each publish carries this run's producer id and a sequence number
per destination topic (``core/dedup.py``; retained destination topics), so a publish retried
after a broken connection is written once. A publish that failed on every destination (its
outcome unknown) starts a new producer id: the next numbers never collide with it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from queue import Empty

from ..client import ClientOptions, Connection, NsqConnectionError, NsqError, NsqLookupError
from ..internal.optiontable import many, opt
from .common import go_client, parse
from .consumer import ConsumerOptions, subscriptions

PROGRAM = "nsq_to_nsq"
MODES = ("round-robin", "hostpool", "epsilon-greedy")


@dataclass
class ToNsqOptions(ConsumerOptions):
    topics: list[str] = many("nsq topic", flag="topic")
    channel: str = opt("nsq_to_nsq", "nsq channel")
    destination_topic: str = opt(
        "", "use this destination topic for all consumed topics (default is consumed topic name)"
    )
    destination_nsqd_tcp_addresses: list[str] = many(
        "destination nsqd TCP address", flag="destination-nsqd-tcp-address"
    )
    mode: str = opt(
        "hostpool",
        "the upstream request mode options: round-robin, hostpool (default), epsilon-greedy",
    )
    require_json_field: str = opt(
        "", "for JSON messages: only pass messages that contain this field"
    )
    require_json_value: str = opt(
        "", "for JSON messages: only pass messages in which the required field has this value"
    )
    whitelist_json_fields: list[str] = many(
        "for JSON messages: pass this field", flag="whitelist-json-field"
    )
    status_every: int = opt(
        250, "the # of requests between logging status (per destination), 0 disables"
    )
    producer_opts: list[str] = opt(
        [],
        "option to passthrough to nsq.Producer (may be given multiple times, see http://godoc.org/github.com/nsqio/go-nsq#Config)",
        kind="list",
        flag="producer-opt",
    )
    idempotent: bool = opt(
        False,
        "pynsqd: publish with a producer id and sequence numbers, so that a retried "
        "publish is written once (retained destination topics)",
    )


def transform(opts: ToNsqOptions, body: bytes) -> bytes | None:
    """The body to publish, or None when the JSON filter drops the message."""
    if not (opts.require_json_field or opts.whitelist_json_fields):
        return body
    try:
        doc = json.loads(body)
    except ValueError:
        return None if opts.require_json_field else body
    if not isinstance(doc, dict):
        return None if opts.require_json_field else body
    field = opts.require_json_field
    if field:
        if field not in doc:
            return None
        if opts.require_json_value and str(doc[field]) != opts.require_json_value:
            return None
    if opts.whitelist_json_fields:
        doc = {k: doc[k] for k in opts.whitelist_json_fields if k in doc}
        return json.dumps(doc, separators=(",", ":")).encode()
    return body


class Destinations:
    """The destination nsqd, connected on first use and again after a failure."""

    def __init__(self, opts: ToNsqOptions, client: ClientOptions) -> None:
        self.addresses = list(dict.fromkeys(opts.destination_nsqd_tcp_addresses))
        self.client = client
        self.round_robin = opts.mode == "round-robin"
        self.status_every = opts.status_every
        self._conns: dict[str, Connection] = {}
        self._next = 0
        self.sent = dict.fromkeys(self.addresses, 0)
        self.idempotent = opts.idempotent
        self._producer = ""
        self._seqs: dict[str, int] = {}
        if self.idempotent:
            self._new_producer()

    def _new_producer(self) -> None:
        self._producer = f"{PROGRAM}.{socket.gethostname()[:40]}.{os.getpid()}.{time.time_ns()}"
        self._producer = "".join(c if c.isalnum() or c in "._:-" else "-" for c in self._producer)
        self._seqs = {}

    def publish(self, topic: str, body: bytes, hdrs: list[tuple[str, bytes]] | None = None) -> None:
        """PUB on one destination, failing over to the others; raises the last error.
        ``hdrs``: the message's headers (``--message-headers``), passed on."""
        n = len(self.addresses)
        first = self._next % n
        if self.round_robin:
            self._next += 1
        err: Exception | None = None
        identity = (self._producer, self._seqs.get(topic, 0)) if self.idempotent else None
        for i in range(n):
            address = self.addresses[(first + i) % n]
            try:
                conn = self._conns.get(address)
                if conn is None or conn.closed:
                    conn = self._conns[address] = Connection(address, self.client).connect()
                conn.pub(topic, body, identity=identity, headers=hdrs or None)
            except (NsqError, NsqConnectionError, OSError) as e:
                err = e
                bad = self._conns.pop(address, None)
                if bad is not None:
                    bad.close()
                if not self.round_robin:
                    self._next = (first + i + 1) % n  # hostpool: keep to the next that works
                continue
            self.sent[address] += 1
            if identity is not None:
                self._seqs[topic] = identity[1] + 1
            if self.status_every and self.sent[address] % self.status_every == 0:
                print(f"{PROGRAM}: {address}: {self.sent[address]} published", file=sys.stderr)
            return
        assert err is not None
        if identity is not None:
            self._new_producer()  # that number's outcome is unknown: never reuse it
        raise err

    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()


def main(argv: list[str] | None = None) -> int:
    opts = parse(PROGRAM, ToNsqOptions, argv)
    subs = subscriptions(PROGRAM, opts, opts.topics, opts.channel)
    if not opts.destination_nsqd_tcp_addresses:
        print(f"{PROGRAM}: --destination-nsqd-tcp-address required", file=sys.stderr)
        return 1
    if opts.mode not in MODES:
        print(f"{PROGRAM}: --mode must be one of {', '.join(MODES)}", file=sys.stderr)
        return 1
    if opts.require_json_value and not opts.require_json_field:
        print(f"{PROGRAM}: --require-json-value requires --require-json-field", file=sys.stderr)
        return 1
    producer, _ = go_client(PROGRAM, "producer-opt", opts.producer_opts)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    if opts.message_headers:  # passed on: the destination is asked for them too
        producer = dataclasses.replace(producer, headers=True)
    dest = Destinations(opts, producer)
    try:
        for sub in subs:
            sub.start()
        while not stop.is_set():
            idle = True
            for sub in subs:
                try:
                    conn, msg_id, body, hdrs = sub.incoming.get(timeout=0.05)
                except Empty:
                    continue
                idle = False
                out = transform(opts, body)
                if out is not None:
                    try:
                        dest.publish(opts.destination_topic or sub.topic, out, hdrs)
                    except (NsqError, NsqConnectionError, OSError) as err:
                        print(f"{PROGRAM}: publishing failed - {err}; requeued", file=sys.stderr)
                        sub.requeue(conn, msg_id, 1000)
                        continue
                sub.finish(conn, msg_id)
            if idle:
                stop.wait(0.01)
    except (NsqError, NsqConnectionError, NsqLookupError, ValueError) as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr)
        return 1
    finally:
        for sub in subs:
            sub.stop()
        dest.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
