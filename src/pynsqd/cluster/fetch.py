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

import dataclasses
import json
import struct
from dataclasses import dataclass, field

__all__ = ["REPLICA_SECRET_HEADER", "FetchAnswer", "FetchRequest"]

_LEN = struct.Struct(">I")
#: A request is a few small numbers and a storage id.
MAX_REQUEST_BYTES = 4096


#: The header a replica fetch carries the cluster's secret in (``records.ClusterSecret``): a
#: leader whose nodes have --auth-http-address lets it through without a client's secret.
REPLICA_SECRET_HEADER = "X-Nsq-Replica-Secret"


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
        return json.dumps(dataclasses.asdict(self)).encode()

    @classmethod
    def decode(cls, data: bytes) -> FetchRequest:
        """Raises ``ValueError`` naming what is wrong."""
        names = [f.name for f in dataclasses.fields(cls)]
        try:
            doc = json.loads(data)
            values = {k: doc[k] for k in names}
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"unreadable fetch request ({err})") from None
        for k, v in values.items():
            if k == "storage":
                if not isinstance(v, str):
                    raise ValueError("fetch request: storage must be a string")
            elif type(v) is not int or v < 0:
                raise ValueError(f"fetch request: {k} must be a non-negative integer")
        return cls(**values)


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
