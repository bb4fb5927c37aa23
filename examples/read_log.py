"""Read a replayable topic's retained log over HTTP, from an offset (or a time), records
checked against their CRCs.

    .venv/bin/python examples/read_log.py 127.0.0.1:4151
"""

import sys

from pynsqd.client import ClientOptions, read_log, topic_offsets

node = sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:4151"
opts = ClientOptions()
offsets = topic_offsets(node, "audit", opts)  # {"earliest": ..., "latest": ...}
print("earliest", offsets["earliest"], "latest", offsets["latest"])
offset = offsets["earliest"]
while offset < offsets["latest"]:
    chunk = read_log(node, "audit", offset, opts, max_messages=2)
    for rec in chunk.records:  # LogRecord: offset, timestamp (ns), id, attempts, defer_ms, body
        print(rec.offset, rec.body.decode())
    offset = chunk.next
