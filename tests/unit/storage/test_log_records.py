"""A log's records made and checked without I/O (``storage/log_records.py``): what ``encode``
makes, ``check`` takes back as the same records, index entries and identities; a damaged or
misplaced record is refused before anything is written."""

from __future__ import annotations

import pytest

from pynsqd.core.message import Message
from pynsqd.storage import log_records
from pynsqd.storage.segment import INDEX_INTERVAL


def batch(n: int, size: int = 100) -> list[Message]:
    return [Message(b"%016d" % i, b"x" * size, 1_000 + i) for i in range(n)]


def test_what_encode_makes_check_takes_back_with_the_same_index_entries() -> None:
    msgs = batch(200, size=200)  # about 10 index intervals
    enc = log_records.encode(msgs, None, 50, 0, 0)
    assert enc.next == 250 and enc.size == len(enc.data) and enc.last_ts == 1_199
    assert len(enc.entries) >= len(enc.data) // INDEX_INTERVAL
    got = log_records.check(enc.data, 50, 0, 0, indexed=True, follow=None)
    assert (got.records, got.entries, got.last_ts) == (200, enc.entries, enc.last_ts)
    assert got.runs == [] and got.follow is None and not got.identified


def test_an_identified_batch_is_one_run_and_says_where_its_producer_goes_on() -> None:
    enc = log_records.encode(batch(3), (b"producer-1", 7), 10, 0, 0)
    got = log_records.check(enc.data, 10, 0, 0, indexed=True, follow=None)
    assert got.runs == [[b"producer-1", 7, 3, 10, 1_002]]
    assert got.follow == (b"producer-1", 10, 13)
    plain = log_records.check(enc.data, 10, 0, 0, indexed=False, follow=None)
    assert plain.identified and plain.runs == []


def test_a_damaged_or_misplaced_record_is_refused_by_name() -> None:
    data = bytearray(log_records.encode(batch(3), None, 0, 0, 0).data)
    with pytest.raises(ValueError, match="record offset 0 where 5 was expected"):
        log_records.check(bytes(data), 5, 0, 0, indexed=False, follow=None)
    data[-1] ^= 1
    with pytest.raises(ValueError, match="checksum mismatch"):
        log_records.check(bytes(data), 0, 0, 0, indexed=False, follow=None)
    with pytest.raises(ValueError, match="short record header"):
        log_records.check(bytes(data[:10]), 0, 0, 0, indexed=False, follow=None)
