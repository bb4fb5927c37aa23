"""The tools' consumer (``nsq_tail``, ``nsq_to_file``), as go-nsq's Consumer behaves.

Theory of operation. A ``Subscription`` holds one connection per nsqd that has the topic: the
``--nsqd-tcp-address`` nodes (a first connection that fails is fatal, as go-nsq's
ConnectToNSQD) and those ``--lookupd-http-address`` lists, asked at start and every
``--lookupd-poll-interval`` (a topic nobody has yet is waited for; a lookupd that does not
answer is logged, and asked again at the next poll). A connection that closes is logged
("connection closed") and opened again with backoff (1 s doubling to 15 s) for as long as its
node is wanted; a node that appears in lookupd's answer is connected at once. Messages arrive
on ``incoming`` with the connection that delivered them; ``finish`` FINs one (on a connection
that has closed since, nsqd requeued it: it comes again). Lines go to stderr in nsqd's terms,
prefixed with the program's name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
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
from ..client.errors import check_names
from ..internal.optiontable import many, opt
from .common import ToolLog, go_client

#: A message's headers, as the client gives them: (name, value) in order.
Pairs = list[tuple[str, bytes]]


@dataclass
class ConsumerOptions:
    """The flags every consuming tool has (Go's share them too)."""

    max_in_flight: int = opt(200, "max number of messages to allow in flight")
    consumer_opts: list[str] = opt(
        [],
        "option to passthrough to nsq.Consumer (may be given multiple times, http://godoc.org/github.com/nsqio/go-nsq#Config)",
        kind="list",
        flag="consumer-opt",
    )
    nsqd_tcp_addresses: list[str] = many("nsqd TCP address", flag="nsqd-tcp-address")
    lookupd_http_addresses: list[str] = many("lookupd HTTP address", flag="lookupd-http-address")
    lookupd_poll_interval: float = opt(
        60.0, "how often to ask nsqlookupd for the nodes that have the topic", kind="duration"
    )
    message_headers: bool = opt(
        False,
        "pynsqd: ask nsqd for message headers (docs/headers.md): nsq_tail and nsq_to_file print them, nsq_to_nsq and nsq_to_http pass them on",  # noqa: E501
    )


def subscriptions(
    program: str,
    opts: ConsumerOptions,
    topics: list[str],
    channel: str,
    *,
    lookup_timeout: float = 5.0,
    log: ToolLog | None = None,
    topics_found_later: bool = False,
) -> list[Subscription]:
    """One Subscription per topic from the consumer flags; a bad combination is the tool's
    one line and exit 1. With ``topics_found_later`` (nsq_to_file's ``--topic-pattern``) no
    topic need be given yet."""
    if not topics and not topics_found_later:
        print(f"{program}: --topic is required", file=sys.stderr)
        raise SystemExit(1)
    try:
        for topic in topics:
            check_names(topic, channel)
    except ValueError as err:  # named here, before nsqd blames a piece of it
        flag = "--channel" if str(err).startswith("invalid channel") else "--topic"
        print(f"{program}: {flag}: {err}", file=sys.stderr)
        raise SystemExit(1) from None
    if bool(opts.nsqd_tcp_addresses) == bool(opts.lookupd_http_addresses):
        print(
            f"{program}: use --nsqd-tcp-address or --lookupd-http-address, not both (or neither)",
            file=sys.stderr,
        )
        raise SystemExit(1)
    client, max_in_flight = go_client(program, "consumer-opt", opts.consumer_opts)
    if opts.message_headers:
        client = dataclasses.replace(client, headers=True)
    return [
        Subscription(
            program,
            topic,
            channel,
            opts.nsqd_tcp_addresses,
            opts.lookupd_http_addresses,
            client,
            max_in_flight or opts.max_in_flight,
            opts.lookupd_poll_interval,
            lookup_timeout=lookup_timeout,
            log=log,
        )
        for topic in topics
    ]


#: The first wait before connecting to a node again, and the longest.
RECONNECT_FIRST = 1.0
RECONNECT_MAX = 15.0


class Subscription:
    """``topic``/``channel`` on every node that has it, kept connected (module docstring)."""

    def __init__(
        self,
        program: str,
        topic: str,
        channel: str,
        nsqd_addresses: list[str],
        lookupd_addresses: list[str],
        client: ClientOptions,
        max_in_flight: int,
        poll_interval: float,
        *,
        lookup_timeout: float = 5.0,
        log: ToolLog | None = None,
    ) -> None:
        self.program, self.topic, self.channel = program, topic, channel
        self.nsqd_addresses = list(dict.fromkeys(nsqd_addresses))
        self.lookupd_addresses = lookupd_addresses
        self.client = client
        self.max_in_flight = max_in_flight
        self.poll_interval = poll_interval
        self.lookup_timeout = lookup_timeout
        self.log = log or ToolLog(program)
        #: (connection, id, body, headers: empty unless ``--message-headers``)
        self.incoming: Queue[tuple[Connection, bytes, bytes, Pairs]] = Queue()
        self._lock = threading.Lock()
        self._conns: dict[str, Connection] = {}
        self._found: list[str] = []  # from lookupd's last answer
        self._retry_at: dict[str, float] = {}
        self._backoff: dict[str, float] = {}
        #: Addresses whose connection error was said: once until they connect, not at every
        #: retry (as go-nsq; a dead node nsqlookupd still lists is tried every 15 s).
        self._said: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{program}-nodes", daemon=True)
        self._waiting_said = False

    def say(self, line: str, level: str = "info") -> None:
        self.log.say(line, level)

    def start(self) -> None:
        """Connect to the given nodes (raises NsqError/NsqConnectionError/ValueError, the
        tool's one line), ask lookupd, and keep the set of connections up from a thread."""
        for address in self.nsqd_addresses:
            self._connect(address)
        self._poll_lookupd()
        self._thread.start()

    def finish(self, conn: Connection, msg_id: bytes) -> None:
        # On a connection that closed since, nsqd requeued the message: it comes again.
        with contextlib.suppress(NsqError, NsqConnectionError, OSError):
            conn.fin(msg_id)

    def requeue(self, conn: Connection, msg_id: bytes, delay_ms: int) -> None:
        with contextlib.suppress(NsqError, NsqConnectionError, OSError):
            conn.req(msg_id, delay_ms)  # (a closed connection: nsqd requeued it already)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        with self._lock:
            conns = list(self._conns.values())
            self._conns.clear()
        for conn in conns:
            conn.close()

    # -- the connections ----------------------------------------------------------------

    def _wanted(self) -> list[str]:
        return list(dict.fromkeys([*self.nsqd_addresses, *self._found]))

    def _connect(self, address: str) -> None:
        rdy = max(1, self.max_in_flight // max(1, len(self._wanted()), len(self._conns) + 1))
        conn = Connection(address, self.client).connect()
        try:
            conn.subscribe(
                self.topic, self.channel, self._on_messages, on_close=self._on_close, rdy=rdy
            )
        except BaseException:
            conn.close()
            raise
        with self._lock:
            self._conns[address] = conn
        self._backoff.pop(address, None)

    def _on_messages(
        self,
        conn: Connection,
        ts: list[int],
        att: list[int],
        ids: list[bytes],
        bodies: list[bytes],
        hdrs: list[Pairs] | None = None,
    ) -> None:
        for i, (msg_id, body) in enumerate(zip(ids, bodies, strict=True)):
            self.incoming.put((conn, msg_id, body, hdrs[i] if hdrs is not None else []))

    def _on_close(self, conn: Connection) -> None:
        with self._lock:
            if self._conns.get(conn.address) is conn:
                del self._conns[conn.address]
        if self._stop.is_set():
            return
        wait = self._backoff.get(conn.address, RECONNECT_FIRST)
        self._backoff[conn.address] = min(wait * 2, RECONNECT_MAX)
        self._retry_at[conn.address] = time.monotonic() + wait
        self.say(
            f"{conn.address}: connection closed ({conn.close_reason}); connecting again in "
            f"{wait:g}s",
            "warn",
        )

    def _poll_lookupd(self) -> None:
        if not self.lookupd_addresses:
            return
        try:
            self._found = lookup_producers(self.lookupd_addresses, self.topic, self.lookup_timeout)
        except NsqLookupError as err:
            self.say(f"{err}; asking again in {self.poll_interval:g}s", "error")
            return
        if not self._found and not self._conns and not self._waiting_said:
            self._waiting_said = True
            self.say(
                f"no nsqd has topic {self.topic} yet; asking nsqlookupd again every "
                f"{self.poll_interval:g}s"
            )

    def _run(self) -> None:
        next_poll = time.monotonic() + self.poll_interval
        while not self._stop.wait(0.1):
            now = time.monotonic()
            if self.lookupd_addresses and now >= next_poll:
                self._poll_lookupd()
                next_poll = now + self.poll_interval
            for address in self._wanted():
                if address in self._conns or now < self._retry_at.get(address, 0.0):
                    continue
                try:
                    self._connect(address)
                    self._said.discard(address)
                    if address in self._retry_at:
                        self.say(f"{address}: connected to nsqd again")
                        del self._retry_at[address]
                except (NsqError, NsqConnectionError, OSError, ValueError) as err:
                    wait = self._backoff.get(address, RECONNECT_FIRST)
                    self._backoff[address] = min(wait * 2, RECONNECT_MAX)
                    self._retry_at[address] = now + wait
                    if address not in self._said:
                        self._said.add(address)
                        self.say(
                            f"{address}: error connecting to nsqd - {err}; trying again every "
                            f"{RECONNECT_MAX:g}s at most (said once, until it connects)",
                            "error",
                        )
