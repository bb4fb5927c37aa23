"""``nsq_to_file``: write a topic's messages to files, one per line, as Go's nsq_to_file does.

Each ``--topic`` is consumed on channel ``--channel`` from every ``--nsqd-tcp-address`` (or every
node ``--lookupd-http-address`` lists) and appended to ``--output-dir``/``--filename-format``
(``<TOPIC>``, ``<HOST>``, ``<REV>``, ``<DATETIME>``, ``<PID>``). A file is written in
``--work-dir`` and moved to the output directory when it is closed: at rotation (the
``--datetime-format`` text changes, ``--rotate-size`` bytes, ``--rotate-interval``) and at exit.
``--gzip`` compresses. Without ``--topic``, every topic nsqlookupd knows that matches
``--topic-pattern`` (a regular expression, searched) is consumed, asked again every
``--topic-refresh``. Messages are FIN'd only after their bytes are fsynced (every
``--sync-interval`` and at each rotation), so a crash redelivers rather than loses them.
"""

from __future__ import annotations

import gzip
import os
import re
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from queue import Empty
from typing import BinaryIO

from ..client import Connection, NsqConnectionError, NsqError, NsqLookupError, lookup_topics
from ..internal.optiontable import many, opt
from .common import ToolLog, header_line, parse
from .consumer import ConsumerOptions, Subscription, subscriptions

PROGRAM = "nsq_to_file"


@dataclass
class ToFileOptions(ConsumerOptions):
    topics: list[str] = many("nsq topic", flag="topic")
    channel: str = opt("nsq_to_file", "nsq channel")
    output_dir: str = opt("/tmp", "directory to write output files to")
    work_dir: str = opt("", "directory for in-progress files before moving to output-dir")
    datetime_format: str = opt(
        "%Y-%m-%d_%H", "strftime compatible format for <DATETIME> in filename format"
    )
    filename_format: str = opt(
        "<TOPIC>.<HOST><REV>.<DATETIME>.log",
        "output filename format (<TOPIC>, <HOST>, <PID>, <DATETIME>, <REV> are replaced. <REV> is increased when file already exists)",
    )
    host_identifier: str = opt(
        "",
        "value to output in log filename in place of hostname. <SHORT_HOST> and <HOSTNAME> are valid replacement tokens",
    )
    gzip: bool = opt(False, "gzip output files.")
    gzip_level: int = opt(6, "gzip compression level (1-9, 1=BestSpeed, 9=BestCompression)")
    skip_empty_files: bool = opt(False, "skip writing empty files")
    rotate_size: int = opt(0, "rotate the file when it grows bigger than `rotate-size` bytes")
    rotate_interval: float = opt(0.0, "rotate the file every duration", kind="duration")
    sync_interval: float = opt(30.0, "sync file to disk every duration", kind="duration")
    topic_pattern: str = opt("", "only log topics matching the following pattern")
    topic_refresh: float = opt(
        60.0, "how frequently the topic list should be refreshed", kind="duration"
    )
    log_level: str = opt("info", "set log verbosity: debug, info, warn, error, or fatal")
    log_prefix: str = opt("nsq_to_file: ", "log message prefix")
    http_client_connect_timeout: float = opt(2.0, "timeout for HTTP connect", kind="duration")
    http_client_request_timeout: float = opt(5.0, "timeout for HTTP request", kind="duration")


class TopicFile:
    """The current output file of one topic, rotated and synced as the options say."""

    def __init__(self, opts: ToFileOptions, topic: str) -> None:
        self.opts, self.topic = opts, topic
        self.work_dir = opts.work_dir or opts.output_dir
        self.out: gzip.GzipFile | BinaryIO | None = None
        self.raw: BinaryIO | None = None
        self.path = ""
        self.name = ""
        self.datetime = ""
        self.opened_at = 0.0
        self.size = 0

    def _filename(self, rev: int) -> str:
        host = self.opts.host_identifier or socket.gethostname()
        host = host.replace("<SHORT_HOST>", socket.gethostname().split(".")[0])
        host = host.replace("<HOSTNAME>", socket.gethostname())
        name = (
            self.opts.filename_format.replace("<TOPIC>", self.topic)
            .replace("<HOST>", host)
            .replace("<PID>", str(os.getpid()))
            .replace("<DATETIME>", self.datetime)
            # As Go's: none when the file is appended to, else -000000 on, past existing files.
            .replace("<REV>", "" if rev < 0 else f"-{rev:06d}")
        )
        return name + (".gz" if self.opts.gzip else "")

    @property
    def _appends(self) -> bool:
        """Go's nsq_to_file appends to an existing file (same name: no revision) unless it
        gzips (a gzip stream is not appended to) or moves files from a work directory."""
        return not self.opts.gzip and self.work_dir == self.opts.output_dir

    def _open(self) -> None:
        previous = self.datetime
        self.datetime = time.strftime(self.opts.datetime_format)
        # Appending: to the file of this hour (say); a rotation within it (by size or
        # interval) starts the next revision.
        rev = 0 if not self._appends else (1 if self.datetime == previous else -1)
        while rev >= 0:
            name = self._filename(rev)
            taken = os.path.exists(os.path.join(self.opts.output_dir, name)) or os.path.exists(
                os.path.join(self.work_dir, name)
            )
            if not taken:
                break
            rev += 1
        name = self._filename(rev)
        self.name = name
        self.path = os.path.join(self.work_dir, name)
        self.raw = open(self.path, "ab" if rev < 0 else "xb")  # noqa: SIM115 - closed at rotation
        self.out = (
            gzip.GzipFile(fileobj=self.raw, mode="wb", compresslevel=self.opts.gzip_level)
            if self.opts.gzip
            else self.raw
        )
        self.opened_at = time.monotonic()
        self.size = 0

    def write(self, body: bytes) -> None:
        if self.out is None or self._due():
            self.close()
            self._open()
        assert self.out is not None
        self.out.write(body + b"\n")
        self.size += len(body) + 1

    def _due(self) -> bool:
        o = self.opts
        return (
            (o.rotate_size > 0 and self.size >= o.rotate_size)
            or (o.rotate_interval > 0 and time.monotonic() - self.opened_at >= o.rotate_interval)
            or time.strftime(o.datetime_format) != self.datetime
        )

    def sync(self) -> None:
        if self.out is not None and self.raw is not None:
            self.out.flush()
            self.raw.flush()
            os.fsync(self.raw.fileno())

    def close(self) -> None:
        if self.out is None or self.raw is None:
            return
        empty = self.size == 0
        if self.out is not self.raw:
            self.out.close()  # writes the gzip trailer
        self.raw.flush()
        os.fsync(self.raw.fileno())
        self.raw.close()
        self.out = self.raw = None
        if empty and self.opts.skip_empty_files and os.path.getsize(self.path) == 0:
            os.unlink(self.path)  # (appended to: only if the earlier runs left nothing either)
            return
        if self.work_dir != self.opts.output_dir:
            os.replace(self.path, os.path.join(self.opts.output_dir, self.name))


