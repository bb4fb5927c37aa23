"""The log record, one layout for the disk and the wire: whole, cut at every byte, damaged."""

from __future__ import annotations

import pytest

from pynsqd.protocol.log_record import (
    HEADER_SIZE,
    Damaged,
    LogRecord,
    check_record,
    decode_records,
    encode_record,
    scan_records,
)

RECORDS = [
    LogRecord(7, 1_700_000_000_000_000_000, b"0123456789abcdef", 0, 0, b"hello"),
    LogRecord(8, 1_700_000_000_000_000_001, b"0123456789abcdeg", 2, 300, b""),
    LogRecord(9, 1_700_000_000_000_000_002, b"0123456789abcdeh", 0, 0, b"x" * 5000),
]


def encoded(records: list[LogRecord]) -> bytes:
    return b"".join(
        b"".join(encode_record(r.offset, r.timestamp, r.id, r.attempts, r.defer_ms, r.body))
        for r in records
    )


def test_whole_records_round_trip() -> None:
    data = encoded(RECORDS)
    assert len(data) == sum(HEADER_SIZE + len(r.body) for r in RECORDS)
    assert scan_records(data) == (RECORDS, None)
    assert list(decode_records(memoryview(data))) == RECORDS


def test_cut_at_every_byte_gives_the_whole_records_before_the_cut() -> None:
    data = encoded(RECORDS)
    ends = [0]
    for r in RECORDS:
        ends.append(ends[-1] + HEADER_SIZE + len(r.body))
    for cut in range(len(data)):
        records, damaged = scan_records(data[:cut])
        whole = sum(1 for e in ends[1:] if e <= cut)
        assert records == RECORDS[:whole]
        if cut in ends:
            assert damaged is None
        else:
            assert isinstance(damaged, Damaged) and damaged.position == ends[whole]


def test_a_flipped_byte_is_a_checksum_mismatch_and_stops_there() -> None:
    data = bytearray(encoded(RECORDS))
    second = HEADER_SIZE + len(RECORDS[0].body)
    data[second + HEADER_SIZE - 1] ^= 0x01  # the second record's deferral field
    records, damaged = scan_records(bytes(data))
    assert records == RECORDS[:1]
    assert damaged == Damaged(second, 8, "a checksum mismatch")
    assert check_record(bytes(data), 0) == (7, second)
    with pytest.raises(ValueError, match="checksum mismatch in the record at offset 8"):
        list(decode_records(bytes(data)))
    # Without verification the layout is still checked, not the checksum.
    assert scan_records(bytes(data), verify=False)[0][1].defer_ms != 300


def test_trailing_bytes_after_whole_records() -> None:
    data = encoded(RECORDS[:2]) + b"\x00" * 10
    records, damaged = scan_records(data)
    assert records == RECORDS[:2]
    assert damaged is not None and damaged.reason == "a short record header"
