"""What the supervisor and its workers share (``--workers``): the spec a worker is started
with, its own options, and the file of each worker's client connections.

Imported by the supervisor and by ``cli``, which import nothing else of the workers' code.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import struct
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ...options import Options


@dataclasses.dataclass
class WorkerSpec:
    """What the supervisor tells a worker (in ``PYNSQD_WORKER``, JSON)."""

    index: int
    count: int
    #: Inherited descriptors: tcp, http, https (shared); link, admin (this worker's unix
    #: sockets); alive (read end of a pipe the supervisor holds open); ready (write end).
    fds: dict[str, int]
    #: Every worker's link and admin socket paths, by index.
    links: list[str]
    admins: list[str]
    #: A file of ``count`` int64: each worker's client connections (``ConnectionCounts``).
    counts: str = ""
    #: The supervisor's start (unix seconds): the node's ``start_time`` in /info and /stats.
    started: int = 0
    #: The node's storage id (``<data-path>/cluster.id``), in /info; each worker's own data
    #: directory has its own, which its logs' answers carry (``/topic/offsets``).
    storage: str = ""

    ENV = "PYNSQD_WORKER"

    def to_env(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_env(cls) -> WorkerSpec | None:
        raw = os.environ.get(cls.ENV)
        if not raw:
            return None
        return cls(**json.loads(raw))


def worker_options(opts: Options, spec: WorkerSpec) -> None:
    """A worker's own options: its data directory, node id and log prefix."""
    base = opts.data_path or os.getcwd()
    opts.data_path = os.path.join(base, f"worker-{spec.index}")
    opts.node_id = (opts.node_id + spec.index) % 1024
    prefix = opts.log_prefix
    bare = prefix.rstrip()
    if bare.endswith("]"):  # "[nsqd] " -> "[nsqd w1] "
        opts.log_prefix = f"{bare[:-1]} w{spec.index}]{prefix[len(bare) :]}"
    else:
        opts.log_prefix = f"{prefix}w{spec.index} "


class ConnectionCounts:
    """Each worker's client connections, in a small file every worker maps: the supervisor
    makes it (every slot ``DOWN``), a worker writes its own slot, reads the others' to decide
    whether to accept (``Workers.admit``), and the supervisor writes ``DOWN`` when one exits."""

    DOWN = (1 << 62) - 1
    _SLOT = struct.Struct("<q")

    def __init__(self, path: str, count: int) -> None:
        self.count = count
        with open(path, "r+b") as f:
            self._map = mmap.mmap(f.fileno(), count * 8)

    @classmethod
    def create(cls, path: str, count: int) -> ConnectionCounts:
        with open(path, "wb") as f:
            f.write(cls._SLOT.pack(cls.DOWN) * count)
        return cls(path, count)

    def set(self, index: int, value: int) -> None:
        self._SLOT.pack_into(self._map, index * 8, value)

    def least_but(self, index: int) -> int:
        """The fewest connections of the other workers (``DOWN`` when none is up)."""
        unpack = self._SLOT.unpack_from
        return min(
            (unpack(self._map, i * 8)[0] for i in range(self.count) if i != index),
            default=self.DOWN,
        )

    def close(self) -> None:
        self._map.close()
