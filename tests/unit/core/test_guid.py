"""Message IDs: nsqd's layout, 16 lowercase hex, unique and increasing however asked for."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynsqd.core.guid import TWEPOCH, GUIDFactory


def test_layout_matches_nsqd() -> None:
    g = GUIDFactory(node_id=1023)
    msg_id = g.new_id()
    assert re.fullmatch(rb"[0-9a-f]{16}", msg_id)
    value = int(msg_id, 16)
    assert (value >> 12) & 0x3FF == 1023
    ts = (value >> 22) + TWEPOCH
    import time

    assert abs(ts - (time.time_ns() >> 20)) < 10_000


@pytest.mark.parametrize("bad", [-1, 1024])
def test_node_id_range(bad: int) -> None:
    with pytest.raises(ValueError, match=r"--node-id must be \[0,1024\)"):
        GUIDFactory(bad)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([1, 1, 1, 2, 17, 300, 4096, 5000]), min_size=1, max_size=60))
def test_unique_and_increasing(sizes: list[int]) -> None:
    g = GUIDFactory(7)
    ids: list[bytes] = []
    for n in sizes:
        batch = g.new_ids(n)
        assert len(batch) == n
        ids += batch
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 16 for i in ids)


def test_more_than_a_tick_of_ids_borrows_ticks_instead_of_sleeping() -> None:
    g = GUIDFactory(0)
    ids = g.new_ids(3 * 4096 + 5)
    seqs = [int(i, 16) & 0xFFF for i in ids]
    assert seqs[:3] == [seqs[0], seqs[0] + 1, seqs[0] + 2] or seqs[0] == 0
    assert len(set(ids)) == len(ids) == 3 * 4096 + 5
