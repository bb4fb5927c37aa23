"""The replication fetch's wire format, declared once: a follower's request and the leader's
answer, one websocket message each on ``GET /topic/replicate`` (no I/O here).

Theory of operation. A follower keeps one websocket per partition it follows open to the
partition's leader and sends one ``FetchRequest`` at a time: the offset it asks for is its
acknowledgement of everything before it (fsynced, with durability=fsync). The leader answers
each with one ``FetchAnswer``: the records from that offset (as the log holds them: headers,
CRCs, bodies) with its high watermark, epoch and epoch history; or a refusal the follower acts
on (``TRUNCATE`` to ``truncate_to``, ``RESET`` to ``start``, ``EPOCH_MISMATCH``/``NOT_LEADER``:
the plan decides). One message each way per fetch, on a connection that stays open, is what
makes a fetch cheap: an HTTP request per fetch cost a third of a node's time (the bench).

Request: JSON ``{"offset", "epoch", "last_epoch", "replica", "storage", "wait_ms",
"max_bytes"}``. Answer: a 4-byte big-endian header length, the header (JSON: ``status``,
``message``, ``epoch``, ``hw``, ``latest``, ``earliest``, ``epochs``, ``truncate_to``,
``start``), then the records.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FetchAnswer", "FetchRequest"]

_LEN = struct.Struct(">I")
#: A request is a few small numbers and a storage id.
MAX_REQUEST_BYTES = 4096


@dataclass(frozen=True)
class FetchRequest:
    offset: int
    epoch: int
    last_epoch: int
    replica: int
    storage: str
    wait_ms: int
    max_bytes: int

    def encode(self) -> bytes:
        return json.dumps(
            {
                "offset": self.offset,
                "epoch": self.epoch,
                "last_epoch": self.last_epoch,
                "replica": self.replica,
                "storage": self.storage,
                "wait_ms": self.wait_ms,
                "max_bytes": self.max_bytes,
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> FetchRequest:
        """Raises ``ValueError`` naming what is wrong."""
        try:
            doc = json.loads(data)
            ints = {
                k: doc[k]
                for k in ("offset", "epoch", "last_epoch", "replica", "wait_ms", "max_bytes")
            }
            storage = doc["storage"]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"unreadable fetch request ({err})") from None
        for k, v in ints.items():
            if type(v) is not int or v < 0:
                raise ValueError(f"fetch request: {k} must be a non-negative integer")
        if not isinstance(storage, str):
            raise ValueError("fetch request: storage must be a string")
        return cls(storage=storage, **ints)


@dataclass(frozen=True)
class FetchAnswer:
    status: int
    message: str = ""
    epoch: int = 0
    hw: int = 0
    latest: int = 0
    earliest: int = 0
    epochs: list[tuple[int, int]] = field(default_factory=list)
    truncate_to: int = 0
    start: int = 0
    records: bytes = b""

    @classmethod
    def refuse(cls, status: int, message: str, **extra: Any) -> FetchAnswer:
        return cls(status, message, **extra)

    def encode(self) -> bytes:
        header = json.dumps(
            {
                "status": self.status,
                "message": self.message,
                "epoch": self.epoch,
                "hw": self.hw,
                "latest": self.latest,
                "earliest": self.earliest,
                "epochs": self.epochs,
                "truncate_to": self.truncate_to,
                "start": self.start,
            }
        ).encode()
        return b"".join((_LEN.pack(len(header)), header, self.records))

    @classmethod
    def decode(cls, data: bytes) -> FetchAnswer:
        """Raises ``ValueError`` naming what is wrong."""
        if len(data) < 4:
            raise ValueError("fetch answer shorter than its header length")
        (n,) = _LEN.unpack_from(data)
        if 4 + n > len(data):
            raise ValueError("fetch answer shorter than its header")
        try:
            doc = json.loads(data[4 : 4 + n])
            return cls(
                status=int(doc["status"]),
                message=str(doc["message"]),
                epoch=int(doc["epoch"]),
                hw=int(doc["hw"]),
                latest=int(doc["latest"]),
                earliest=int(doc["earliest"]),
                epochs=[(int(e), int(s)) for e, s in doc["epochs"]],
                truncate_to=int(doc["truncate_to"]),
                start=int(doc["start"]),
                records=data[4 + n :],
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"unreadable fetch answer header ({err})") from None
