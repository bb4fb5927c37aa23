"""An idempotent publish's duplicates, judged over every log it may be in (``core/dedup.py``
keeps one log's index; this reads the logs a node holds).

A retry names records the log already holds: they must be the same messages (``same_bodies``:
read back, a retry's cost, never a new publish's). On a replicated topic a producer whose node
died publishes again on another node, so its numbers may be in another node's partition whose
copy this node holds (``check_everywhere``).
"""

from __future__ import annotations

from .backend import MessageLog
from .dedup import DedupError, Verdict, gap_error


def same_bodies(
    log: MessageLog, producer: bytes, first: int, bodies: list[bytes], verdict: Verdict
) -> None:
    """A duplicate must be the message it repeats: the records it names are read back
    (a retry's cost, never a new publish's). Raises DedupError (E_CONFLICT)."""
    if not verdict.offsets:
        return
    held = log.bodies_at(list(verdict.offsets))
    start = verdict.duplicates - len(verdict.offsets)
    for i, old in enumerate(held):
        if old is not None and old != bodies[start + i]:
            raise DedupError(
                "E_CONFLICT",
                f"producer {producer.decode()} sequence {first + start + i} was published "
                "with a different body",
            )


def check_everywhere(
    log: MessageLog,
    others: list[tuple[MessageLog, bool]],
    producer: bytes,
    first: int,
    bodies: list[bytes],
    now: int,
) -> Verdict:
    """A replicated topic: a producer whose node died publishes again here, so its
    numbers may be in another node's partition. The copies held here answer for it: a
    duplicate there counts when committed there; one not committed yet, or a copy not
    settled (a takeover under way, or behind its leader), is ``E_PUB_FAILED`` with the
    reason: the publisher tries again (neither an OK for what may be cut, nor a second
    copy of what may commit). A gap is judged over every partition."""
    n = len(bodies)
    own = log.identities()
    verdict = own.check(producer, first, n, now, log.latest, gaps=True)
    same_bodies(log, producer, first, bodies, verdict)
    high = own.high(producer)
    for other, settled in others:
        if not settled:
            # A partition being taken over (or a copy behind its leader): a publish of
            # this producer may be in it, unseen here yet. Not now: the publisher retries.
            raise DedupError(
                "E_PUB_FAILED",
                "another node's partition of this topic is being taken over; an "
                "idempotent publish waits until its copy here is caught up: publish again",
            )
        dedup = other.identities()
        v = dedup.check(producer, first, n, now, other.latest, gaps=True)
        if v.duplicates > verdict.duplicates:
            committed = other.committed
            if committed is not None and v.last_offset >= committed:
                # There, but not committed (its node died with it in flight): it may yet
                # be cut. Neither an OK nor a second copy now: the publisher tries again.
                raise DedupError(
                    "E_PUB_FAILED",
                    f"producer {producer.decode()} sequence {first + v.duplicates - 1} "
                    "is in another node's partition, not committed there yet: publish "
                    "again",
                )
            same_bodies(other, producer, first, bodies, v)
            verdict = Verdict(v.duplicates, -1)
        h = dedup.high(producer)
        if h is not None and (high is None or h > high):
            high = h
    if high is not None and first > high + 1:
        raise gap_error(producer, first, high)
    return verdict
