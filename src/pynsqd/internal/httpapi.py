"""What nsqd's and nsqlookupd's HTTP APIs share (Go nsq's ``internal/http_api``): the error a
handler raises, the query string as Go reads it, and the topic/channel argument checks."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote_plus

from .names import is_valid_name

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


class HTTPError(Exception):
    """An API error: HTTP status and nsqd's token (``{"message": TEXT}``). ``extra``: more
    fields for the JSON body (pynsqd's own endpoints: the valid range of an offset)."""

    def __init__(self, code: int, text: str, extra: dict[str, Any] | None = None) -> None:
        super().__init__(text)
        self.code = code
        self.text = text
        self.extra = extra or {}


class Params:
    """The query string as Go's ``url.ParseQuery`` reads it (first value wins)."""

    def __init__(self, raw_query: str) -> None:
        # Go refuses bad %-escapes and ';' separators: nsqd answers INVALID_REQUEST.
        self.error = bool(_BAD_ESCAPE.search(raw_query)) or ";" in raw_query
        self.values: dict[str, str] = {}
        if self.error:
            return
        for part in raw_query.split("&"):
            if not part:
                continue
            key, _, value = part.partition("=")
            key = unquote_plus(key, errors="surrogateescape")
            self.values.setdefault(key, unquote_plus(value, errors="surrogateescape"))

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def checked(self) -> Params:
        if self.error:
            raise HTTPError(400, "INVALID_REQUEST")
        return self


def topic_arg(params: Params, invalid: str = "INVALID_ARG_TOPIC") -> str:
    """The ``topic`` argument, checked: nsqd answers ``INVALID_TOPIC`` for its own endpoints
    (``getTopicFromQuery``), ``INVALID_ARG_TOPIC`` for the shared ones."""
    name = params.checked().get("topic")
    if name is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(name):
        raise HTTPError(400, invalid)
    return name


def topic_channel_args(params: Params) -> tuple[str, str]:
    """``http_api.GetTopicChannelArgs``, shared by nsqd and nsqlookupd."""
    topic = params.get("topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not is_valid_name(topic):
        raise HTTPError(400, "INVALID_ARG_TOPIC")
    return topic, channel_arg(params)


def channel_arg(params: Params) -> str:
    """The ``channel`` argument, checked."""
    channel = params.get("channel")
    if channel is None:
        raise HTTPError(400, "MISSING_ARG_CHANNEL")
    if not is_valid_name(channel):
        raise HTTPError(400, "INVALID_ARG_CHANNEL")
    return channel
