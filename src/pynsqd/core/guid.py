"""Message IDs: nsqd's per-topic snowflake factory (``nsqd/guid.go``).

``id = ((ts - twepoch) << 22) | (node_id << 12) | sequence`` with ``ts = UnixNano >> 20``,
sent as 16 lowercase hex characters. nsqd sleeps when a tick's 4096 sequence numbers run out;
an event loop must not sleep, so we borrow the next tick instead. IDs stay unique and increasing;
only a burst of more than ~3.9 M IDs per second per topic would run the clock ahead.
"""

from __future__ import annotations

import time

TWEPOCH = 1288834974288
_SEQ_BITS = 12
_SEQ_MAX = 1 << _SEQ_BITS
_NODE_SHIFT = 12
_TS_SHIFT = 22
_SEQ_HEX = [b"%03x" % i for i in range(_SEQ_MAX)]


class GUIDFactory:
    __slots__ = ("_last_ts", "_node", "_seq")

    def __init__(self, node_id: int) -> None:
        if not 0 <= node_id < 1024:
            raise ValueError("--node-id must be [0,1024)")
        self._node = node_id << _NODE_SHIFT
        self._last_ts = -1
        self._seq = 0

    def new_ids(self, n: int) -> list[bytes]:
        """``n`` fresh IDs in increasing order."""
        ts = time.time_ns() >> 20
        if ts > self._last_ts:
            seq = 0
        else:  # same tick, or the clock went backwards (or we borrowed ticks): never reuse
            ts = self._last_ts
            seq = self._seq + 1
        if n == 1 and seq < _SEQ_MAX:  # one PUB: skip the batch machinery
            self._last_ts = ts
            self._seq = seq
            return [b"%016x" % (((ts - TWEPOCH) << _TS_SHIFT) | self._node | seq)]
        out: list[bytes] = []
        node = self._node
        while True:
            if seq >= _SEQ_MAX:
                ts += 1
                seq = 0
            take = min(n - len(out), _SEQ_MAX - seq)
            # The sequence is exactly the last 3 hex digits: format the rest once per tick, and
            # put it before each sequence with one join and one split (two C calls, not a
            # concatenation per ID).
            prefix = b"%013x" % ((((ts - TWEPOCH) << _TS_SHIFT) | node) >> _SEQ_BITS)
            out += (prefix + (b"\n" + prefix).join(_SEQ_HEX[seq : seq + take])).split(b"\n")
            seq += take
            if len(out) == n:
                break
        self._last_ts = ts
        self._seq = seq - 1
        return out

    def new_id(self) -> bytes:
        return self.new_ids(1)[0]
