"""nsqd.dat: every topic and channel of the node, with its paused flag (nsqd's ``LoadMetadata``
and ``PersistMetadata``).

Theory of operation. A pause or unpause, a deletion, and start and stop write the file at once
(``persist``); a burst of new topics and channels shares one write, off the loop, a moment later
(``persist_soon``). At start ``load`` makes the topics and channels it lists, paused as they
were; an unreadable file is kept as ``nsqd.dat.bad`` and the topics are recovered from their
disk queue files (their paused flags are lost), and a retained topic whose log is in the data
path is served even if a crash came before nsqd.dat listed it. While it loads, nothing is
written (``loading``). The file's format and writer are ``storage/metadata.py``'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Mapping

from ..core.topic import Topic
from ..internal.names import is_ephemeral, is_valid_name
from ..storage.metadata import (
    METADATA_FILE,
    ChannelMeta,
    MetadataWriter,
    TopicMeta,
    read_metadata,
    recover_metadata,
)

log = logging.getLogger("pynsqd")

#: New topics and channels within this many seconds share one write of nsqd.dat.
METADATA_DELAY = 0.1

#: Topics with a log in the data path, not among ``known``, that may be served (``Retention``).
Found = Callable[[set[str], Callable[[str], bool]], list[str]]


class NodeMetadata:
    """One nsqd's nsqd.dat (``nsqd.metadata``)."""

    def __init__(
        self,
        data_path: str,
        topics: Mapping[str, Topic],
        exiting: Callable[[], bool],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.data_path = data_path
        self._topics = topics
        self._exiting = exiting
        self._loop = loop
        #: The file's topics are being made: nothing is written meanwhile.
        self.loading = False
        self._writer = MetadataWriter(data_path, log)

    def persist(self) -> None:
        """Write nsqd.dat now: every non-ephemeral topic and channel with its paused flag."""
        if not self.loading:
            self._writer.write_now(self._snapshot())

    def persist_soon(self) -> None:
        """New topics and channels: a burst of creations shares one write, off the loop."""
        if not self.loading and not self._exiting():
            self._writer.write_soon(
                lambda: None if self._exiting() else self._snapshot(),
                self._loop.call_later,
                METADATA_DELAY,
            )

    def _snapshot(self) -> list[TopicMeta]:
        return [
            TopicMeta(
                t.name,
                t.paused,
                [ChannelMeta(c.name, c.paused) for c in t.channels.values() if not c.ephemeral],
            )
            for t in self._topics.values()
            if not t.ephemeral
        ]

    def load(self, get_topic: Callable[[str], Topic], found: Found) -> None:
        """Make the topics and channels of nsqd.dat (``get_topic``), paused as they were."""
        try:
            topics = read_metadata(self.data_path)
        except ValueError as err:
            log.error("NSQ: %s", err)
            path = os.path.join(self.data_path, METADATA_FILE)
            with contextlib.suppress(OSError):
                os.replace(path, path + ".bad")
            topics = recover_metadata(self.data_path)
            log.warning(
                "NSQ: kept the unreadable metadata as %s.bad; recovered %d topic(s) from their "
                "disk queue files (paused flags are lost)",
                path,
                len(topics),
            )
        topics = topics or []
        # A retained topic whose log exists is served even if a crash came before nsqd.dat
        # listed it (nsqd.dat is written just after a topic is created, not before its first OK).
        known = {t.name for t in topics}
        for name in found(known, lambda n: is_valid_name(n) and not is_ephemeral(n)):
            log.info("TOPIC(%s): found its log; serving it", name)
            topics.append(TopicMeta(name, False, []))
        if not topics:
            return
        self.loading = True
        try:
            for t in topics:
                if not is_valid_name(t.name):
                    log.warning("skipping creation of invalid topic %s", t.name)
                    continue
                topic = get_topic(t.name)
                if t.paused:
                    topic.paused = True  # before its channels exist: nothing flows yet
                for c in t.channels:
                    if not is_valid_name(c.name):
                        log.warning("skipping creation of invalid channel %s", c.name)
                        continue
                    channel = topic.get_channel(c.name)
                    if c.paused:
                        channel.paused = True
        finally:
            self.loading = False

    def close(self) -> None:
        self._writer.close()
