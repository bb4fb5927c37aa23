"""The message lifecycle's settings applied (pynsqd; README, "Beyond nsqd"): max attempts and
dead-lettering, TTL, bounds, the dedup window.

Theory of operation. ``storage/settings.SettingsStore`` keeps a topic's and a channel's own
values (``POST /topic/config``, ``/channel/config``) beside the flags' defaults; this applies the
effective values to the core's topics and channels when they are made (``apply_topic``,
``apply_channel``) and when a value is set (``set_topic_config``: persisted first, then applied;
OSError leaves everything as it was), and dead-letters a channel's messages that used up their
attempts to its dead-letter topic (``dead_letter``: with their IDs and bodies; ``none``: dropped,
still counted; an error leaves them on the channel, ``core/lifecycle.Screen`` retries).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..core.channel import Channel
from ..core.errors import QueueFull
from ..core.message import Message
from ..core.topic import Topic
from ..internal.names import is_valid_name
from ..storage.settings import SettingsStore

log = logging.getLogger("pynsqd")


class Lifecycles:
    """The lifecycle settings of one nsqd's topics and channels (``nsqd.lifecycle``)."""

    def __init__(
        self,
        store: SettingsStore,
        get_topic: Callable[[str], Topic],
        exiting: Callable[[], bool],
    ) -> None:
        self.settings = store
        self._get_topic = get_topic
        self._exiting = exiting

    def load(self) -> None:
        try:
            self.settings.load()
        except ValueError as err:
            log.error("NSQ: %s; the flags apply", err)

    def topic_config(self, name: str) -> dict[str, Any]:
        """A topic's effective settings and which of them are its own."""
        return self.settings.topic_config(name)

    def channel_config(self, topic: str, channel: str) -> dict[str, Any]:
        return self.settings.channel_config(topic, channel)

    def apply_topic(self, topic: Topic) -> None:
        cfg = self.topic_config(topic.name)
        topic.max_depth, topic.bound_policy = cfg["max_depth"], cfg["bound_policy"]
        topic.dedup_window = (cfg["dedup_records"], round(cfg["dedup_window"] * 1e9))
        for ch in topic.channels.values():
            self.apply_channel(topic.name, ch)
        topic.refresh_bounds()

    def apply_channel(self, topic: str, ch: Channel) -> None:
        cfg = self.channel_config(topic, ch.name)
        ch.set_lifecycle(
            cfg["max_attempts"],
            round(cfg["msg_ttl"] * 1e9),
            cfg["max_depth"],
            cfg["bound_policy"],
            cfg["max_bytes"],
        )

    def set_topic_config(self, name: str, values: dict[str, Any]) -> None:
        """``POST /topic/config`` (values already checked); persisted, then applied. Raises
        OSError (then nothing changes)."""
        self.settings.set_topic(name, values)
        self.apply_topic(self._get_topic(name))

    def set_channel_config(self, topic_name: str, channel: str, values: dict[str, Any]) -> None:
        self.settings.set_channel(topic_name, channel, values)
        topic = self._get_topic(topic_name)
        self.apply_channel(topic_name, topic.get_channel(channel))
        topic.refresh_bounds()

    def dead_letter(
        self, topic: Topic, channel: Channel, msgs: list[Message]
    ) -> OSError | QueueFull | None:
        """Messages that used up their attempts: to the channel's dead-letter topic, with
        their IDs and bodies (``none``: dropped, still counted)."""
        target = self.channel_config(topic.name, channel.name)["dead_letter"]
        if target == "none":
            return None
        if not is_valid_name(target):
            return OSError(f"dead-letter topic {target!r} is not a valid topic name")
        if self._exiting():
            return OSError("exiting")
        dl = self._get_topic(target)
        if dl.exiting:
            return OSError(f"dead-letter topic {target} is being deleted")
        try:
            dl.publish_existing([Message(m.id, m.body, m.timestamp, 0, m.headers) for m in msgs])
        except (OSError, QueueFull) as err:
            return err
        log.info(
            "CHANNEL(%s:%s): %d message(s) used up their attempts; moved to topic %s",
            topic.name,
            channel.name,
            len(msgs),
            target,
        )
        return None
