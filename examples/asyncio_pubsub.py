"""The asyncio client: publish, then consume with ``async for`` (one message at a time).

.venv/bin/python examples/asyncio_pubsub.py 127.0.0.1:4150
"""

import asyncio
import sys

from pynsqd.client import AsyncConnection


async def main(address: str) -> None:
    async with await AsyncConnection.connect(address) as producer:
        await producer.mpub("events", [b"event %d" % i for i in range(3)])
    async with await AsyncConnection.connect(address) as consumer:
        await consumer.subscribe("events", "printer", rdy=3)
        seen = 0
        async for msg in consumer.messages():
            print(msg.body.decode(), "attempt", msg.attempts)
            await consumer.fin(msg.id)
            seen += 1
            if seen == 3:
                break


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:4150"))
