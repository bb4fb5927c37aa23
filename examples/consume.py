"""Consume with the blocking client: SUB with a callback that runs on the connection's reader
thread for each chunk of messages (timestamps in ns, attempts, ids, bodies), FIN each one.

    .venv/bin/python examples/consume.py 127.0.0.1:4150 3
"""

import sys
import threading

from pynsqd.client import Connection

address = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:4150"
want = int(sys.argv[2]) if len(sys.argv) > 2 else 3
got: list[bytes] = []
done = threading.Event()


def on_messages(
    conn: Connection,
    timestamps: list[int],
    attempts: list[int],
    ids: list[bytes],
    bodies: list[bytes],
) -> None:
    for msg_id, body, attempt in zip(ids, bodies, attempts, strict=True):
        if body.startswith(b"retry") and attempt == 1:
            conn.req(msg_id, 0)  # delivered again at once, with attempts 2
            continue
        got.append(body)
        conn.fin(msg_id)
    if len(got) >= want:
        done.set()


with Connection(address).connect() as conn:
    conn.subscribe("jobs", "workers", on_messages, rdy=10)  # RDY 10: up to 10 in flight
    if not done.wait(30):
        sys.exit(f"only {len(got)} of {want} messages arrived")
for body in sorted(got):
    print(body.decode())
