"""Publish with the blocking client: PUB, MPUB (one round trip for many) and DPUB (deferred).

.venv/bin/python examples/publish.py 127.0.0.1:4150
"""

import sys

from pynsqd.client import Connection

address = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:4150"

with Connection(address).connect() as conn:  # TCP, the V2 magic and IDENTIFY
    conn.pub("orders", b"order 1")  # returns once nsqd answered OK
    conn.mpub("orders", [b"order 2", b"order 3"])
    conn.dpub("orders", 60_000, b"order 4, due in a minute")
    conn.pub("orders", b"order 5")
print("published 5 messages")
