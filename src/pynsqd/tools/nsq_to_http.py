"""``nsq_to_http``: deliver a topic's messages to HTTP endpoints, as Go's nsq_to_http does.

``--topic`` is consumed on ``--channel`` (``tools/consumer.py``: every ``--nsqd-tcp-address``
or every node ``--lookupd-http-address`` lists, kept connected) by ``--n`` workers, each of
which takes a message, makes one request and FINs the message only after a 2xx answer: any
other status, a refused connection or a timeout requeues it (``REQ``, delivered again later:
at-least-once, as Go's). ``--post`` URLs get the body as the request's body with
``--content-type``; ``--get`` URLs get it in place of ``%s`` (URL-escaped). With several URLs,
``--mode round-robin`` takes them in turn; ``hostpool`` and ``epsilon-greedy`` (Go's default and
its variant) keep to one URL until a request to it fails, then move to the next; the failed
message is requeued either way, as Go's. ``--header``
``Name: value`` adds a header to every request; ``--sample`` delivers that fraction of the
messages and FINs the rest unsent. ``--http-client-connect-timeout`` bounds the connect,
``--http-client-request-timeout`` each wait for the server after it. Every ``--status-every``
requests per URL a line gives their count and their 95th/99th percentile and mean duration.
"""

from __future__ import annotations

import http.client
import random
import signal
import statistics
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass
from queue import Empty

from ..client import NsqConnectionError, NsqError, NsqLookupError
from ..internal.optiontable import many, opt
from .common import parse
from .consumer import ConsumerOptions, Subscription, subscriptions

PROGRAM = "nsq_to_http"
MODES = ("round-robin", "hostpool", "epsilon-greedy")
#: How long a message whose request failed waits before it is delivered again.
REQUEUE_MS = 1000


@dataclass
class ToHttpOptions(ConsumerOptions):
    topic: str = opt("", "nsq topic")
    channel: str = opt("nsq_to_http", "nsq channel")
    posts: list[str] = opt(
        [],
        "HTTP address to make a POST request to.  data will be in the body (may be given "
        "multiple times)",
        kind="list",
        flag="post",
    )
    gets: list[str] = opt(
        [],
        "HTTP address to make a GET request to. '%s' will be printf replaced with data (may "
        "be given multiple times)",
        kind="list",
        flag="get",
    )
    headers: list[str] = many("Custom header for HTTP requests", flag="header")
    content_type: str = opt("application/octet-stream", "the Content-Type used for POST requests")
    mode: str = opt(
        "hostpool",
        "the upstream request mode options: round-robin, hostpool (default), epsilon-greedy",
    )
    n: int = opt(100, "number of concurrent publishers")
    sample: float = opt(1.0, "% of messages to publish (float b/w 0 -> 1)")
    status_every: int = opt(
        250, "the # of requests between logging status (per handler), 0 disables"
    )
    http_client_connect_timeout: float = opt(2.0, "timeout for HTTP connect", kind="duration")
    http_client_request_timeout: float = opt(20.0, "timeout for HTTP request", kind="duration")


class RequestFailed(Exception):
    pass


@dataclass(frozen=True)
class Endpoint:
    method: str  # GET or POST
    url: str
    scheme: str
    host: str  # host[:port]
    target: str  # path and query, with %s for a GET's body

    @classmethod
    def parse(cls, method: str, url: str) -> Endpoint:
        u = urllib.parse.urlsplit(url if "://" in url else f"http://{url}")
        if u.scheme not in ("http", "https") or not u.netloc:
            raise ValueError(f"--{method.lower()}={url}: not an http:// or https:// URL")
        target = u.path or "/"
        if u.query:
            target += "?" + u.query
        if method == "GET" and "%s" not in url:
            raise ValueError(f"--get={url}: the URL needs a %s for the message body")
        return cls(method, url, u.scheme, u.netloc, target)


def parse_headers(values: list[str]) -> dict[str, str]:
    """``--header`` values, ``Name: value`` as Go splits them; raises ValueError."""
    out: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition(":")
        if not sep or not name.strip():
            raise ValueError(f"--header={item}: expected Name: value")
        out[name.strip()] = value.strip()
    return out


class Status:
    """Per-URL request counts and durations, a line every ``--status-every`` requests."""

    def __init__(self, every: int) -> None:
        self.every = every
        self._lock = threading.Lock()
        self._count: dict[str, int] = {}
        self._times: dict[str, list[float]] = {}

    def done(self, url: str, seconds: float) -> None:
        if not self.every:
            return
        with self._lock:
            n = self._count[url] = self._count.get(url, 0) + 1
            times = self._times.setdefault(url, [])
            times.append(seconds * 1000)
            if n % self.every:
                return
            self._times[url] = []
        cuts = statistics.quantiles(times, n=100) if len(times) > 1 else times * 99
        print(
            f"{PROGRAM}: {url}: finished {n} requests - 99th: {cuts[98]:.2f}ms - "
            f"95th: {cuts[94]:.2f}ms - avg: {statistics.fmean(times):.2f}ms",
            file=sys.stderr,
            flush=True,
        )


