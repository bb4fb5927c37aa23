"""The client side of V2: commands to bytes (for our own client, the benchmark and tests)."""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import Any

from .frames import MAGIC_V2

_LEN = struct.Struct(">l")
_LEN2 = struct.Struct(">ll")

__all__ = [
    "MAGIC_V2",
    "auth",
    "cls",
    "dpub",
    "fin",
    "identify",
    "mpub",
    "nop",
    "pub",
    "rdy",
    "req",
    "sub",
    "touch",
]


def identify(data: dict[str, Any]) -> bytes:
    body = json.dumps(data).encode()
    return b"IDENTIFY\n" + _LEN.pack(len(body)) + body


def auth(secret: bytes) -> bytes:
    return b"AUTH\n" + _LEN.pack(len(secret)) + secret


def sub(topic: str, channel: str) -> bytes:
    return f"SUB {topic} {channel}\n".encode()


def rdy(count: int) -> bytes:
    return b"RDY %d\n" % count


def fin(msg_id: bytes) -> bytes:
    return b"FIN " + msg_id + b"\n"


def req(msg_id: bytes, timeout_ms: int) -> bytes:
    return b"REQ " + msg_id + b" %d\n" % timeout_ms


def touch(msg_id: bytes) -> bytes:
    return b"TOUCH " + msg_id + b"\n"


def nop() -> bytes:
    return b"NOP\n"


def cls() -> bytes:
    return b"CLS\n"


def _identity(identity: tuple[str, int] | None) -> str:
    """pynsqd: an idempotent publish's producer and sequence (negotiated in IDENTIFY)."""
    return "" if identity is None else f" {identity[0]} {identity[1]}"


def pub(topic: str, body: bytes, identity: tuple[str, int] | None = None) -> bytes:
    return f"PUB {topic}{_identity(identity)}\n".encode() + _LEN.pack(len(body)) + body


def dpub(topic: str, defer_ms: int, body: bytes, identity: tuple[str, int] | None = None) -> bytes:
    head = f"DPUB {topic} {defer_ms}{_identity(identity)}\n".encode()
    return head + _LEN.pack(len(body)) + body


def mpub(topic: str, bodies: Sequence[bytes], identity: tuple[str, int] | None = None) -> bytes:
    parts = [_LEN.pack(len(b)) + b for b in bodies]
    return mpub_framed(topic, b"".join(parts), len(bodies), identity)


def mpub_framed(
    topic: str, payload: bytes, count: int, identity: tuple[str, int] | None = None
) -> bytes:
    """MPUB of ``count`` messages already framed as ``[int32 size][body]...`` in ``payload``
    (the Spark sink builds it from Arrow buffers)."""
    head = f"MPUB {topic}{_identity(identity)}\n".encode()
    return head + _LEN2.pack(len(payload) + 4, count) + payload
