"""``nsq_log``: print a retained topic's log (pynsqd only; Go's NSQ has no log to read).

It reads ``GET /topic/log`` of one node (``--nsqd-http-address``) from ``--offset`` (a number,
``earliest`` or ``latest``) or ``--since`` (unix ms: the first record published then or after),
checks every record's CRC (``pynsqd.client.read_log``), and prints each as a line (the body) or
as JSON (``--format=json``: offset, timestamp in ns, id, attempts, and the body as text, or as
``body_base64`` when it is not UTF-8; a message's headers as ``headers``, each a name and its
``value`` or ``value_base64``). ``--follow`` keeps reading as records are appended, like
``tail -f``; ``--n`` stops after that many. ``--partition`` reads a replicated topic's copy of
another node's partition, or one worker's partition of a node of several (``--workers``: each
worker keeps its own log, with offsets of its own); without it such a node's partitions are
read in turn (``partition`` in each JSON line). ``--auth-secret`` and the TLS flags reach a
guarded node.
"""

from __future__ import annotations

import base64
import json
import sys
import time
from dataclasses import dataclass
from typing import Any

from ..client import (
    ClientOptions,
    LogOffsetOutOfRange,
    LogRecord,
    NodeHTTPError,
    NsqError,
    read_log,
    topic_offsets,
)
from ..internal.optiontable import opt
from ..protocol.headers import decode
from ..protocol.log_record import Follow, follow_after
from .common import parse

PROGRAM = "nsq_log"
#: How often ``--follow`` asks again at the end of the log.
FOLLOW_POLL = 0.2


@dataclass
class LogOptions:
    nsqd_http_address: str = opt("", "nsqd HTTP address (its --https-address with --tls)")
    topic: str = opt("", "NSQ topic (with retention)")
    offset: str = opt("earliest", "where to start: an offset, earliest or latest")
    since: int = opt(0, "start at the first record published at or after this unix time (ms)")
    partition: int = opt(-1, "a replicated topic: this node's copy of that node's partition")
    format: str = opt(
        "lines",
        "lines (each body) or json (offset, timestamp, id, attempts, body; producer and "
        "sequence of an idempotent publish)",
    )
    follow: bool = opt(False, "keep reading as records are appended (like tail -f)")
    n: int = opt(0, "stop after this many records (0: all)")
    auth_secret: str = opt("", "the auth secret, when nsqd has --auth-http-address")
    tls: bool = opt(False, "HTTPS (give the node's --https-address)")
    tls_root_ca_file: str = opt("", "CA file to verify the node's certificate")


def _starts(
    opts: LogOptions, doc: dict[str, Any], partition: int | None
) -> dict[int | None, int] | None:
    """Where to start in each partition to read: the one asked for (None: the node's own log);
    on a node of several workers, every worker's partition (``/topic/offsets`` lists them, and
    names no other node), each from its own earliest, latest or ``--since`` offset; None when
    an ``--offset`` number is given there without ``--partition`` (it names no partition)."""
    parts = doc.get("partitions")
    # The field of the answer that says where to start (None: --offset is a number).
    named = (
        "offset" if opts.since else opts.offset if opts.offset in ("earliest", "latest") else None
    )
    if partition is not None or not parts or doc.get("nodes"):
        return {partition: int(doc[named]) if named else int(opts.offset)}
    if named is None:
        return None
    return {int(p["partition"]): int(p[named]) for p in parts}


def as_json(r: LogRecord, partition: int | None = None) -> str:
    doc: dict[str, object] = {
        "offset": r.offset,
        "timestamp": r.timestamp,
        "id": r.id.decode("ascii", "replace"),
        "attempts": r.attempts,
    }
    if partition is not None:  # a node of several workers: whose offset it is
        doc["partition"] = partition
    if r.sequence >= 0:  # an idempotent publish's identity (docs/exactly-once.md)
        doc["producer"] = r.producer.decode("ascii", "replace")
        doc["sequence"] = r.sequence
    if r.headers:  # pynsqd's message headers (docs/headers.md)
        doc["headers"] = [_text_or_base64({"name": n}, "value", v) for n, v in decode(r.headers)]
    _text_or_base64(doc, "body", r.body)
    return json.dumps(doc, ensure_ascii=False)