class Endpoints:
    """The URLs, one to try first per message by ``--mode``, and each worker's connections."""

    def __init__(self, opts: ToHttpOptions, endpoints: list[Endpoint]) -> None:
        self.endpoints = endpoints
        self.round_robin = opts.mode == "round-robin"
        self.headers = parse_headers(opts.headers)
        self.content_type = opts.content_type
        self.connect_timeout = opts.http_client_connect_timeout
        self.request_timeout = opts.http_client_request_timeout
        self.status = Status(opts.status_every)
        self._lock = threading.Lock()
        self._next = 0
        self._local = threading.local()

    def deliver(self, body: bytes, hdrs: list[tuple[str, bytes]] | None = None) -> None:
        """One request for ``body`` to the URL ``--mode`` picks; raises RequestFailed naming
        the failure (the message is requeued, as Go's; hostpool moves on to the next URL).
        ``hdrs``: the message's headers, sent as ``Nsq-Header-<name>`` request headers."""
        with self._lock:
            i = self._next % len(self.endpoints)
            if self.round_robin:
                self._next += 1
        ep = self.endpoints[i]
        started = time.monotonic()
        try:
            status = self._request(ep, body, hdrs or [])
        except (OSError, http.client.HTTPException) as e:
            self._drop(ep)
            err = f"{ep.url}: {e or type(e).__name__}"
        else:
            self.status.done(ep.url, time.monotonic() - started)
            if 200 <= status < 300:
                return
            err = f"{ep.url}: got status code {status}"
        if not self.round_robin:
            with self._lock:
                if self._next % len(self.endpoints) == i:
                    self._next = i + 1  # hostpool: the next message tries the next URL
        raise RequestFailed(err)

    def _request(self, ep: Endpoint, body: bytes, hdrs: list[tuple[str, bytes]]) -> int:
        conns: dict[Endpoint, http.client.HTTPConnection] = self._local.__dict__.setdefault(
            "conns", {}
        )
        conn = conns.get(ep)
        if conn is None:
            cls = (
                http.client.HTTPSConnection if ep.scheme == "https" else http.client.HTTPConnection
            )
            conn = conns[ep] = cls(ep.host, timeout=self.connect_timeout)
        if conn.sock is None:
            conn.connect()
            assert conn.sock is not None
            conn.sock.settimeout(self.request_timeout)
        headers = dict(self.headers)
        for name, value in hdrs:  # as nsqd's /pub takes them (docs/headers.md)
            headers[f"Nsq-Header-{name}"] = value.decode("latin-1")
        if ep.method == "POST":
            headers.setdefault("Content-Type", self.content_type)
            conn.request("POST", ep.target, body=body, headers=headers)
        else:
            target = ep.target.replace("%s", urllib.parse.quote_plus(body), 1)
            conn.request("GET", target, headers=headers)
        resp = conn.getresponse()
        resp.read()
        if resp.will_close:
            conn.close()
        return resp.status

    def _drop(self, ep: Endpoint) -> None:
        conn = self._local.__dict__.get("conns", {}).pop(ep, None)
        if conn is not None:
            conn.close()


def work(sub: Subscription, endpoints: Endpoints, sample: float, stop: threading.Event) -> None:
    """One of ``--n`` workers: a message, a request, FIN or REQ."""
    while not stop.is_set():
        try:
            conn, msg_id, body, hdrs = sub.incoming.get(timeout=0.1)
        except Empty:
            continue
        if sample < 1.0 and random.random() >= sample:
            sub.finish(conn, msg_id)  # not sampled: acknowledged unsent, as Go's
            continue
        try:
            endpoints.deliver(body, hdrs)
        except RequestFailed as err:
            sub.say(f"request failed - {err}; requeued")
            sub.requeue(conn, msg_id, REQUEUE_MS)
            continue
        sub.finish(conn, msg_id)


def main(argv: list[str] | None = None) -> int:
    opts = parse(PROGRAM, ToHttpOptions, argv)
    if not opts.topic:
        print(f"{PROGRAM}: --topic is required", file=sys.stderr)
        return 1
    if not opts.posts and not opts.gets:
        print(f"{PROGRAM}: --get or --post required", file=sys.stderr)
        return 1
    if opts.posts and opts.gets:
        print(f"{PROGRAM}: use --get or --post, not both", file=sys.stderr)
        return 1
    if opts.mode not in MODES:
        print(f"{PROGRAM}: --mode must be one of {', '.join(MODES)}", file=sys.stderr)
        return 1
    if not 0.0 <= opts.sample <= 1.0:
        print(f"{PROGRAM}: --sample must be between 0.0 and 1.0", file=sys.stderr)
        return 1
    if opts.n < 1:
        print(f"{PROGRAM}: --n must be at least 1", file=sys.stderr)
        return 1
    try:
        method, urls = ("POST", opts.posts) if opts.posts else ("GET", opts.gets)
        endpoints = Endpoints(opts, [Endpoint.parse(method, u) for u in dict.fromkeys(urls)])
    except ValueError as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr)
        return 1
    if not opts.max_in_flight or opts.max_in_flight < opts.n:
        # As Go's: fewer in flight than workers would leave workers idle.
        opts.max_in_flight = max(opts.max_in_flight, opts.n)
    (sub,) = subscriptions(PROGRAM, opts, [opts.topic], opts.channel)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    workers = [
        threading.Thread(
            target=work,
            args=(sub, endpoints, opts.sample, stop),
            name=f"{PROGRAM}-{i}",
            daemon=True,
        )
        for i in range(opts.n)
    ]
    try:
        sub.start()
        for w in workers:
            w.start()
        stop.wait()
    except (NsqError, NsqConnectionError, NsqLookupError, ValueError) as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr)
        return 1
    finally:
        stop.set()
        for w in workers:
            if w.is_alive():
                w.join(opts.http_client_request_timeout + opts.http_client_connect_timeout)
        sub.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
