"""Client commands as the parser emits them.

Commands are NamedTuples rather than frozen dataclasses: they are created once per wire command
on the hot path, and a NamedTuple is immutable at a third of the construction cost.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple


class ClientState(IntEnum):
    """nsqd's client states; the integers appear as ``state`` in /stats."""

    INIT = 0
    DISCONNECTED = 1
    CONNECTED = 2
    SUBSCRIBED = 3
    CLOSING = 4


class IdentifyData(NamedTuple):
    """A validated IDENTIFY body, with nsqd's defaults resolved (durations in ms)."""

    client_id: str
    hostname: str
    user_agent: str
    heartbeat_interval_ms: int  # 0: heartbeats disabled
    output_buffer_size: int
    output_buffer_timeout_ms: int  # 0: no timer, flush on every write
    sample_rate: int
    msg_timeout_ms: int
    feature_negotiation: bool
    tls_v1: bool
    snappy: bool
    deflate: bool
    deflate_level: int
    topology_region: str
    topology_zone: str
    #: pynsqd: PUB, MPUB and DPUB may name a producer and a sequence number.
    idempotent_publish: bool = False
    #: pynsqd: bodies sent and messages received carry header blocks (``protocol/headers.py``).
    headers: bool = False


class Identify(NamedTuple):
    data: IdentifyData


class Auth(NamedTuple):
    secret: bytes


class Sub(NamedTuple):
    topic: str
    channel: str


class Identity(NamedTuple):
    """An idempotent publish's identity (pynsqd, negotiated in IDENTIFY): the producer's id
    and the sequence number of the (first) message."""

    producer: bytes
    sequence: int


class Pub(NamedTuple):
    topic: str
    body: bytes
    identity: Identity | None = None


class Strided(list[bytes]):
    """MPUB's bodies when all were one size (the parser's fast path): body ``i`` is
    ``data[start + i * stride :][:width]``, so a check of every body reads them all at once
    from there, a strided slice per byte (``headers.split_bodies``), without joining them
    again. Otherwise a plain list of the bodies.

    ``unblocked``: a client that negotiated headers sent every one with an empty block, and
    the parser cut the bodies past its length field (each body one copy, not two): they are
    the messages' bodies, without headers."""

    __slots__ = ("data", "start", "stride", "unblocked")

    data: bytes
    start: int
    stride: int
    unblocked: bool


class Mpub(NamedTuple):
    topic: str
    bodies: list[bytes]
    identity: Identity | None = None


class Dpub(NamedTuple):
    topic: str
    defer_ms: int
    body: bytes
    identity: Identity | None = None


class Rdy(NamedTuple):
    ready_count: int


class Fin(NamedTuple):
    """One or more consecutive FINs: a consumer FINs in runs, and each id is handled alone."""

    ids: list[bytes]


class Req(NamedTuple):
    id: bytes
    timeout_ms: int  # already clamped to [0, --max-req-timeout], as nsqd does
    requested_ms: int  # what the client asked for, for the log line when clamped


class Touch(NamedTuple):
    id: bytes


class Cls(NamedTuple):
    pass


class Nop(NamedTuple):
    pass


Command = Identify | Auth | Sub | Pub | Mpub | Dpub | Rdy | Fin | Req | Touch | Cls | Nop
