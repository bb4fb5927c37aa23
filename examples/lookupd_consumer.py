"""Find the nodes that have a topic through nsqlookupd, and consume from every one of them.

.venv/bin/python examples/lookupd_consumer.py 127.0.0.1:4161 4
"""

import sys
import threading

from pynsqd.client import Connection, Reactor, lookup_producers

lookupd = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:4161"
want = int(sys.argv[2]) if len(sys.argv) > 2 else 1
nodes = lookup_producers([lookupd], "clicks")  # ["host:4150", ...]: each node's broadcast address
print(f"{len(nodes)} nodes have topic clicks")
got: list[bytes] = []
lock = threading.Lock()
done = threading.Event()


def on_messages(conn, timestamps, attempts, ids, bodies):  # type: ignore[no-untyped-def]
    with lock:
        got.extend(bodies)
        if len(got) >= want:
            done.set()
    conn.fin_many(ids)  # one write for the chunk


reactor = Reactor()  # one thread reads every connection
conns = [Connection(node).connect() for node in nodes]
for conn in conns:
    conn.subscribe("clicks", "counter", on_messages, rdy=100, reactor=reactor)
if not done.wait(30):
    sys.exit(f"only {len(got)} of {want} messages arrived")
for conn in conns:
    conn.close()
reactor.stop()
print(b" ".join(sorted(got)).decode())
