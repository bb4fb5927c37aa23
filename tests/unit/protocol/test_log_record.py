"""The log record, one layout for the disk and the wire: whole, cut at every byte, damaged."""

from __future__ import annotations

import zlib

import pytest

from pynsqd.protocol.log_record import (
    CRC_START,
    HEADER_SIZE,
    TAIL,
    TAIL_FIXED,
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


def test_the_checksum_covers_the_offset_too() -> None:
    """Issue 56 item 4: a record whose offset was changed (a flipped bit anywhere in it) fails
    its check; before, only the bytes after the checksum were covered, and a copy could serve
    a record under another offset."""
    data = encoded(RECORDS[:1])
    for bit in range(64):
        bad = bytearray(data)
        bad[bit // 8] ^= 0x80 >> (bit % 8)
        flipped = int.from_bytes(bad[:8], "big", signed=True)
        assert check_record(bytes(bad), 0) == Damaged(0, flipped, "a checksum mismatch")


def test_every_flipped_bit_of_a_record_is_caught() -> None:
    data = encoded(RECORDS[:2])
    for bit in range(len(data) * 8):
        bad = bytearray(data)
        bad[bit // 8] ^= 0x80 >> (bit % 8)
        records, damaged = scan_records(bytes(bad))
        whole = 1 if bit >= 8 * (HEADER_SIZE + 5) else 0  # the bit is in the second record
        assert damaged is not None and records == RECORDS[:whole]


def test_a_record_written_before_its_checksum_covered_the_offset_still_reads() -> None:
    """A log written by an older pynsqd (no CRC_OFFSET flag, the checksum over the bytes after
    it only) reads as it was written: never refused, never misread."""
    r = RECORDS[0]
    tail = TAIL.pack(TAIL_FIXED + len(r.body), r.timestamp, r.id, 0, 0)
    old = (7).to_bytes(8, "big") + zlib.crc32(r.body, zlib.crc32(tail)).to_bytes(4, "big") + tail
    data = old + r.body
    assert scan_records(data) == ([r], None)
    bad = bytearray(data)
    bad[CRC_START + 4] ^= 1  # the timestamp
    assert scan_records(bytes(bad))[1] == Damaged(0, 7, "a checksum mismatch")


def test_trailing_bytes_after_whole_records() -> None:
    data = encoded(RECORDS[:2]) + b"\x00" * 10
    records, damaged = scan_records(data)
    assert records == RECORDS[:2]
    assert damaged is not None and damaged.reason == "a short record header"
