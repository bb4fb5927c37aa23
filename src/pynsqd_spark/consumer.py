"""The driver-side consumer of the streaming source: connections, buffer, ledger, FIN and TOUCH.

One :class:`ConsumerPool` lives in Spark's driver-side source runner process for the whole query
run (Spark does not promise it). One reader thread (a :class:`Reactor`, selecting over every
connection) appends the messages received to per-connection buffers;
the engine's ``latestOffset`` moves buffered messages into a numbered batch of the *ledger*;
``commit`` FINs a batch's messages on the connections that received them (nsqd only accepts a FIN
from the owning connection). A maintenance thread TOUCHes every message not yet FIN'd, reconnects
lost connections with backoff and polls nsqlookupd for new nodes.

Nothing here imports pyspark: it is plain threads and sockets, tested on its own.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pynsqd.client import (
    Connection,
    NsqConnectionError,
    NsqError,
    NsqLookupError,
    Reactor,
    channel_depth,
    find_nodes,
    lookup_http_addresses,
    lookup_producers,
)

from .options import SourceOptions

log = logging.getLogger("pynsqd_spark.source")


#: A message's headers as the client gives them: (name, value) in order.
Pairs = list[tuple[str, bytes]]


class NsqSourceError(RuntimeError):
    """The source cannot start: no nsqd or nsqlookupd reachable (the message names the option)."""


class _ConnState:
    """One subscribed connection and what it received that no batch has taken yet."""

    __slots__ = ("alive", "att", "bodies", "conn", "hdrs", "ids", "node", "ts")

    def __init__(self, conn: Connection, node: str) -> None:
        self.conn = conn
        self.node = node
        self.alive = True
        self.ts: list[int] = []
        self.att: list[int] = []
        self.ids: list[bytes] = []
        self.bodies: list[bytes] = []
        #: Each message's headers (``includeHeaders``; empty otherwise).
        self.hdrs: list[Pairs] = []


@dataclass
class Part:
    """Messages of one batch that came over one connection."""

    state: _ConnState
    ts: list[int]
    att: list[int]
    ids: list[bytes]
    bodies: list[bytes]
    hdrs: list[Pairs] = field(default_factory=list)

    @property
    def node(self) -> str:
        return self.state.node


@dataclass
class PoolStats:
    received: int = 0
    finished: int = 0
    touched: int = 0
    #: FINs that could not be sent (connection gone): nsqd will redeliver those messages
    fin_lost: int = 0
    #: buffered messages dropped with their connection: nsqd redelivers them
    dropped: int = 0
    requeued: int = 0
    #: E_FIN_FAILED / E_TOUCH_FAILED / E_REQ_FAILED answers
    errors: dict[str, int] = field(default_factory=dict)
    reconnects: int = 0


class ConsumerPool:
    def __init__(self, opts: SourceOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.opts = opts
        self.clock = clock
        self.cond = threading.Condition()
        self.stats = PoolStats()
        self._states: dict[Connection, _ConnState] = {}
        #: node -> wanted number of connections (known after the first IDENTIFY)
        self._wanted: dict[str, int] = {}
        self._rdy: dict[str, int] = {}
        #: node -> (next attempt time, current backoff)
        self._retry: dict[str, tuple[float, float]] = {}
        self._ledger: dict[int, list[Part]] = {}
        self._stop = threading.Event()
        self._paused = False
        self._thread: threading.Thread | None = None
        #: reads every connection on one thread (not one reader thread per connection)
        self._reactor: Reactor | None = None
        self.last_receive = clock()
        #: only messages published at or before this time (ns) may be taken (Trigger.AvailableNow)
        self.cutoff_ns: int | None = None
        self.last_eligible_receive = self.last_receive
        #: the channel's depth on the nodes (backlog()), and when it was asked last
        self._backlog: int | None = None
        self._backlog_at = -math.inf

    # -- start / stop ---------------------------------------------------------------------

    def start(self) -> None:
        """Connect to every node; raise NsqSourceError if none can be reached at all."""
        errors: list[str] = []
        self._reactor = Reactor("nsq-source-reader")
        nodes, lookup_err = find_nodes(
            self.opts.nsqd_addresses,
            self.opts.lookupd_addresses,
            self.opts.topic,
            self.opts.client.connect_timeout,
        )
        if lookup_err is not None:
            if not self.opts.nsqd_addresses:
                raise NsqSourceError(
                    "option 'nsqlookupdHttpAddresses' "
                    f"({','.join(self.opts.lookupd_addresses)}): {lookup_err}"
                ) from lookup_err
            log.warning("nsqlookupd lookup failed: %s", lookup_err)
        connected = 0
        for node in nodes:
            try:
                self._connect_node(node)
                connected += 1
            except (NsqConnectionError, NsqError, OSError) as e:
                errors.append(str(e))
                self._schedule_retry(node)
        if self.opts.nsqd_addresses and not connected and not self.opts.lookupd_addresses:
            self.close()
            raise NsqSourceError(
                f"option 'nsqdTcpAddresses' ({','.join(self.opts.nsqd_addresses)}): no nsqd "
                f"reachable: {'; '.join(errors)}"
            )
        for err in errors:
            log.warning("nsq source: %s (will retry)", err)
        with self.cond:
            self.last_receive = self.last_eligible_receive = self.clock()
        self._thread = threading.Thread(target=self._maintain, name="nsq-maintain", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        with self.cond:
            states = list(self._states.values())
        for st in states:
            with contextlib.suppress(NsqConnectionError, OSError):
                st.conn.cls()
            st.conn.close()
        if self._reactor is not None:
            self._reactor.stop()

    def _subscribe(self, conn: Connection, node: str, rdy: int) -> None:
        st = _ConnState(conn, node)
        with self.cond:
            self._states[conn] = st
        try:
            conn.subscribe(
                self.opts.topic,
                self.opts.channel,
                self._on_messages,
                self._on_close,
                self._on_error,
                rdy=None if self._paused else rdy,
                reactor=self._reactor,
            )
        except BaseException:
            with self.cond:
                self._states.pop(conn, None)
            conn.close()
            raise

    def _connect_node(self, node: str) -> None:
        """Open the missing connections of a node (all of them the first time)."""
        have = self.node_connections(node)
        first: Connection | None = None
        if node not in self._wanted:
            # First connection: learn max_rdy_count, then size the pool of this node.
            first = Connection(node, self.opts.client).connect()
            max_rdy = max(1, first.max_rdy_count)
            want = self.opts.connections_per_node or math.ceil(self.opts.max_in_flight / max_rdy)
            self._wanted[node] = max(1, want)
            self._rdy[node] = max(1, min(max_rdy, math.ceil(self.opts.max_in_flight / want)))
        for _ in range(self._wanted[node] - have):
            conn = first or Connection(node, self.opts.client).connect()
            first = None
            self._subscribe(conn, node, self._rdy[node])
        self._retry.pop(node, None)

    def node_connections(self, node: str) -> int:
        with self.cond:
            return sum(1 for st in self._states.values() if st.node == node and st.alive)

    @property
    def nodes(self) -> list[str]:
        with self.cond:
            return sorted({st.node for st in self._states.values()})

    def _schedule_retry(self, node: str) -> None:
        _, backoff = self._retry.get(node, (0.0, 0.5))
        backoff = min(backoff * 2, self.opts.reconnect_backoff_max_ms / 1000)
        self._retry[node] = (self.clock() + backoff, backoff)

    # -- reader-thread callbacks ----------------------------------------------------------

    def _on_messages(
        self,
        conn: Connection,
        ts: list[int],
        att: list[int],
        ids: list[bytes],
        bodies: list[bytes],
        hdrs: list[Pairs] | None = None,
    ) -> None:
        with self.cond:
            st = self._states.get(conn)
            if st is None:
                return
            st.ts += ts
            st.att += att
            st.ids += ids
            st.bodies += bodies
            if hdrs is not None:
                st.hdrs += hdrs
            self.stats.received += len(ids)
            now = self.clock()
            self.last_receive = now
            cutoff = self.cutoff_ns
            if cutoff is None or min(ts) <= cutoff:
                self.last_eligible_receive = now
            self.cond.notify_all()

    def _on_close(self, conn: Connection) -> None:
        with self.cond:
            st = self._states.pop(conn, None)
            if st is None:
                return
            st.alive = False
            self.stats.dropped += len(st.ids)
            dropped = len(st.ids)
            st.ts, st.att, st.ids, st.bodies, st.hdrs = [], [], [], [], []
            if not self._stop.is_set() and st.node not in self._retry:
                self._schedule_retry(st.node)
        if not self._stop.is_set():
            log.warning(
                "nsq source: connection to %s lost (%s); %d buffered messages dropped (nsqd "
                "redelivers them); reconnecting",
                conn.address,
                conn.close_reason,
                dropped,
            )

    def _on_error(self, conn: Connection, err: NsqError) -> None:
        with self.cond:
            self.stats.errors[err.code] = self.stats.errors.get(err.code, 0) + 1
        if err.fatal:
            log.error("nsq source: %s", err)
        else:
            log.debug("nsq source: %s", err)

    # -- maintenance thread ---------------------------------------------------------------

    def _maintain(self) -> None:
        next_touch = self.clock() + self.opts.touch_interval_ms / 1000
        next_lookup = self.clock() + self.opts.lookupd_poll_interval_ms / 1000
        while not self._stop.wait(0.1):
            try:
                now = self.clock()
                if now >= next_touch:
                    self.touch_all()
                    next_touch = now + self.opts.touch_interval_ms / 1000
                if self.opts.lookupd_addresses and now >= next_lookup and not self._paused:
                    next_lookup = now + self.opts.lookupd_poll_interval_ms / 1000
                    self._poll_lookupd()
                if not self._paused:
                    self._reconnect_due()
            except Exception:  # never let the thread die: TOUCH and reconnects depend on it
                log.exception("nsq source: maintenance failed")

    def _poll_lookupd(self) -> None:
        try:
            found = lookup_producers(
                self.opts.lookupd_addresses, self.opts.topic, self.opts.client.connect_timeout
            )
        except NsqLookupError as e:
            log.warning("nsq source: %s", e)
            return
        for node in found:
            if node not in self._wanted and node not in self._retry:
                log.info("nsq source: new nsqd %s for topic %s", node, self.opts.topic)
                self._retry[node] = (0.0, 0.25)

    def _reconnect_due(self) -> None:
        now = self.clock()
        for node, (due, _) in list(self._retry.items()):
            if due > now or self._stop.is_set():
                continue
            try:
                self._connect_node(node)
                self.stats.reconnects += 1
                log.info("nsq source: connected to %s", node)
            except (NsqConnectionError, NsqError, OSError) as e:
                self._schedule_retry(node)
                log.warning("nsq source: reconnect to %s failed: %s", node, e)

    def touch_all(self) -> None:
        """TOUCH every message received and not FIN'd (buffered or waiting for its commit)."""
        with self.cond:
            by_conn: dict[_ConnState, list[bytes]] = {}
            for st in self._states.values():
                if st.ids:
                    by_conn[st] = list(st.ids)
            for parts in self._ledger.values():
                for p in parts:
                    if p.state.alive:
                        by_conn.setdefault(p.state, []).extend(p.ids)
        for st, ids in by_conn.items():
            try:
                st.conn.touch_many(ids)
                self.stats.touched += len(ids)
            except (NsqConnectionError, OSError):
                pass  # the reader thread reports the close

    # -- engine side ----------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        """The running counts, as the progress and the commit log report them."""
        st = self.stats
        return {
            "received": st.received,
            "finished": st.finished,
            "requeued": st.requeued,
            "redelivered": st.dropped + st.fin_lost,
            "reconnects": st.reconnects,
            "buffered": self.buffered(),
        }

    def buffered(self) -> int:
        with self.cond:
            return sum(len(st.ids) for st in self._states.values())

    def backlog(self) -> int | None:
        """What nsqd still holds for the channel (``depth``, summed over the nodes), asked at
        most once a second. Only with nsqlookupd, which knows each node's HTTP address; None
        without it or when no node answered."""
        if not self.opts.lookupd_addresses:
            return None
        now = self.clock()
        if now - self._backlog_at < 1.0:
            return self._backlog
        self._backlog_at = now
        timeout = self.opts.client.connect_timeout
        try:
            nodes = lookup_http_addresses(self.opts.lookupd_addresses, self.opts.topic, timeout)
        except NsqLookupError:
            nodes = {}
        depths = [
            d
            for http in nodes.values()
            if (d := channel_depth(http, self.opts.topic, self.opts.channel, timeout)) is not None
        ]
        self._backlog = sum(depths) if depths else None
        return self._backlog

    def take(self, seq: int, max_rows: int, max_bytes: int) -> int:
        """Move up to ``max_rows`` buffered messages (about ``max_bytes``) into ledger[seq].

        Takes a fair share from every connection; returns how many were taken.
        """
        with self.cond:
            cutoff = self.cutoff_ns
            avail: list[tuple[int, _ConnState]] = []
            for st in self._states.values():
                if not st.ids:
                    continue
                n = len(st.ids)
                if cutoff is not None and max(st.ts) > cutoff:
                    n = _eligible_first(st, cutoff)
                if n:
                    avail.append((n, st))
            if not avail:
                return 0
            avail.sort(key=lambda a: a[0])
            remaining = max_rows
            budget = max_bytes
            parts: list[Part] = []
            total = 0
            for i, (n, st) in enumerate(avail):
                if remaining <= 0 or budget <= 0:
                    break
                k = min(n, -(-remaining // (len(avail) - i)))
                size = sum(map(len, st.bodies[:k]))
                if size > budget:
                    # Trim to the byte budget (always keep one message so a batch moves).
                    k2, acc = 0, 0
                    for b in st.bodies[:k]:
                        if acc + len(b) > budget and (k2 or total):
                            break
                        acc += len(b)
                        k2 += 1
                    k, size = k2, acc
                    budget = 0
                else:
                    budget -= size
                if not k:
                    break
                parts.append(
                    Part(st, st.ts[:k], st.att[:k], st.ids[:k], st.bodies[:k], st.hdrs[:k])
                )
                del st.ts[:k], st.att[:k], st.ids[:k], st.bodies[:k], st.hdrs[:k]
                remaining -= k
                total += k
            if parts:
                self._ledger[seq] = parts
            return total

    def parts(self, seq: int) -> list[Part] | None:
        with self.cond:
            return self._ledger.get(seq)

    def drop_payload(self, seq: int) -> None:
        """Forget a batch's bodies once Spark has them (its partitions); keep the ids to FIN."""
        with self.cond:
            for p in self._ledger.get(seq, ()):
                p.ts, p.att, p.bodies, p.hdrs = [], [], [], []

    def has_uncommitted(self, up_to_seq: int) -> bool:
        """Some ledger batch ``<= up_to_seq`` (handed to Spark) still waits for its FIN."""
        with self.cond:
            return any(s <= up_to_seq for s in self._ledger)

    def pending_after(self, seq: int) -> int | None:
        """The highest ledger seq above ``seq`` (taken but not yet planned by Spark), if any."""
        with self.cond:
            later = [s for s in self._ledger if s > seq]
            return max(later) if later else None

    def commit(self, up_to_seq: int) -> int:
        """FIN every message of the ledger batches ``<= up_to_seq``; returns how many."""
        with self.cond:
            seqs = [s for s in self._ledger if s <= up_to_seq]
            by_conn: dict[_ConnState, list[bytes]] = {}
            for s in seqs:
                for p in self._ledger.pop(s):
                    by_conn.setdefault(p.state, []).extend(p.ids)
        done = 0
        for st, ids in by_conn.items():
            if not st.alive:
                self.stats.fin_lost += len(ids)
                continue
            try:
                st.conn.fin_many(ids)
                done += len(ids)
            except (NsqConnectionError, OSError):
                self.stats.fin_lost += len(ids)
        if by_conn and any(not st.alive for st in by_conn):
            log.warning(
                "nsq source: %d messages could not be FIN'd (connection lost); nsqd redelivers "
                "them",
                self.stats.fin_lost,
            )
        self.stats.finished += done
        return done

    def wait_for_messages(self, deadline: float) -> None:
        """Block until a reader delivers something or ``deadline`` (clock time) passes."""
        with self.cond:
            remaining = deadline - self.clock()
            if remaining > 0:
                self.cond.wait(remaining)

    def release_all(self) -> int:
        """Stop delivery (RDY 0) and hand every buffered message back to nsqd (REQ 0)."""
        self._paused = True
        with self.cond:
            held = {st: list(st.ids) for st in self._states.values()}
            for st in self._states.values():
                st.ts, st.att, st.ids, st.bodies, st.hdrs = [], [], [], [], []
        # Every connection to RDY 0 before any REQ: otherwise a sibling connection still ready
        # would be sent the requeued messages at once (and hold them until it closes).
        for st in held:
            with contextlib.suppress(NsqConnectionError, OSError):
                st.conn.rdy(0)
        n = 0
        for st, ids in held.items():
            try:
                st.conn.req_many(ids, 0)
                n += len(ids)
            except (NsqConnectionError, OSError):
                pass
        self.stats.requeued += n
        return n


def _eligible_first(st: _ConnState, cutoff: int) -> int:
    """Reorder a buffer so that messages published at or before ``cutoff`` come first."""
    ts = st.ts
    early = [i for i, t in enumerate(ts) if t <= cutoff]
    if len(early) == len(ts):
        return len(ts)
    late = [i for i, t in enumerate(ts) if t > cutoff]
    order = early + late
    st.ts = [ts[i] for i in order]
    st.att = [st.att[i] for i in order]
    st.ids = [st.ids[i] for i in order]
    st.bodies = [st.bodies[i] for i in order]
    if st.hdrs:
        st.hdrs = [st.hdrs[i] for i in order]
    return len(early)
