"""What can go wrong in a channel, in the core's own terms.

The core knows nothing of the wire: the connection maps these to nsqd's ``E_*`` codes and texts
in one place (``server/protocol_v2.py``, ``channel_error``), as nsqd's ``protocol_v2.go`` wraps
the errors of its channel.
"""

from __future__ import annotations


class ChannelError(Exception):
    """A consumer command the channel refused."""


class NotInFlight(ChannelError):
    def __init__(self, msg_id: bytes) -> None:
        super().__init__(msg_id)
        self.msg_id = msg_id


class NotOwner(ChannelError):
    def __init__(self, msg_id: bytes) -> None:
        super().__init__(msg_id)
        self.msg_id = msg_id


class AlreadyDeferred(ChannelError):
    def __init__(self, msg_id: bytes) -> None:
        super().__init__(msg_id)
        self.msg_id = msg_id


class Exiting(ChannelError):
    """The channel is closing or being deleted."""


class TooManyConsumers(ChannelError):
    def __init__(self, topic: str, channel: str, limit: int) -> None:
        super().__init__(topic, channel, limit)
        self.topic, self.channel, self.limit = topic, channel, limit


class QueueFull(Exception):
    """A publish would take a bounded queue past its bound (policy ``reject``): nothing of the
    publish is stored. ``where`` is ``topic`` or ``topic:channel``."""

    def __init__(self, where: str, depth: int, limit: int, why: str = "") -> None:
        super().__init__(f"{where} is full ({why or f'{depth} of {limit} messages'})")
        self.where, self.depth, self.limit = where, depth, limit


class NotRetained(Exception):
    """An idempotent publish to a topic that keeps no log: nothing could recognise its retry."""

    def __init__(self, topic: str) -> None:
        super().__init__(
            f"topic {topic} keeps no log, so a retried publish cannot be recognised: give it "
            f"retention (POST /topic/retention?topic={topic} with time=24h, or --retention-time)"
        )
        self.topic = topic


class PublishRefused(Exception):
    """A publish this node cannot take for a replicated topic (the reason is the message;
    ``code`` the HTTP API's error code for it). Raised by the gate (``cluster/gate.py``)."""

    def __init__(self, reason: str, code: str) -> None:
        super().__init__(reason)
        self.code = code


class NotYetWritable(Exception):
    """A publish to ``topic`` must wait: another node serves this node's partition while this
    node catches up to take it back (``PublishGate.when_writable`` says when to try again)."""

    def __init__(self, topic: str) -> None:
        super().__init__(topic)
        self.topic = topic
