"""PartitionWindows: a replicated channel's windows by partition, on their own (no channel,
no loop): delivery screening, done marks, attempts, empty, and replication's changes."""

from __future__ import annotations

from pynsqd.core.message import Message
from pynsqd.core.offsets import DoneWindow, offset_id, offset_ids
from pynsqd.core.windows import PartitionWindows


def _msgs(origin: int, first: int, n: int) -> list[Message]:
    return [Message(i, b"x", 0) for i in offset_ids(origin, first, n)]


def test_screen_drops_only_what_is_no_longer_pending_here() -> None:
    w = PartitionWindows()
    w.track(1, 0)
    w.set(2, DoneWindow(0, 10))
    w[2].close()  # partition 2's state went to another node
    plain = Message(b"0" * 16, b"p", 0)  # nsqd's own kind of ID, not an offset ID
    batch = _msgs(1, 0, 3) + _msgs(2, 0, 2) + _msgs(3, 0, 1) + [plain]
    keep, stale = w.screen(batch)
    assert stale == 2
    assert keep == batch[:3] + batch[5:]  # unknown partitions and plain IDs pass


def test_mark_done_and_attempts_reach_the_partitions_window() -> None:
    w = PartitionWindows()
    w.track(1, 0)
    w.track(1, 99)  # kept: already tracked
    assert w[1].pending(5) == [(0, 5)]
    w.mark_done([offset_id(1, 0), offset_id(1, 2), offset_id(7, 1)])
    assert w[1].pending(5) == [(1, 2), (3, 5)]
    m = _msgs(1, 1, 1)[0]
    m.attempts = 3
    w.note_attempts([m], due_ms=1234)
    assert w[1].attempts == {1: 3} and w[1].due == {1: 1234}


def test_emptied_advances_the_own_partition_and_closes_adopted_ones() -> None:
    w = PartitionWindows()
    w.track(1, 0)
    w.set(2, DoneWindow(0, 10))
    w.emptied(handed=7)
    assert w[1].pending(9) == [(7, 9)]
    assert w[2].pending(None) == []


def test_merge_and_adopted_below() -> None:
    w = PartitionWindows()
    w.merge(1, DoneWindow(5))
    assert w[1].pending(8) == [(5, 8)]
    w.merge(1, DoneWindow(0, 3))
    assert w[1].pending(8) == [(0, 3), (5, 8)]
    w.adopted_below(1, 6, own=True)  # another node took [.., 6) of our own partition
    assert w[1].pending(8) == [(6, 8)]
    w.set(2, DoneWindow(0, 10))
    w.adopted_below(2, 10, own=False)
    assert w[2].pending(None) == []
    w.adopted_below(3, 4, own=True)  # not tracked yet: starts at the adoption's end
    assert w[3].pending(6) == [(4, 6)]
    assert sorted(w) == [1, 2, 3] and len(w) == 3
