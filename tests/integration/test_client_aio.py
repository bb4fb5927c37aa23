"""The asyncio front end of pynsqd's client against a real pynsqd (in-process, real sockets)."""

from __future__ import annotations

import asyncio

import pytest

from pynsqd.client import AsyncConnection, NsqConnectionError, NsqError

from ..conftest import ServerThread


def test_publish_subscribe_fin_over_asyncio(nsqd: ServerThread) -> None:
    address = f"127.0.0.1:{nsqd.tcp_port}"

    async def main() -> list[bytes]:
        async with await AsyncConnection.connect(address) as pub:
            assert pub.identify_response["max_rdy_count"] == 2500
            await pub.mpub("t", [b"a", b"b", b"c"])
            await pub.pub("t", b"d")
        got: list[bytes] = []
        async with await AsyncConnection.connect(address) as sub:
            await sub.subscribe("t", "c", rdy=10)
            async for m in sub.messages():
                got.append(m.body)
                await sub.fin(m.id)
                if len(got) == 4:
                    break
        return got

    assert asyncio.run(main()) == [b"a", b"b", b"c", b"d"]
    ch = nsqd.call(lambda: nsqd.nsqd.topics["t"].channels["c"])
    assert nsqd.call(lambda: (ch.depth, len(ch.in_flight))) == (0, 0)


def test_errors_carry_nsqds_code(nsqd: ServerThread) -> None:
    async def main() -> None:
        async with await AsyncConnection.connect(f"127.0.0.1:{nsqd.tcp_port}") as c:
            await c.pub("bad!topic", b"x")

    with pytest.raises(NsqError) as info:
        asyncio.run(main())
    assert info.value.code == "E_BAD_TOPIC"

    async def refused() -> None:
        await AsyncConnection.connect("127.0.0.1:1")

    with pytest.raises(NsqConnectionError, match=r"cannot connect to nsqd 127\.0\.0\.1:1"):
        asyncio.run(refused())