def _consume(opts: ToFileOptions, sub: Subscription, stop: threading.Event) -> None:
    """One topic: messages from every node into its file; FIN after each sync (a message
    whose connection closed before is delivered again: at-least-once, as Go's)."""
    out = TopicFile(opts, sub.topic)
    pending: list[tuple[Connection, bytes]] = []
    next_sync = time.monotonic() + opts.sync_interval
    batch = max(1, opts.max_in_flight // max(1, len(sub.nsqd_addresses) or 1))
    with_headers = opts.message_headers

    def sync_and_finish() -> None:
        out.sync()
        for conn, msg_id in pending:
            sub.finish(conn, msg_id)
        pending.clear()

    try:
        while not stop.is_set():
            try:
                conn, msg_id, body, hdrs = sub.incoming.get(timeout=0.2)
            except Empty:
                conn = None
            if conn is not None:
                before = out.name
                # --message-headers: the headers' JSON, a tab, the body.
                out.write(header_line(hdrs) + b"\t" + body if with_headers else body)
                if out.name != before and pending:  # rotated: the old file is synced and closed
                    for c, i in pending:
                        sub.finish(c, i)
                    pending.clear()
                pending.append((conn, msg_id))
            # Sync when due, when RDY may be about used up (nothing more would come), or when
            # the queue is drained.
            due = time.monotonic() >= next_sync or len(pending) >= batch
            if pending and (due or sub.incoming.empty()):
                sync_and_finish()
                next_sync = time.monotonic() + opts.sync_interval
        sync_and_finish()
    finally:
        out.close()
        sub.stop()


def main(argv: list[str] | None = None) -> int:
    opts = parse(PROGRAM, ToFileOptions, argv)
    try:
        log = ToolLog(PROGRAM, opts.log_prefix, opts.log_level)
        pattern = re.compile(opts.topic_pattern)
    except re.error as err:
        print(f"{PROGRAM}: --topic-pattern: {err}", file=sys.stderr)
        return 1
    except ValueError as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr)
        return 1
    if not opts.topics and not opts.topic_pattern:
        print(f"{PROGRAM}: --topic or --topic-pattern required", file=sys.stderr)
        return 1
    if not opts.topics and not opts.lookupd_http_addresses:
        print(
            f"{PROGRAM}: --lookupd-http-address must be specified when no --topic specified",
            file=sys.stderr,
        )
        return 1
    lookup_timeout = opts.http_client_connect_timeout + opts.http_client_request_timeout

    def subscribe(topics: list[str]) -> list[Subscription]:
        allowed = [t for t in topics if pattern.search(t)]
        return subscriptions(
            PROGRAM,
            opts,
            allowed,
            opts.channel,
            lookup_timeout=lookup_timeout,
            log=log,
            topics_found_later=True,
        )

    subs = subscribe(opts.topics)
    if not 1 <= opts.gzip_level <= 9:
        print(f"{PROGRAM}: invalid --gzip-level", file=sys.stderr)
        return 1
    for d in {opts.output_dir, opts.work_dir or opts.output_dir}:
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as err:
            print(f"{PROGRAM}: cannot create {d} - {err.strerror}", file=sys.stderr)
            return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    workers: list[threading.Thread] = []
    running: set[str] = set()

    def start(new: list[Subscription]) -> None:
        for sub in new:
            sub.start()
            t = threading.Thread(target=_consume, args=(opts, sub, stop))
            t.start()
            workers.append(t)
            running.add(sub.topic)

    try:
        start(subs)
        if not opts.topics:
            # --topic-pattern: the topics nsqlookupd knows, again every --topic-refresh (Go's
            # topic discoverer); a topic that matches is consumed from then on.
            while True:
                try:
                    known = lookup_topics(opts.lookupd_http_addresses, lookup_timeout)
                except NsqLookupError as err:
                    log.say(f"{err}; asking again in {opts.topic_refresh:g}s", "error")
                else:
                    new = [t for t in known if t not in running and pattern.search(t)]
                    for topic in new:
                        log.say(f"consuming topic {topic} (it matches --topic-pattern)")
                    start(subscribe(new))
                if stop.wait(opts.topic_refresh):
                    break
    except (NsqError, NsqConnectionError, NsqLookupError, ValueError) as err:
        print(f"{PROGRAM}: {err}", file=sys.stderr)
        stop.set()
        for sub in subs:
            sub.stop()
        return 1
    finally:
        while any(t.is_alive() for t in workers):
            for t in workers:
                t.join(0.2)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
