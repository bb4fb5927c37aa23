"""The publish decision: every PUB, MPUB, DPUB, HTTP ``/pub`` and ``/mpub`` and a worker link's
publish is decided here, once, into an outcome the shells carry out.

Theory of operation. ``decide`` takes a topic, the bodies and what the publish asked for (a
deferral, a producer identity) and answers with one ``Outcome``, doing no I/O of its own: its
only effects are the topic's own (the append, the hand-off to channels) and the gate's read of
the cluster's state. The outcomes, in the order they are decided:

- ``Refused(EXITING)``: the topic is closing; ``Refused(IDENTITY)`` an identified publish whose
  last number would pass ``MAX_SEQUENCE`` (nothing of it is written).
- ``Forward(worker)``: ``--workers``: another worker keeps the topic (a bounded topic, or a
  retained one on a replicated node), or, for an identified publish to a retained topic, is
  its producer's home (``home``: ``Placement.home``); the publish is made there
  (``server/workers/forward.py`` for TCP, ``AdminLinks.proxy`` for HTTP) and answered with
  its answer. A publish that came over a link is never forwarded again.
- ``WaitWritable``: a replicated node taking its partition back; the shell waits for
  ``when_writable`` and decides again (the whole decision: the topic may have moved meanwhile).
- ``Refused(...)``: the gate, the dedup index, a bound or the disk refused it; nothing of it is
  stored, except where the refusal says otherwise (a failed hand-off to a channel: the records are
  in the log).
- ``WaitCommit(end, wait)``: the records are in the log and the OK waits (``wait(done)``) for
  them to commit (a replicated topic: ``Replicator.wait``), for an fsync that covers them
  (``--sync-every=1``: the group commit, ``storage/group_sync.py``), or for both in turn.
- ``Done(end)``: stored (and committed where that is asked); ``end`` is the log's offset past
  the publish (-1: the topic keeps no log).

``REFUSALS`` is the one table from a refusal to its answers: nsqd's ``E_*`` error for TCP (the
command's name filled in) and the HTTP status and text. The shells (``server/protocol_v2.py``,
``http/api.py``) hold no ``except`` of their own for a publish.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from ..protocol.errors import FatalClientError
from ..protocol.headers import Blocks
from .dedup import MAX_SEQUENCE, DedupError
from .errors import NotRetained, NotYetWritable, PublishRefused, QueueFull

if TYPE_CHECKING:
    from .topic import Topic

__all__ = [
    "REFUSALS",
    "Done",
    "Forward",
    "Outcome",
    "Refusal",
    "Refused",
    "Replication",
    "WaitCommit",
    "WaitWritable",
    "decide",
]


class Refusal(enum.Enum):
    """Why a publish was not taken (the row of ``REFUSALS``)."""

    EXITING = "exiting"
    #: The dedup index refused the identity (a bad sequence, a conflict, a copy not settled).
    IDENTITY = "identity"
    NOT_RETAINED = "not retained"
    #: A bounded queue with policy ``reject`` has no room.
    QUEUE_FULL = "queue full"
    #: The replication gate: this node cannot take it (not joined, the partition elsewhere).
    NOT_HERE = "not here"
    #: The disk refused the write (the node's health goes red).
    DISK = "disk"
    #: A wait (for the partition, or for the commit) ended without it.
    NOT_COMMITTED = "not committed"


@dataclass(frozen=True, slots=True)
class Done:
    #: The log's offset past the publish; -1 for a topic that keeps no log.
    end: int = -1
    #: How many of the bodies were duplicates of what the log holds (an identified publish).
    duplicates: int = 0
    #: How many messages this publish wrote.
    written: int = 0


#: A wait the shell starts: ``wait(done)``, then ``done(None)`` (OK) or ``done(reason)``.
Wait = Callable[[Callable[[str | None], None]], None]


@dataclass(frozen=True, slots=True)
class WaitCommit:
    end: int
    #: What the OK waits for (this module's docstring).
    wait: Wait
    duplicates: int = 0
    written: int = 0


@dataclass(frozen=True, slots=True)
class Forward:
    #: The worker that keeps the topic's log.
    worker: int


@dataclass(frozen=True, slots=True)
class WaitWritable:
    pass


@dataclass(frozen=True, slots=True)
class Refused:
    why: Refusal
    #: What is said of it (the exception's text, or the wait's reason).
    reason: str
    #: The refusing error's own code where it has one (``E_CONFLICT``, ``NOT_JOINED``).
    code: str = ""
    #: More for the HTTP answer's JSON (a full queue's depth and bound).
    extra: dict[str, Any] = field(default_factory=dict)
    #: The exception behind it (the shell logs a disk's, and marks the node unhealthy).
    error: BaseException | None = None


Outcome = Done | WaitCommit | Forward | WaitWritable | Refused


class Gate(Protocol):
    def gate(self, topic: str) -> bool: ...


class Replication(Protocol):
    """What a publish needs of a replicated node (``cluster/replicator.Replicator``)."""

    @property
    def publishing(self) -> Gate: ...
    def committed(self, topic: str, end: int) -> bool: ...
    def wait(self, topic: str, end: int, done: Callable[[str | None], None]) -> None: ...


def _in_turn(first: Wait, second: Wait) -> Wait:
    """``first``, then ``second``: OK once both are; the first failure's reason."""

    def wait(done: Callable[[str | None], None]) -> None:
        first(lambda why: done(why) if why is not None else second(done))

    return wait


