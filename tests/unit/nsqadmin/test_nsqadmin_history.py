"""nsqadmin's chart samples (``nsqadmin/history.py``) on a fake clock."""

from __future__ import annotations

from pynsqd.nsqadmin import history
from pynsqd.nsqadmin.history import History


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_samples_are_kept_for_a_few_minutes_at_most_one_per_second() -> None:
    clock = Clock()
    h = History(clock)
    assert h.add("t", 5, 100) == [[1_000_000, 5, 100]]
    clock.now += 0.5
    assert len(h.add("t", 6, 101)) == 1  # under MIN_GAP: not a new sample
    clock.now += 0.5
    assert h.add("t", 7, 102)[-1] == [1_001_000, 7, 102]
    clock.now += history.KEEP + 0.5  # the first two are now older than KEEP
    samples = h.add("t", 8, 103)
    assert [s[1] for s in samples] == [8]


def test_keys_are_bounded_least_recently_used_first() -> None:
    clock = Clock()
    h = History(clock)
    for i in range(history.MAX_KEYS):
        h.add(f"k{i}", i, i)
    h.add("k0", 0, 0)  # k0 used again: k1 is now the least recent
    h.add("new", 1, 1)
    assert len(h) == history.MAX_KEYS
    clock.now += 2
    assert len(h.add("k0", 0, 0)) == 2  # kept its history
    assert len(h.add("k1", 0, 0)) == 1  # evicted: starts again
