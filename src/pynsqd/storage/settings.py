"""pynsqd's own per-topic and per-channel settings (message lifecycle), kept across restarts.

One JSON file, ``<data-path>/pynsqd.settings.json``, beside nsqd's ``nsqd.dat`` rather than in
it: Go nsqd neither reads nor rewrites it, so a data directory stays Go nsqd's. Only what was
set per topic or channel is stored; anything absent follows the flags::

    {"topics": {"t": {"msg_ttl": 3600.0, "max_depth": 1000, "bound_policy": "reject",
                      "channels": {"c": {"max_attempts": 5, "dead_letter": "t.failed"}}}}}

Written atomically (tmp file, fsync, rename). An unreadable file is kept as ``.bad`` and the
flags apply, as nsqd does with its own metadata.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any, Protocol

from ..internal import jsonbound
from ..internal.names import default_dead_letter
from .atomic import write_atomic

SETTINGS_FILE = "pynsqd.settings.json"

TOPIC_KEYS = ("msg_ttl", "max_depth", "bound_policy", "dedup_records", "dedup_window")
CHANNEL_KEYS = ("max_attempts", "dead_letter", "max_depth", "max_bytes", "bound_policy")

Settings = dict[str, dict[str, Any]]


def read_settings(data_path: str) -> Settings:
    """The stored settings by topic; raises ValueError (the file is then set aside)."""
    path = os.path.join(data_path, SETTINGS_FILE)
    try:
        with open(path, "rb") as f:
            doc = jsonbound.loads(f.read())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        with contextlib.suppress(OSError):
            os.replace(path, path + ".bad")
        raise ValueError(f"failed to read {path} (kept as .bad) - {err}") from err
    topics = doc.get("topics") if isinstance(doc, dict) else None
    if not isinstance(topics, dict):
        return {}
    out: Settings = {}
    for name, t in topics.items():
        if not isinstance(name, str) or not isinstance(t, dict):
            continue
        entry = {k: t[k] for k in TOPIC_KEYS if k in t}
        channels = t.get("channels")
        if isinstance(channels, dict):
            entry["channels"] = {
                c: {k: v[k] for k in CHANNEL_KEYS if k in v}
                for c, v in channels.items()
                if isinstance(c, str) and isinstance(v, dict)
            }
        out[name] = entry
    return out


def write_settings(data_path: str, settings: Settings) -> None:
    doc = {"topics": settings}
    write_atomic(os.path.join(data_path, SETTINGS_FILE), json.dumps(doc, sort_keys=True).encode())


class LifecycleFlags(Protocol):
    """The flags a setting falls back to (nsqd's options)."""

    msg_ttl: float
    max_attempts: int
    max_channel_depth: int
    max_channel_bytes: int
    channel_bound_policy: str
    dedup_records: int
    dedup_window: float


class SettingsStore:
    """The stored settings and their policy: a topic's or channel's effective value is its
    own setting, else the flag's. All calls are made from the event loop thread."""

    def __init__(self, data_path: str, flags: LifecycleFlags) -> None:
        self.data_path = data_path
        self.flags = flags
        self.settings: Settings = {}

    def load(self) -> None:
        """Read the file; raises ValueError (set aside as ``.bad``: the flags apply)."""
        self.settings = {}
        self.settings = read_settings(self.data_path)

    def topic_config(self, name: str) -> dict[str, Any]:
        """A topic's effective settings and which of them are its own (``own``)."""
        own = {k: v for k, v in self.settings.get(name, {}).items() if k != "channels"}
        f = self.flags
        return {
            "msg_ttl": own.get("msg_ttl", f.msg_ttl),
            "max_depth": own.get("max_depth", f.max_channel_depth),
            "bound_policy": own.get("bound_policy", f.channel_bound_policy),
            "dedup_records": own.get("dedup_records", f.dedup_records),
            "dedup_window": own.get("dedup_window", f.dedup_window),
            "own": sorted(own),
        }

    def channel_config(self, topic: str, channel: str) -> dict[str, Any]:
        own = self.settings.get(topic, {}).get("channels", {}).get(channel, {})
        f = self.flags
        return {
            "max_attempts": own.get("max_attempts", f.max_attempts),
            "dead_letter": own.get("dead_letter", default_dead_letter(topic)),
            "msg_ttl": self.topic_config(topic)["msg_ttl"],
            "max_depth": own.get("max_depth", f.max_channel_depth),
            "max_bytes": own.get("max_bytes", f.max_channel_bytes),
            "bound_policy": own.get("bound_policy", f.channel_bound_policy),
            "own": sorted(own),
        }

    def set_topic(self, name: str, values: dict[str, Any]) -> None:
        """A topic's own settings (None: back to the flag), persisted. Raises OSError (then
        nothing changes)."""
        entry = dict(self.settings.get(name, {}))
        entry.update(values)
        self._save(name, {k: v for k, v in entry.items() if v is not None})

    def set_channel(self, topic: str, channel: str, values: dict[str, Any]) -> None:
        entry = dict(self.settings.get(topic, {}))
        channels = dict(entry.get("channels", {}))
        own = dict(channels.get(channel, {}))
        own.update(values)
        channels[channel] = {k: v for k, v in own.items() if v is not None}
        entry["channels"] = channels
        self._save(topic, entry)

    def _save(self, name: str, entry: dict[str, Any]) -> None:
        settings = dict(self.settings)
        settings[name] = entry
        write_settings(self.data_path, settings)
        self.settings = settings
