"""nsqlookupd's registration DB (``nsqlookupd/registration_db.go``): who has which topic.

A registration is ``(category, key, subkey)``: ``("client", "", "")`` for every identified
node, ``("topic", <topic>, "")`` and ``("channel", <topic>, <channel>)``. Each maps producer IDs
(the node's remote ``ip:port``) to a ``Producer``: the node's ``PeerInfo`` plus this
registration's tombstone. Removing the last producer leaves the key with no producers, as in
nsqlookupd, so ``/topics`` keeps listing it until ``/topic/delete``. An index from producer ID to
its registrations keeps a disconnect and ``/nodes`` from scanning every key.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from ..protocol.lookup import Identify


@dataclass(frozen=True, slots=True)
class Registration:
    category: str
    key: str
    subkey: str

    def is_match(self, category: str, key: str, subkey: str) -> bool:
        if category != self.category:
            return False
        if key != "*" and key != self.key:
            return False
        return subkey == "*" or subkey == self.subkey


@dataclass(slots=True)
class PeerInfo:
    """An identified nsqd. ``id`` is the connection's remote address; ``node`` what it said of
    itself in its IDENTIFY."""

    id: str
    remote_address: str
    node: Identify
    last_update_ns: int = field(default_factory=time.time_ns)

    def as_json(self) -> dict[str, Any]:
        """``PeerInfo`` as nsqlookupd marshals it (its struct's field order)."""
        node = self.node
        return {
            "remote_address": self.remote_address,
            "hostname": node.hostname,
            "broadcast_address": node.broadcast_address,
            "tcp_port": node.tcp_port,
            "http_port": node.http_port,
            "version": node.version,
            "topology_zone": node.topology_zone,
            "topology_region": node.topology_region,
        }


@dataclass(slots=True)
class Producer:
    peer_info: PeerInfo
    tombstoned: bool = False
    tombstoned_at_ns: int = 0

    def tombstone(self) -> None:
        self.tombstoned = True
        self.tombstoned_at_ns = time.time_ns()

    def is_tombstoned(self, lifetime: float, now_ns: int | None = None) -> bool:
        now = time.time_ns() if now_ns is None else now_ns
        return self.tombstoned and now - self.tombstoned_at_ns < lifetime * 1e9


def filter_by_active(
    producers: list[Producer], inactivity_timeout: float, tombstone_lifetime: float
) -> list[Producer]:
    """Producers that pinged within ``inactivity_timeout`` and are not tombstoned."""
    now = time.time_ns()
    return [
        p
        for p in producers
        if now - p.peer_info.last_update_ns <= inactivity_timeout * 1e9
        and not p.is_tombstoned(tombstone_lifetime, now)
    ]


class RegistrationDB:
    def __init__(self) -> None:
        self.registrations: dict[Registration, dict[str, Producer]] = {}
        self._by_id: dict[str, set[Registration]] = {}

    def add_registration(self, k: Registration) -> None:
        self.registrations.setdefault(k, {})

    def add_producer(self, k: Registration, p: Producer) -> bool:
        """Add ``p`` under ``k``; False if that producer ID was already there (a tombstoned
        entry stays tombstoned)."""
        producers = self.registrations.setdefault(k, {})
        pid = p.peer_info.id
        if pid in producers:
            return False
        producers[pid] = p
        self._by_id.setdefault(pid, set()).add(k)
        return True

    def remove_producer(self, k: Registration, pid: str) -> tuple[bool, int]:
        """(whether it was there, how many producers are left); the key itself stays."""
        producers = self.registrations.get(k)
        if producers is None:
            return False, 0
        removed = producers.pop(pid, None) is not None
        if removed:
            keys = self._by_id.get(pid)
            if keys is not None:
                keys.discard(k)
                if not keys:
                    del self._by_id[pid]
        return removed, len(producers)

    def remove_registration(self, k: Registration) -> None:
        producers = self.registrations.pop(k, None)
        for pid in producers or ():
            keys = self._by_id.get(pid)
            if keys is not None:
                keys.discard(k)
                if not keys:
                    del self._by_id[pid]

    def find_registrations(self, category: str, key: str, subkey: str) -> list[Registration]:
        if key != "*" and subkey != "*":
            k = Registration(category, key, subkey)
            return [k] if k in self.registrations else []
        found = [k for k in self.registrations if k.is_match(category, key, subkey)]
        return sorted(found, key=lambda r: (r.key, r.subkey))

    def find_producers(self, category: str, key: str, subkey: str) -> list[Producer]:
        results: dict[str, Producer] = {}
        for k in self.find_registrations(category, key, subkey):
            for pid, p in self.registrations[k].items():
                results.setdefault(pid, p)
        return list(results.values())

    def lookup_registrations(self, pid: str) -> list[Registration]:
        return sorted(self._by_id.get(pid, ()), key=lambda r: (r.category, r.key, r.subkey))


__all__ = [
    "PeerInfo",
    "Producer",
    "Registration",
    "RegistrationDB",
    "filter_by_active",
]
