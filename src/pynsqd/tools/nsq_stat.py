"""``nsq_stat``: poll ``/stats`` of every nsqd that has a topic and print one channel's
aggregate numbers every ``--interval``, in Go's nsq_stat columns.

The first poll only takes a reference; each line after it shows the rates since the previous
poll (ingress: messages the channel received per second; egress: those that left its queue)
and the current depth and counters, summed over the nodes. The header repeats every 25 lines.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from ..client import (
    ClientOptions,
    NsqError,
    NsqLookupError,
    channel_stats,
    lookup_http_addresses,
)
from ..client.cluster import CHANNEL_COUNTERS
from ..internal.optiontable import many, opt
from .common import parse

PROGRAM = "nsq_stat"


FIELDS = (*CHANNEL_COUNTERS, "client_count")


@dataclass
class StatOptions:
    topic: str = opt("", "NSQ topic")
    channel: str = opt("", "NSQ channel")
    interval: float = opt(2.0, "duration of time between polling/printing output", kind="duration")
    count: int = opt(0, "number of reports")
    http_client_connect_timeout: float = opt(2.0, "timeout for HTTP connect", kind="duration")
    http_client_request_timeout: float = opt(5.0, "timeout for HTTP request", kind="duration")
    nsqd_http_addresses: list[str] = many("nsqd HTTP address", flag="nsqd-http-address")
    lookupd_http_addresses: list[str] = many("lookupd HTTP address", flag="lookupd-http-address")


def _nodes(opts: StatOptions) -> list[str]:
    """The HTTP addresses of the nsqd nodes with the topic (the given ones, or those the
    lookupds name). Raises NsqLookupError."""
    if opts.nsqd_http_addresses:
        return list(opts.nsqd_http_addresses)
    found = lookup_http_addresses(
        opts.lookupd_http_addresses, opts.topic, opts.http_client_request_timeout
    )
    return list(dict.fromkeys(found.values()))


def _channel_totals(opts: StatOptions) -> dict[str, int] | None:
    """The channel's numbers summed over the nodes; None when no node has it. Raises
    NsqLookupError, NsqError, ConnectionError or ValueError."""
    totals = dict.fromkeys(FIELDS, 0)
    found = False
    client = ClientOptions(timeout=opts.http_client_request_timeout)
    for node in _nodes(opts):
        c = channel_stats(node, opts.topic, opts.channel, client)
        if c is not None:
            found = True
            for k in FIELDS:
                totals[k] += int(c.get(k) or 0)
    return totals if found else None


def main(argv: list[str] | None = None) -> int:
    opts = parse(PROGRAM, StatOptions, argv)
    addresses = opts.nsqd_http_addresses + opts.lookupd_http_addresses
    problems = [
        (not opts.topic or not opts.channel, "--topic and --channel are required"),
        (opts.interval <= 0, "--interval should be positive"),
        (opts.count < 0, "--count should be positive"),
        (
            not opts.nsqd_http_addresses and not opts.lookupd_http_addresses,
            "--nsqd-http-address or --lookupd-http-address required",
        ),
        (
            bool(opts.nsqd_http_addresses) and bool(opts.lookupd_http_addresses),
            "use --nsqd-http-address or --lookupd-http-address not both",
        ),
        (
            any(a.startswith("http") for a in addresses),
            "address should not contain scheme",
        ),
    ]
    for bad, message in problems:
        if bad:
            print(f"{PROGRAM}: {message}", file=sys.stderr)
            return 1
    previous: dict[str, int] | None = None
    i = 0
    try:
        while not opts.count or i <= opts.count:
            try:
                c = _channel_totals(opts)
            except NsqLookupError as err:  # Go's words
                print(f"{PROGRAM}: failed to get topic producers - {err}", file=sys.stderr)
                return 1
            except (NsqError, ConnectionError, ValueError) as err:
                print(f"{PROGRAM}: failed to get nsqd stats - {err}", file=sys.stderr)
                return 1
            if c is None:
                print(
                    f"{PROGRAM}: failed to find channel({opts.channel}) in stats metadata for "
                    f"topic({opts.topic})",
                    file=sys.stderr,
                )
                return 1
            if i % 25 == 0:
                print(
                    "------rate------+----------------depth----------------+"
                    "--------------metadata---------------"
                )
                print(
                    f"{'ingress':>7} {'egress':>7} | {'total':>7} {'mem':>7} {'disk':>7} "
                    f"{'inflt':>5} {'def':>5} | {'req':>7} {'t-o':>7} {'msgs':>12} {'clients':>7}"
                )
            if previous is not None:
                received = c["message_count"] - previous["message_count"]
                left = received - (c["depth"] - previous["depth"])
                print(
                    f"{int(received / opts.interval):7d} {int(left / opts.interval):7d} | "
                    f"{c['depth']:7d} {c['depth'] - c['backend_depth']:7d} "
                    f"{c['backend_depth']:7d} {c['in_flight_count']:5d} "
                    f"{c['deferred_count']:5d} | {c['requeue_count']:7d} "
                    f"{c['timeout_count']:7d} {c['message_count']:12d} {c['client_count']:7d}",
                    flush=True,
                )
            previous = c
            i += 1
            if opts.count and i > opts.count:
                break
            time.sleep(opts.interval)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