def decide(
    topic: Topic,
    bodies: list[bytes],
    defer_ms: int = 0,
    identity: tuple[bytes, int] | None = None,
    *,
    replication: Replication | None = None,
    forwarded: bool = False,
    home: Callable[[bytes], int | None] | None = None,
    headers: Blocks = None,
) -> Outcome:
    """The one publish decision (this module's docstring). ``identity``: an idempotent
    publish's producer and first sequence number; ``forwarded``: it came over a worker link;
    ``home``: the worker that makes a producer's publishes, when another (``--workers``);
    ``headers``: each message's header block, or a ``WireForm`` (``bodies`` as a negotiated
    client sent them; ``protocol/headers.py``), None: none has any."""
    if topic.exiting:
        return Refused(Refusal.EXITING, "exiting")
    if not forwarded:
        if topic.kept_by is not None:
            return Forward(topic.kept_by)
        if identity is not None and home is not None and topic.log is not None:
            worker = home(identity[0])
            if worker is not None:
                return Forward(worker)
    if not bodies:
        return Done()
    if identity is not None and identity[1] + len(bodies) - 1 > MAX_SEQUENCE:
        producer, first = identity
        return Refused(
            Refusal.IDENTITY,
            f"producer {producer.decode()} sequences {first}-{first + len(bodies) - 1} pass "
            f"the last sequence number, {MAX_SEQUENCE}",
            "E_BAD_SEQUENCE",
        )
    waits = False
    dups = 0
    try:
        if replication is not None:
            waits = replication.publishing.gate(topic.name)
        if identity is None:
            end = topic.put_bodies(bodies, defer_ms, headers)
        else:
            dups, end = topic.put_identified(bodies, defer_ms, *identity, headers=headers)
    except NotYetWritable:
        return WaitWritable()
    except DedupError as err:
        return Refused(Refusal.IDENTITY, str(err), err.code, error=err)
    except NotRetained as err:
        return Refused(Refusal.NOT_RETAINED, str(err), error=err)
    except QueueFull as err:
        extra = {"queue": err.where, "depth": err.depth, "max_depth": err.limit}
        return Refused(Refusal.QUEUE_FULL, str(err), extra=extra, error=err)
    except PublishRefused as err:
        return Refused(Refusal.NOT_HERE, str(err), err.code, error=err)
    except OSError as err:
        return Refused(Refusal.DISK, str(err), error=err)
    written = len(bodies) - dups
    wait: Wait | None = None
    if waits and replication is not None and end > 0 and not replication.committed(topic.name, end):
        wait = partial(replication.wait, topic.name, end)
    synced = topic.log.sync_wait(end) if topic.log is not None else None
    if synced is not None:  # --sync-every=1: the group commit
        wait = synced if wait is None else _in_turn(wait, synced)
    if wait is not None:
        return WaitCommit(end, wait, dups, written)
    return Done(end, dups, written)


# -- the answers --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Answers:
    """A refusal's answers: TCP's error code (``{cmd}`` is the command: ``E_PUB_FAILED``) and
    HTTP's status and text (``{code}``: the refusing error's own code)."""

    tcp: str
    status: int
    text: str


#: The one table from a refusal to its TCP and HTTP answers.
REFUSALS: dict[Refusal, Answers] = {
    Refusal.EXITING: Answers("E_{cmd}_FAILED", 503, "EXITING"),
    Refusal.NOT_RETAINED: Answers("E_NOT_RETAINED", 400, "NOT_RETAINED"),
    Refusal.QUEUE_FULL: Answers("E_{cmd}_FAILED", 503, "QUEUE_FULL"),
    Refusal.NOT_HERE: Answers("E_{cmd}_FAILED", 503, "{code}"),
    # nsqd answers a failed disk write on HTTP with 503 EXITING (its ``http.go``).
    Refusal.DISK: Answers("E_{cmd}_FAILED", 503, "EXITING"),
    Refusal.NOT_COMMITTED: Answers("E_{cmd}_FAILED", 503, "PUB_FAILED"),
}

#: The dedup index's codes: E_PUB_FAILED (try again) takes the command's name on TCP.
_IDENTITY_STATUS = {"E_CONFLICT": 409, "E_PUB_FAILED": 503}


def answers(refused: Refused) -> Answers:
    """The refusal's row, its dedup code filled in (an identity refusal's code is its own)."""
    if refused.why is Refusal.IDENTITY:
        code = refused.code
        tcp = "E_{cmd}_FAILED" if code == "E_PUB_FAILED" else code
        return Answers(tcp, _IDENTITY_STATUS.get(code, 400), code.removeprefix("E_"))
    return REFUSALS[refused.why]


def tcp_error(cmd: str, refused: Refused) -> FatalClientError:
    """The refusal as nsqd's V2 error: ``E_<CMD>_FAILED <CMD> failed <reason>`` and kin."""
    code = answers(refused).tcp.format(cmd=cmd)
    return FatalClientError(code, f"{cmd} failed {refused.reason}")


def http_error(refused: Refused) -> tuple[int, str, dict[str, Any] | None]:
    """The refusal as the HTTP API answers it: status, text and the JSON beside it."""
    row = answers(refused)
    text = row.text.format(code=refused.code)
    if refused.why in (Refusal.EXITING, Refusal.DISK):
        return row.status, text, None
    if refused.why is Refusal.QUEUE_FULL:
        return row.status, text, dict(refused.extra)
    return row.status, text, {"reason": refused.reason}


def not_committed(reason: str) -> Refused:
    """A wait (for the partition to be writable, or for the commit) that ended without it."""
    return Refused(Refusal.NOT_COMMITTED, reason)
