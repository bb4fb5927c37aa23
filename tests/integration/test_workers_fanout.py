"""An admin call fanned out to a worker killed while it held the call (``AdminLinks.fan_out``):
asked again, over real unix sockets, of a stand-in for the worker that takes its place."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest
from aiohttp import web

from pynsqd.options import Options
from pynsqd.server.workers.admin import FAN_OUT_ATTEMPTS
from pynsqd.server.workers.peers import Workers
from pynsqd.server.workers.spec import WorkerSpec


class Node:
    """What ``Workers`` needs of its nsqd."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.opts = Options()
        self.loop = loop
        self.topics: dict[str, object] = {}


async def peer_server(path: Path, drops: int) -> tuple[web.AppRunner, list[str]]:
    """Worker 1's admin socket: the first ``drops`` calls are dropped unanswered (the worker
    killed while it held them), the next is made and answered."""
    calls: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        calls.append(request.path_qs)
        if len(calls) <= drops:
            assert request.transport is not None
            request.transport.abort()  # the connection goes, no answer
            raise asyncio.CancelledError
        return web.Response(text="OK")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.UnixSite(runner, str(path)).start()
    return runner, calls


@pytest.mark.parametrize("drops", [1, FAN_OUT_ATTEMPTS])
def test_a_call_dropped_by_a_killed_worker_is_asked_again(
    tmp_path: Path, drops: int, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> list[str]:
        runner, calls = await peer_server(tmp_path / "1.admin", drops)
        spec = WorkerSpec(
            0, 2, {}, ["", ""], [str(tmp_path / "0.admin"), str(tmp_path / "1.admin")]
        )
        workers = Workers(Node(asyncio.get_running_loop()), spec)  # type: ignore[arg-type]
        try:
            await workers.admin.fan_out("POST", "/topic/delete?topic=gone", b"")
        finally:
            await workers.stop()
            await runner.cleanup()
        return calls

    with caplog.at_level(logging.WARNING, logger="pynsqd"):
        calls = asyncio.run(main())
    asked = min(drops + 1, FAN_OUT_ATTEMPTS)
    assert calls == ["/topic/delete?topic=gone"] * asked
    again = [r for r in caplog.records if "asking again" in r.getMessage()]
    assert len(again) == asked - 1
    failed = [r for r in caplog.records if "failed" in r.getMessage()]
    # Dropped every time it was asked: logged as failed, once.
    assert len(failed) == (1 if drops >= FAN_OUT_ATTEMPTS else 0), failed
