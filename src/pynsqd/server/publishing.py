"""A connection's PUB, MPUB and DPUB: the outcome of ``core/publish.decide`` carried out.

nsqd's ``protocol_v2.go`` PUB/MPUB/DPUB handlers, as a helper the connection holds (as it holds
``Upgrade`` and ``AuthSession``). The decision is ``core/publish.py``'s; this shell pauses the
connection while an outcome waits, so that later commands wait behind it and the answers stay
in order:

- ``Done``: OK (counted in the client's ``pub_counts``).
- ``WaitCommit``: ``Pause.COMMIT`` until its wait answers (the commit, the fsync): OK, or the
  failure.
- ``Forward``: ``Pause.FORWARD`` until the keeping worker answers (``server/workers/forward.py``).
- ``WaitWritable``: ``Pause.WRITABLE`` until ``PublishGate.when_writable``; decided again.
- ``Refused``: the error from ``core/publish.REFUSALS``; fatal, as nsqd's are.

``LinkPublishing`` is a worker link's (``--workers``; ``server/link.py``): a link carries many
clients' publishes, so it never stops. A refusal is not fatal (the client's worker closes the
client), and a publish waiting for its commit does not pause the link: its answer has a slot in
``in_order``, and the answers behind an empty slot wait for it, so the forwarding worker can
match them in order (``server/workers/forward.py``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from ..core import publish as decision
from ..protocol import encode, headers
from ..protocol.commands import Identity
from ..protocol.errors import ClientError, FatalClientError, ProtocolError
from ..protocol.frames import OK, OK_FRAME, encode_error, encode_response, ok_answer
from ..protocol.headers import HeaderLimits
from .client_v2 import Pause

if TYPE_CHECKING:
    from ..cluster.replicator import Replicator
    from ..core.topic import Topic


class Homes(Protocol):
    def home(self, producer: bytes) -> int | None:
        """The worker that makes ``producer``'s identified publishes, when another."""


class Forwarding(Protocol):
    def forward(self, peer: int, command: bytes, done: Callable[[bytes, bool], None]) -> None:
        """Send a publish command to worker ``peer`` (``server/workers/forward.py``)."""

    @property
    def placement(self) -> Homes: ...


class PublishHost(Protocol):
    """What a publish needs of nsqd."""

    replication: Replicator | None

    @property
    def workers(self) -> Forwarding: ...
    def get_topic(self, name: str) -> Topic: ...
    def set_health_error(self, err: BaseException | None) -> None: ...


class Publisher(Protocol):
    """What ``Publishing`` needs of its connection (``protocol_v2.ClientV2``)."""

    paused: Pause | None
    out: list[bytes]

    @property
    def nsqd(self) -> PublishHost: ...

    closed: bool
    #: Negotiated message headers (``protocol/headers.py``); None: not negotiated.
    headers: HeaderLimits | None

    def published(self, topic: str, n: int) -> None: ...
    def send_frame(self, frame: bytes) -> None: ...
    def answer_ok(self, frame: bytes = ...) -> None: ...
    def pause(self, why: Pause) -> None: ...
    def resume(self) -> None: ...
    def fatal(self, err: ProtocolError) -> None: ...
    def flush(self) -> None: ...


