"""A connection's AUTH session on the fake clock: an authorization expires by the loop's clock,
the command that finds it expired waits for a fresh answer, and that answer decides."""

from __future__ import annotations

import re
from collections import deque
from typing import Any

import pytest

from pynsqd.protocol.commands import Pub
from pynsqd.protocol.errors import FatalClientError, ProtocolError
from pynsqd.server.auth import Authorization, AuthState
from pynsqd.server.auth_session import AuthSession
from pynsqd.server.client_v2 import Pause

from ..fakeloop import FakeLoop


class Authd:
    """The auth client: each query is a task the test answers by hand."""

    async def query_any(self, remote_ip: str, tls: bool, cn: str, secret: bytes) -> AuthState:
        raise AssertionError("never run: the fake loop's tasks are finished by the test")


class Nsqd:
    def __init__(self) -> None:
        self.auth = Authd()


class Conn:
    """The connection as the session sees it (``auth_session.Authenticating``)."""

    def __init__(self, loop: FakeLoop) -> None:
        self.nsqd: Any = Nsqd()
        self.loop: Any = loop
        self.transport = None
        self.queue: deque[Any] = deque()
        self.closed = False
        self.remote_address = "127.0.0.1:1"
        self.tls = False
        self.tls_common_name = ""
        self.auth_state: AuthState | None = None
        self.paused: Pause | None = None
        self.sent: list[bytes] = []
        self.fatal_errors: list[ProtocolError] = []
        self.resumed = 0

    def pause(self, why: Pause) -> None:
        self.paused = why

    def resume(self) -> None:
        self.paused = None
        self.resumed += 1

    def fatal(self, err: ProtocolError) -> None:
        self.fatal_errors.append(err)

    def send_frame(self, frame: bytes) -> None:
        self.sent.append(frame)


def state(loop: FakeLoop, ttl: int, topic: str) -> AuthState:
    allow = Authorization(re.compile(topic), (re.compile(".*"),), frozenset({"publish"}))
    return AuthState("id", "", ttl, [allow], loop.time() + ttl)


def test_an_expired_authorization_is_asked_again_and_the_answer_decides() -> None:
    loop = FakeLoop()
    conn = Conn(loop)
    session = AuthSession(conn)
    session.start(b"s3cret")
    assert conn.paused is Pause.AUTH and len(loop.tasks) == 1
    loop.tasks[-1].finish(state(loop, ttl=1, topic="^allowed$"))
    assert conn.paused is None and conn.sent and conn.auth_state is not None
    cmd = Pub("allowed", b"x")
    assert session.authorized("PUB", "allowed", "", cmd)  # within its TTL: no query
    assert len(loop.tasks) == 1
    loop.advance(1.5)  # the TTL passes on the loop's clock, not the wall clock
    assert not session.authorized("PUB", "allowed", "", cmd)
    assert conn.paused is Pause.AUTH and list(conn.queue) == [cmd] and len(loop.tasks) == 2
    loop.tasks[-1].finish(state(loop, ttl=1, topic="^other$"))  # the new answer denies it
    assert conn.paused is None and conn.resumed == 2
    with pytest.raises(FatalClientError, match='AUTH failed for PUB on "allowed"'):
        session.authorized("PUB", "allowed", "", conn.queue.popleft())


def test_a_failing_auth_server_closes_with_auth_failed() -> None:
    loop = FakeLoop()
    conn = Conn(loop)
    session = AuthSession(conn)
    session.start(b"s3cret")
    loop.tasks[-1].finish(state(loop, ttl=1, topic=".*"))
    loop.advance(2)
    assert not session.authorized("PUB", "t", "", Pub("t", b"x"))
    from pynsqd.server.auth import AuthError

    loop.tasks[-1].finish(exc=AuthError("got response 500"))
    assert [e.wire for e in conn.fatal_errors] == [b"E_AUTH_FAILED AUTH failed"]
