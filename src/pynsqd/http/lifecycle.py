"""Message lifecycle settings on the HTTP port (pynsqd; nsqd has none of these endpoints).

- ``GET /topic/config?topic=T``, ``POST /topic/config?topic=T[&msg_ttl=1h][&max_depth=N]
  [&bound_policy=reject|drop-oldest][&dedup_records=N][&dedup_window=24h]``
- ``GET /channel/config?topic=T&channel=C``, ``POST /channel/config?topic=T&channel=C
  [&max_attempts=N][&dead_letter=TOPIC|none][&max_depth=N][&max_bytes=N][&bound_policy=...]``

A POST creates the topic (and channel) like ``/topic/create``, stores the given values (kept
across restarts) and answers with the effective settings. A parameter given as ``default``
drops the topic's or channel's own value, so the flag applies again. Invalid values are a 400
naming the parameter (``INVALID_ARG_MAX_ATTEMPTS``); nothing changes then.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from aiohttp.web_request import BaseRequest

from ..internal import checks
from ..internal.gotext import format_duration, parse_duration
from ..internal.httpapi import HTTPError, Params, channel_arg, topic_arg
from ..internal.names import is_ephemeral, is_valid_name
from ..log import LOGGER_NAME
from .host import NSQDHost

log = logging.getLogger(LOGGER_NAME)

_UINT = re.compile(r"[0-9]{1,19}")
DEFAULT = "default"


def _count(text: str) -> int:
    if not _UINT.fullmatch(text) or int(text) >= 1 << 63:
        raise ValueError("not a count")
    return int(text)


def _ttl(text: str) -> float:
    seconds = parse_duration(text)
    if seconds < 0:
        raise ValueError("negative")
    return seconds


def _dead_letter(text: str) -> str:
    # An ephemeral dead-letter topic would drop what it keeps once its last channel goes.
    if text != "none" and (not is_valid_name(text) or is_ephemeral(text)):
        raise ValueError("not a durable topic name")
    return text


def _positive(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def check(text: str) -> Any:
        value = parse(text)
        if value <= 0:
            raise ValueError("not positive")
        return value

    return check


_TOPIC_PARAMS: dict[str, Callable[[str], Any]] = {
    "msg_ttl": _ttl,
    "max_depth": _count,
    "bound_policy": checks.check_bound_policy,
    # idempotent publishing's window (core/dedup.py)
    "dedup_records": _positive(_count),
    "dedup_window": _positive(_ttl),
}
_CHANNEL_PARAMS: dict[str, Callable[[str], Any]] = {
    "max_attempts": lambda t: checks.check_max_attempts(_count(t)),
    "dead_letter": _dead_letter,
    "max_depth": _count,
    "max_bytes": _count,
    "bound_policy": checks.check_bound_policy,
}


def _values(params: Params, table: dict[str, Callable[[str], Any]]) -> dict[str, Any]:
    """The settings given, checked; ``None`` for ``default`` (drop the own value)."""
    out: dict[str, Any] = {}
    for key, parse in table.items():
        text = params.get(key)
        if text is None:
            continue
        if text == DEFAULT:
            out[key] = None
            continue
        try:
            out[key] = parse(text)
        except ValueError:
            raise HTTPError(400, f"INVALID_ARG_{key.upper()}") from None
    return out


def _shown(cfg: dict[str, Any]) -> dict[str, Any]:
    out = {**cfg, "msg_ttl": format_duration(cfg["msg_ttl"])}
    if "dedup_window" in cfg:
        out["dedup_window"] = format_duration(cfg["dedup_window"])
    return out


class LifecycleAPI:
    def __init__(self, nsqd: NSQDHost) -> None:
        self.nsqd = nsqd

    def _names(self, params: Params, *, channel: bool) -> tuple[str, str]:
        topic = topic_arg(params)
        if not channel:
            return topic, ""
        return topic, channel_arg(params)

    async def get_topic(self, request: BaseRequest, params: Params) -> Any:
        topic, _ = self._names(params, channel=False)
        if self.nsqd.get_existing_topic(topic) is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return {"topic": topic, **_shown(self.nsqd.lifecycle.topic_config(topic))}

    async def set_topic(self, request: BaseRequest, params: Params) -> Any:
        topic, _ = self._names(params, channel=False)
        values = _values(params, _TOPIC_PARAMS)
        self._apply(lambda: self.nsqd.lifecycle.set_topic_config(topic, values), topic)
        log.info("TOPIC(%s): settings %s", topic, values)
        return {"topic": topic, **_shown(self.nsqd.lifecycle.topic_config(topic))}

    async def get_channel(self, request: BaseRequest, params: Params) -> Any:
        topic, channel = self._names(params, channel=True)
        existing = self.nsqd.get_existing_topic(topic)
        if existing is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        if channel not in existing.channels:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return {
            "topic": topic,
            "channel": channel,
            **_shown(self.nsqd.lifecycle.channel_config(topic, channel)),
        }

    async def set_channel(self, request: BaseRequest, params: Params) -> Any:
        topic, channel = self._names(params, channel=True)
        values = _values(params, _CHANNEL_PARAMS)
        if values.get("dead_letter") == topic:
            raise HTTPError(400, "INVALID_ARG_DEAD_LETTER")
        self._apply(lambda: self.nsqd.lifecycle.set_channel_config(topic, channel, values), topic)
        log.info("CHANNEL(%s:%s): settings %s", topic, channel, values)
        return {
            "topic": topic,
            "channel": channel,
            **_shown(self.nsqd.lifecycle.channel_config(topic, channel)),
        }

    def _apply(self, change: Callable[[], None], topic: str) -> None:
        if self.nsqd.exiting:
            raise HTTPError(503, "EXITING")
        try:
            change()
        except OSError as err:
            log.error("TOPIC(%s): failed to save settings - %s", topic, err)
            raise HTTPError(500, "INTERNAL_ERROR") from err