def _text_or_base64(doc: dict[str, object], key: str, data: bytes) -> dict[str, object]:
    """``doc[key]``: ``data`` as text when it is UTF-8, else ``doc[key + "_base64"]``."""
    try:
        doc[key] = data.decode("utf-8")
    except UnicodeDecodeError:
        doc[key + "_base64"] = base64.b64encode(data).decode("ascii")
    return doc


def main(argv: list[str] | None = None) -> int:
    opts = parse(PROGRAM, LogOptions, argv)
    if not opts.topic or not opts.nsqd_http_address:
        print(f"{PROGRAM}: --topic and --nsqd-http-address are required", file=sys.stderr)
        return 1
    if opts.format not in ("lines", "json"):
        print(f"{PROGRAM}: --format must be lines or json, got {opts.format!r}", file=sys.stderr)
        return 1
    client = ClientOptions(
        tls=opts.tls,
        tls_ca_file=opts.tls_root_ca_file or None,
        auth_secret=opts.auth_secret or None,
        user_agent=f"{PROGRAM}/pynsqd",
    )
    node, partition = opts.nsqd_http_address, opts.partition if opts.partition >= 0 else None
    out = sys.stdout
    shown = 0
    try:
        doc = topic_offsets(node, opts.topic, client, opts.since or None, partition=partition)
        starts = _starts(opts, doc, partition)
        if starts is None:
            print(
                f"{PROGRAM}: topic {opts.topic} on {node} is one partition per worker "
                f"({', '.join(str(p['partition']) for p in doc['partitions'])}), each with "
                "offsets of its own: give --partition with --offset N",
                file=sys.stderr,
            )
            return 1
        several = len(starts) > 1
        afters: dict[int | None, Follow | None] = dict.fromkeys(starts)  # MPUB runs
        while not opts.n or shown < opts.n:
            moved = False
            for part, offset in list(starts.items()):
                try:
                    chunk = read_log(
                        node, opts.topic, offset, client, partition=part, follow=afters[part]
                    )
                except LogOffsetOutOfRange as err:
                    if offset >= err.earliest:
                        raise
                    print(
                        f"{PROGRAM}: offsets {offset}-{err.earliest - 1}"
                        f"{f' of partition {part}' if several else ''} were removed by "
                        f"retention; going on from {err.earliest}",
                        file=sys.stderr,
                    )
                    starts[part], afters[part], moved = err.earliest, None, True
                    continue
                if chunk.records:
                    afters[part] = follow_after(chunk.records[-1])
                for r in chunk.records:
                    line = (
                        as_json(r, part if several else None)
                        if opts.format == "json"
                        else r.body.decode(errors="replace")
                    )
                    out.write(line + "\n")
                    shown += 1
                    if opts.n and shown >= opts.n:
                        break
                out.flush()
                if opts.n and shown >= opts.n:
                    break
                if chunk.next > offset:
                    starts[part], moved = chunk.next, True
            if not moved:
                if not opts.follow:
                    break
                time.sleep(FOLLOW_POLL)
    except NodeHTTPError as err:
        if "TOPIC_NOT_RETAINED" in err.text:
            print(
                f"{PROGRAM}: topic {opts.topic} keeps no log on {node} (TOPIC_NOT_RETAINED): "
                "give it retention (nsqd --retention-time or --retention-bytes, or POST "
                "/topic/retention) and read what is published from then on",
                file=sys.stderr,
            )
        else:
            print(f"{PROGRAM}: {err}", file=sys.stderr)
        return 1
    except (NsqError, ConnectionError, ValueError, KeyError) as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr)
        return 1
    except (KeyboardInterrupt, BrokenPipeError):
        pass
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
