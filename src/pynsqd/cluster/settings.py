"""A topic's replication settings: one format, kept in etcd, parsed and checked here.

``replicas`` copies of each partition (1: not replicated, exactly as without a cluster);
``min_insync``: how many of them, the leader included, must hold a record before it is
committed (default a majority, ``replicas // 2 + 1``); ``acks``: ``all`` answers a publish once
it is committed, ``leader`` once the leader wrote it (replication follows, the lag is the loss
window); ``durability``: ``fsync`` counts a replica once the record is fsynced there,
``pagecache`` once it is written (a power loss of every replica can lose it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass

__all__ = ["ACKS", "DURABILITY", "MAX_REPLICAS", "ReplicationSettings", "SettingsError"]

ACKS = ("all", "leader")
DURABILITY = ("fsync", "pagecache")
MAX_REPLICAS = 7


class SettingsError(ValueError):
    """An invalid setting: ``code`` is the HTTP API's error (``INVALID_ARG_REPLICAS``...)."""

    def __init__(self, code: str, why: str) -> None:
        super().__init__(why)
        self.code = code


@dataclass(frozen=True)
class ReplicationSettings:
    replicas: int = 1
    min_insync: int = 1
    acks: str = "all"
    durability: str = "fsync"

    @property
    def replicated(self) -> bool:
        return self.replicas > 1

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> ReplicationSettings:
        doc = json.loads(raw)
        if not isinstance(doc, dict):
            raise SettingsError("INVALID_SETTINGS", "not a JSON object")
        return cls.parse(lambda k: None if doc.get(k) is None else str(doc[k]), cls())

    @classmethod
    def parse(
        cls, get: Callable[[str], str | None], base: ReplicationSettings
    ) -> ReplicationSettings:
        """``base`` with what ``get`` gives (query parameters, or a stored document);
        ``min_insync`` follows ``replicas`` unless given. Raises ``SettingsError``."""

        def number(key: str, low: int, high: int) -> int | None:
            text = get(key)
            if text is None:
                return None
            if not text.isdigit() or not low <= int(text) <= high:
                raise SettingsError(f"INVALID_ARG_{key.upper()}", f"{key} must be {low}-{high}")
            return int(text)

        def choice(key: str, allowed: tuple[str, ...]) -> str | None:
            text = get(key)
            if text is not None and text not in allowed:
                raise SettingsError(
                    f"INVALID_ARG_{key.upper()}", f"{key} must be one of {', '.join(allowed)}"
                )
            return text

        replicas = number("replicas", 1, MAX_REPLICAS)
        min_insync = number("min_insync", 1, MAX_REPLICAS)
        acks = choice("acks", ACKS)
        durability = choice("durability", DURABILITY)
        r = base.replicas if replicas is None else replicas
        if min_insync is None:
            min_insync = base.min_insync if replicas is None else r // 2 + 1
        if min_insync > r:
            raise SettingsError(
                "INVALID_ARG_MIN_INSYNC", f"min_insync ({min_insync}) exceeds replicas ({r})"
            )
        return cls(r, min_insync, acks or base.acks, durability or base.durability)


def check_change(
    topic: str, base: ReplicationSettings, settings: ReplicationSettings, *, placed: bool
) -> None:
    """``POST /topic/replication``: copies are placed when a partition is made; adding, moving
    or dropping them (turning replication off) is not built: refused rather than half-done.
    Raises SettingsError (``REPLICAS_FIXED``)."""
    if placed and base.replicated and settings.replicas != base.replicas:
        raise SettingsError(
            "REPLICAS_FIXED",
            f"topic {topic}'s partitions are placed with {base.replicas} copies: replicas "
            f"cannot change from {base.replicas} to {settings.replicas} (min_insync, acks "
            f"and durability can)",
        )
