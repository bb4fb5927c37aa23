"""Test doubles shared by the unit tests (a test module imports no other test module):
a consumer, a topic's owner and an in-memory backend for the core; a connection's context and
transport for the protocol shell."""

from __future__ import annotations

import ssl
from collections import deque
from typing import Any

from pynsqd.core.backend import DummyBackend
from pynsqd.core.channel import Channel
from pynsqd.core.message import ConsumerCounts, Message, decode_message
from pynsqd.core.topic import Topic
from pynsqd.options import Options
from pynsqd.protocol.frames import Frame, FrameReader
from pynsqd.server.busypoll import BusyPoll
from pynsqd.server.nsqd import protocol_config
from pynsqd.server.protocol_v2 import ClientV2
from pynsqd.server.workers.lone import LoneProcess

from .fakeloop import FakeLoop


class ListBackend:
    """A backend that keeps encoded records in memory, like a disk queue would on disk."""

    def __init__(self) -> None:
        self.records: deque[bytes] = deque()

    def put_many(self, msgs: list[Message]) -> None:
        self.records.extend(m.encode() for m in msgs)

    def read_many(self, max_count: int, max_bytes: int = 0) -> list[Message]:
        return [decode_message(r) for r in self.read_raw(max_count, max_bytes)]

    def put_raw(self, records: list[bytes]) -> None:
        self.records.extend(records)

    def peek(self, max_count: int) -> list[Message]:
        return [decode_message(r) for r in list(self.records)[:max_count]]

    def read_raw(self, max_count: int, max_bytes: int = 0, *, hold: bool = False) -> list[bytes]:
        out: list[bytes] = []
        size = 0
        while self.records and len(out) < max_count and not (max_bytes and size >= max_bytes):
            out.append(self.records.popleft())
            size += len(out[-1])
        return out

    def commit_reads(self) -> None:
        pass

    def depth(self) -> int:
        return len(self.records)

    def empty(self) -> None:
        self.records.clear()

    def close(self) -> None:
        pass

    def delete(self) -> None:
        self.records.clear()


class Consumer(ConsumerCounts):
    _ids = 0
    is_link = False

    def __init__(self, rdy: int = 0, msg_timeout: float = 60.0, sample_rate: int = 0) -> None:
        super().__init__()
        Consumer._ids += 1
        self.id = Consumer._ids
        self.rdy = rdy
        self.msg_timeout = msg_timeout
        self.sample_rate = sample_rate
        self.write_paused = False
        self.got: list[Message] = []
        self.buffer_limit = 1 << 60  # body bytes it accepts before it is back-pressured
        self.buffered = 0  # body bytes "in its socket" (the tests drain it by hand)
        self.closed = False

    def send_messages(self, msgs: list[Message]) -> None:
        self.sending(len(msgs))
        self.got.extend(msgs)
        self.buffered += sum(len(m.body) for m in msgs)

    def output_room(self) -> int:
        return self.buffer_limit - self.buffered

    def close_for_exit(self) -> None:
        self.closed = True

    def take(self) -> list[Message]:
        got, self.got = self.got, []
        return got


class Owner:
    """The nsqd side of a topic: makes channels, records deletions."""

    def __init__(self, loop: FakeLoop, mem_queue_size: int = 100) -> None:
        self.loop = loop
        self.mem_queue_size = mem_queue_size
        self.deleted_topics: list[str] = []
        self.metadata_changes = 0

    def make_channel(self, topic: Topic, name: str) -> Channel:
        eph = name.endswith("#ephemeral")
        return Channel(
            topic,
            name,
            self.loop,
            mem_queue_size=self.mem_queue_size,
            backend=DummyBackend() if eph else ListBackend(),
            max_msg_timeout=900.0,
            ephemeral=eph,
        )

    def channel_deleted(self, topic: Topic, channel: Channel) -> None:
        pass

    def topic_emptied_of_channels(self, topic: Topic) -> None:
        self.deleted_topics.append(topic.name)

    def metadata_changed(self) -> None:
        self.metadata_changes += 1


def _topic(loop: FakeLoop, name: str = "t", mem: int = 100) -> tuple[Topic, Owner]:
    owner = Owner(loop, mem)
    eph = name.endswith("#ephemeral")
    topic = Topic(
        name,
        owner,
        loop,
        node_id=1,
        mem_queue_size=mem,
        backend=DummyBackend() if eph else ListBackend(),
        ephemeral=eph,
    )
    return topic, owner


def _publish(loop: FakeLoop, topic: Topic, n: int, prefix: bytes = b"m") -> None:
    topic.put_bodies([prefix + b"%d" % i for i in range(n)])
    loop.run_ready()


class Transport:
    """Records writes; closing is observable."""

    def __init__(self) -> None:
        self.reader = FrameReader()
        self.closed = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.reader.feed(data)

    def frames(self) -> list[Frame]:
        return self.reader.frames()

    def close(self) -> None:
        self.closed = True

    abort = close

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


class Context:
    """What a connection needs of nsqd (``ConnectionContext``), with real core topics."""

    def __init__(self, loop: FakeLoop, **overrides: Any) -> None:
        self.loop = loop
        self.opts = Options(**overrides)
        self.protocol_config = protocol_config(self.opts)
        self.auth = None
        self.tls_context: ssl.SSLContext | None = None
        # Off: on the fake loop a spinning callback would keep run_ready going forever.
        self.busy_poll = BusyPoll(loop, 0)  # type: ignore[arg-type]
        self.replication = None
        self.workers = LoneProcess(self)  # type: ignore[arg-type]  # one process
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, ClientV2] = {}
        self._ids = 0

    def next_client_id(self) -> int:
        self._ids += 1
        return self._ids

    def add_client(self, client: ClientV2) -> None:
        self.clients[client.id] = client

    def remove_client(self, client: ClientV2) -> None:
        self.clients.pop(client.id, None)

    def get_topic(self, name: str) -> Topic:
        topic = self.topics.get(name)
        if topic is None:
            topic = Topic(
                name, self, self.loop, node_id=1, mem_queue_size=100, backend=DummyBackend()
            )  # type: ignore[arg-type]
            self.topics[name] = topic
        return topic

    def set_health_error(self, err: BaseException | None) -> None:
        pass

    # what a topic needs of its owner
    def make_channel(self, topic: Topic, name: str) -> Channel:
        return Channel(
            topic,
            name,
            self.loop,  # type: ignore[arg-type]
            mem_queue_size=100,
            backend=DummyBackend(),
            max_msg_timeout=self.opts.max_msg_timeout,
        )

    def channel_deleted(self, topic: Topic, channel: Channel) -> None:
        pass

    def topic_emptied_of_channels(self, topic: Topic) -> None:
        pass

    def metadata_changed(self) -> None:
        pass
