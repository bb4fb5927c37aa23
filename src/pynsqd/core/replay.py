"""What a rewind of a replayable topic's channel reports (``server/retention.py`` runs it)."""

from __future__ import annotations

from dataclasses import dataclass


class Conflict(Exception):
    """Refused while something else runs on the topic or channel: ``token`` names it (the
    HTTP API answers 409)."""

    def __init__(self, token: str) -> None:
        super().__init__(token)
        self.token = token


@dataclass(frozen=True)
class Replayed:
    """What a rewind put back: offsets ``[offset, next)``, ``count`` messages; ``stopped``: why
    it ended before the latest offset of the call (None: it did not). ``TOPIC_DELETED``,
    ``CHANNEL_DELETED``, ``TOPIC_NOT_RETAINED``, ``REWIND_INTERRUPTED`` (a read failed),
    ``CHANNEL_FULL`` (a bound with policy reject: the rest would not fit) or ``EXITING`` (nsqd
    is stopping)."""

    offset: int
    next: int
    count: int
    stopped: str | None = None
