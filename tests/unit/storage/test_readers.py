"""A retained log's readers that keep their own offsets, as they report them (no I/O)."""

from __future__ import annotations

from pynsqd.storage.readers import MAX_READERS, READER_TTL, Readers


def test_a_reader_shows_its_last_commit_and_its_lag() -> None:
    readers = Readers()
    readers.commit("q", 10, now=100.0)
    readers.commit("q", 7, now=101.0)  # a batch replayed after a driver restart: back to 7
    assert readers.describe(latest=12, now=102.0) == [
        {"reader": "q", "committed": 7, "lag": 5, "updated": 101.0}
    ]
    # A log pruned past the reader (or a copy behind it): never a negative lag.
    assert readers.describe(latest=3, now=102.0)[0]["lag"] == 0


def test_readers_are_bounded_and_the_stalest_goes_first() -> None:
    readers = Readers()
    for i in range(MAX_READERS):
        readers.commit(f"r{i:03d}", i, now=float(i))
    readers.commit("r000", 1, now=500.0)  # heard from again: now the freshest
    readers.commit("new", 0, now=501.0)
    names = [r["reader"] for r in readers.describe(latest=100, now=502.0)]
    assert len(names) == MAX_READERS
    assert "new" in names and "r000" in names and "r001" not in names


def test_a_reader_not_heard_from_for_a_day_is_forgotten() -> None:
    readers = Readers()
    readers.commit("old", 1, now=0.0)
    readers.commit("live", 1, now=READER_TTL)
    assert [r["reader"] for r in readers.describe(latest=1, now=READER_TTL + 1)] == ["live"]
    assert len(readers) == 1
