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
from typing import Any

from ..internal import jsonbound
from .atomic import write_atomic

SETTINGS_FILE = "pynsqd.settings.json"

TOPIC_KEYS = ("msg_ttl", "max_depth", "bound_policy")
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