class Publishing:
    """The publishes of one client connection."""

    #: A publish that came over a worker link is made here, never forwarded again.
    forwarded = False

    def __init__(self, conn: Publisher) -> None:
        self.conn = conn

    def publish(
        self,
        cmd: str,
        topic_name: str,
        bodies: list[bytes],
        defer_ms: int = 0,
        identity: Identity | None = None,
    ) -> None:
        """PUB, MPUB, DPUB: decided, then carried out. Raises the refusal's ProtocolError."""
        conn = self.conn
        nsqd = conn.nsqd
        blocks = None
        sent = bodies  # as the client sent them (a publish decided again starts from these)
        if conn.headers is not None:  # negotiated: each body starts with its header block
            bodies, blocks = split_bodies(cmd, bodies, conn.headers)
        topic = nsqd.get_topic(topic_name)
        replication = nsqd.replication
        ident = None if identity is None else (identity.producer, identity.sequence)
        outcome = decision.decide(
            topic,
            bodies,
            defer_ms,
            ident,
            replication=replication,
            forwarded=self.forwarded,
            home=nsqd.workers.placement.home,
            headers=blocks,
        )
        if isinstance(outcome, decision.Done):
            conn.published(topic_name, outcome.written)
            conn.send_frame(ok_frame(outcome.duplicates))
        elif isinstance(outcome, decision.WaitCommit):
            conn.published(topic_name, outcome.written)
            self.wait_commit(cmd, outcome.wait, outcome.duplicates)
        elif isinstance(outcome, decision.Forward):
            self._forward(cmd, topic_name, outcome.worker, bodies, defer_ms, identity, blocks)
        elif isinstance(outcome, decision.WaitWritable):
            # The node is taking its partition back: the publish waits (later commands wait
            # behind it), then is decided again.
            assert replication is not None
            conn.pause(Pause.WRITABLE)
            replication.publishing.when_writable(
                topic_name,
                lambda why: self._writable(cmd, topic_name, sent, defer_ms, identity, why),
            )
        else:
            raise self.refused(cmd, outcome)

    def refused(self, cmd: str, refused: decision.Refused) -> ProtocolError:
        """The refusal's error (a failed disk also turns the node's health red)."""
        if refused.why is decision.Refusal.DISK and isinstance(refused.error, OSError):
            self.conn.nsqd.set_health_error(refused.error)
        return decision.tcp_error(cmd, refused)

    def wait_commit(self, cmd: str, wait: decision.Wait, duplicates: int = 0) -> None:
        """OK once the records are committed (on enough replicas, on disk): later commands
        wait behind it."""
        self.conn.pause(Pause.COMMIT)
        wait(lambda why: self._committed(cmd, why, duplicates))

    def _committed(self, cmd: str, why: str | None, duplicates: int) -> None:
        conn = self.conn
        if why is None:
            conn.answer_ok(ok_frame(duplicates))
        elif not conn.closed:
            conn.fatal(self.refused(cmd, decision.not_committed(why)))

    def _forward(
        self,
        cmd: str,
        topic_name: str,
        worker: int,
        bodies: list[bytes],
        defer_ms: int,
        identity: Identity | None,
        blocks: headers.Blocks,
    ) -> None:
        """--workers: a topic another worker keeps the log of: the publish is made there
        (``server/workers/forward.py``), and answered here with its answer; later commands wait
        behind it. A link carries each body with its header block (``workers/dial.py``)."""
        conn = self.conn
        workers = conn.nsqd.workers
        ident = None if identity is None else (identity.producer.decode(), identity.sequence)
        if blocks is None:
            bodies = [headers.join_body(b"", body) for body in bodies]
        elif not isinstance(blocks, headers.WireForm):  # (a WireForm's bodies are as sent)
            bodies = [headers.join_body(h, b) for h, b in zip(blocks, bodies, strict=True)]
        if cmd == "PUB":
            data = encode.pub(topic_name, bodies[0], ident)
        elif cmd == "DPUB":
            data = encode.dpub(topic_name, defer_ms, bodies[0], ident)
        else:
            data = encode.mpub(topic_name, bodies, ident)
        count = len(bodies)

        def done(answer: bytes, error: bool) -> None:
            if conn.closed:
                return
            if error:
                code, _, desc = answer.decode(errors="replace").partition(" ")
                conn.fatal(FatalClientError(code, desc))
                return
            conn.published(topic_name, count)
            # The keeper's OK as it came (it may count duplicates); the plain one is shared.
            conn.answer_ok(OK_FRAME if answer == OK else encode_response(answer))

        conn.pause(Pause.FORWARD)
        workers.forward(worker, data, done)

    def _writable(
        self,
        cmd: str,
        topic_name: str,
        bodies: list[bytes],
        defer_ms: int,
        identity: Identity | None,
        why: str | None,
    ) -> None:
        """A publish that waited for its partition (``Pause.WRITABLE``): decided again now (it
        may wait again, for its commit or the partition), or failed with the reason."""
        conn = self.conn
        if conn.closed:
            return
        try:
            if why is not None:
                raise self.refused(cmd, decision.not_committed(why))
            conn.paused = None
            self.publish(cmd, topic_name, bodies, defer_ms, identity)
        except ProtocolError as err:
            if err.fatal:
                conn.fatal(err)
                return
            conn.send_frame(encode_error(err.wire))  # a link goes on
            conn.paused = None
        if conn.paused is None:  # answered: the commands behind it go on
            conn.paused = Pause.WRITABLE
            conn.resume()


def split_bodies(
    cmd: str, bodies: list[bytes], limits: HeaderLimits
) -> tuple[list[bytes], headers.Blocks]:
    """A negotiated client's bodies as (bodies, blocks) (``headers.split_bodies``); raises
    ``E_BAD_MESSAGE`` naming the rule."""
    try:
        return headers.split_bodies(bodies, limits)
    except headers.HeaderError as err:
        raise FatalClientError("E_BAD_MESSAGE", f"{cmd} {err}") from None


def ok_frame(duplicates: int) -> bytes:
    """The OK of a publish: nsqd's, or (an identified publish) one that counts the records
    the log already held."""
    return OK_FRAME if duplicates <= 0 else encode_response(ok_answer(duplicates))


class LinkPublishing(Publishing):
    """The publishes another worker forwards over its link (this module's docstring)."""

    forwarded = True

    def __init__(self, conn: Publisher) -> None:
        super().__init__(conn)
        #: Answers while a publish waits for its commit: a slot each (None until known),
        #: written oldest first (``ClientV2.send_frame`` queues behind them).
        self.in_order: deque[list[bytes | None]] = deque()

    def refused(self, cmd: str, refused: decision.Refused) -> ProtocolError:
        err = super().refused(cmd, refused)
        return ClientError(err.code, err.desc)

    def wait_commit(self, cmd: str, wait: decision.Wait, duplicates: int = 0) -> None:
        slot: list[bytes | None] = [None]
        self.in_order.append(slot)

        def committed(why: str | None) -> None:
            frame = ok_frame(duplicates)
            if why is not None:
                frame = encode_error(self.refused(cmd, decision.not_committed(why)).wire)
            self._answer(slot, frame)

        wait(committed)

    def _answer(self, slot: list[bytes | None], frame: bytes) -> None:
        """A publish committed (or failed): its answer, then every known one behind it, are
        written."""
        conn = self.conn
        if conn.closed:
            return
        slot[0] = frame
        in_order = self.in_order
        while in_order and in_order[0][0] is not None:
            answer = in_order.popleft()[0]
            assert answer is not None
            conn.out.append(answer)
        conn.flush()
