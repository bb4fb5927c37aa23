"""DiskQueue: go-diskqueue v1.1.0's on-disk format, rolling, sync, corruption and recovery."""

from __future__ import annotations

import logging
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from pynsqd.storage import DiskQueue

MIN = 26
MAX = 1024 + 26


def make(path: Path, name: str = "t", **kw: int) -> DiskQueue:
    opts: dict[str, int] = {
        "max_bytes_per_file": 1024,
        "min_msg_size": MIN,
        "max_msg_size": MAX,
        "sync_every": 2500,
    }
    opts.update(kw)
    return DiskQueue(
        name,
        str(path),
        max_bytes_per_file=opts["max_bytes_per_file"],
        min_msg_size=opts["min_msg_size"],
        max_msg_size=opts["max_msg_size"],
        sync_every=opts["sync_every"],
        sync_timeout=2.0,
    )


def rec(i: int, size: int = 50) -> bytes:
    return f"msg-{i:06d}-".encode().ljust(size, b"x")


def frame(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def data_files(path: Path, name: str = "t") -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name.startswith(f"{name}.diskqueue.0"))


def meta(path: Path, name: str = "t") -> bytes:
    return (path / f"{name}.diskqueue.meta.dat").read_bytes()


def drain(q: DiskQueue, batch: int = 1000) -> list[bytes]:
    out: list[bytes] = []
    while True:
        got = q.read_many(batch)
        if not got:
            return out
        out.extend(got)


# -- basics -------------------------------------------------------------------------------------


def test_round_trip(tmp_path: Path) -> None:
    q = make(tmp_path)
    q.put(rec(0))
    q.put_many([rec(1), rec(2, 100)])
    assert q.depth() == 3
    assert q.read_many(2) == [rec(0), rec(1)]
    assert q.depth() == 1
    q.put(rec(3))
    assert q.read_many(10) == [rec(2, 100), rec(3)]
    assert q.depth() == 0
    assert q.read_many(10) == []
    q.close()


def test_invalid_sizes_rejected_and_nothing_written(tmp_path: Path) -> None:
    q = make(tmp_path)
    with pytest.raises(ValueError):
        q.put(b"x" * (MIN - 1))
    with pytest.raises(ValueError):
        q.put_many([rec(0), b"x" * (MAX + 1)])
    assert q.depth() == 0
    assert data_files(tmp_path) == []
    q.close()


def test_fifo_across_rolls(tmp_path: Path) -> None:
    # 54 bytes per record on disk: three fit in a 200-byte file
    q = make(tmp_path, max_bytes_per_file=200)
    expected = [rec(i) for i in range(40)]
    for r in expected[:20]:
        q.put(r)
    q.put_many(expected[20:])
    assert q.depth() == 40
    assert len(data_files(tmp_path)) == 14
    assert all((tmp_path / f).stat().st_size == 162 for f in data_files(tmp_path)[:-1])
    got: list[bytes] = []
    while len(got) < 40:
        got.extend(q.read_many(7))
    assert got == expected
    assert q.depth() == 0
    q.close()


def test_roll_rule_matches_go(tmp_path: Path) -> None:
    # roll before a write that would pass max_bytes_per_file, unless the file is still empty
    q = make(tmp_path, max_bytes_per_file=100)
    q.put(rec(0, 46))  # 50 bytes: file 0 at 50
    q.put(rec(1, 46))  # exactly 100: still file 0
    q.put(rec(2, 200))  # 204 > 100 but file 1 is empty: goes there alone
    q.put(rec(3, 26))  # file 2
    assert data_files(tmp_path) == [
        "t.diskqueue.000000.dat",
        "t.diskqueue.000001.dat",
        "t.diskqueue.000002.dat",
    ]
    assert (tmp_path / "t.diskqueue.000000.dat").read_bytes() == frame(rec(0, 46)) + frame(
        rec(1, 46)
    )
    assert (tmp_path / "t.diskqueue.000001.dat").read_bytes() == frame(rec(2, 200))
    q.close()
    assert meta(tmp_path) == b"4\n0,0\n2,30\n"


def test_put_many_rolls_in_the_middle_of_a_batch(tmp_path: Path) -> None:
    q = make(tmp_path, max_bytes_per_file=200)
    batch = [rec(i) for i in range(7)]
    q.put_many(batch)
    assert [len((tmp_path / f).read_bytes()) for f in data_files(tmp_path)] == [162, 162, 54]
    assert drain(q) == batch
    q.close()


def test_large_records_written_from_their_pieces(tmp_path: Path) -> None:
    # Records given as head + body (large messages, written with pwritev rather than joined):
    # the files hold exactly what put_many of the whole records would have written, across a
    # roll in the middle of the batch and past the 1024 buffers one pwritev takes.
    big = 2 << 20
    heads = [b"h%05d" % i for i in range(700)]
    bodies = [bytes([i % 251]) * (3000 + i) for i in range(700)]
    (tmp_path / "pieces").mkdir()
    (tmp_path / "whole").mkdir()
    pieces = make(tmp_path / "pieces", max_bytes_per_file=big, max_msg_size=big)
    pieces.put_many(heads, bodies)
    whole = make(tmp_path / "whole", max_bytes_per_file=big, max_msg_size=big)
    whole.put_many([h + b for h, b in zip(heads, bodies, strict=True)])
    files = data_files(tmp_path / "pieces")
    assert len(files) > 1 and files == data_files(tmp_path / "whole")
    first = (tmp_path / "pieces" / files[0]).stat().st_size
    assert first > 512 * (4 + 6 + 3000 + 512)  # > 1024 pieces went into the first file
    for f in files:
        assert (tmp_path / "pieces" / f).read_bytes() == (tmp_path / "whole" / f).read_bytes()
    assert pieces.depth() == 700
    assert drain(pieces) == drain(whole)
    pieces.close()
    whole.close()


@pytest.mark.parametrize("before", [0, 1, 3], ids=["empty file", "one record", "three"])
def test_framed_records_land_as_put_many_lands_them(tmp_path: Path, before: int) -> None:
    # Records given framed (``core/message.disk_frames``: size and fixed part, then body):
    # the same files, byte for byte, as put_many of the records, with rolls before the first
    # record, in the middle of the batch, and none.
    (tmp_path / "framed").mkdir()
    (tmp_path / "whole").mkdir()
    framed = make(tmp_path / "framed", max_bytes_per_file=200)
    whole = make(tmp_path / "whole", max_bytes_per_file=200)
    for q in (framed, whole):
        q.put_many([rec(i) for i in range(before)])
    for batch in ([rec(i, 30 + i) for i in range(9)], [rec(9)], [rec(10), rec(11, 120)]):
        heads = [struct.pack(">i", len(r)) + r[:26] for r in batch]
        pieces = [piece for h, r in zip(heads, batch, strict=True) for piece in (h, r[26:])]
        framed.put_framed(pieces, [len(r) for r in batch])
        whole.put_many(batch)
        files = data_files(tmp_path / "framed")
        assert files == data_files(tmp_path / "whole")
        for f in files:
            assert (tmp_path / "framed" / f).read_bytes() == (tmp_path / "whole" / f).read_bytes()
    assert len(files) > 3
    assert framed.depth() == whole.depth() == before + 12
    assert drain(framed) == drain(whole)
    with pytest.raises(ValueError, match="invalid message write size"):  # validated whole
        framed.put_framed([b"\0\0\0\x1a" + b"h" * 26, b"", b"x", b"y" * MAX], [26, MAX + 1])
    assert framed.depth() == 0
    framed.close()
    whole.close()


def test_pieces_are_validated_as_whole_records(tmp_path: Path) -> None:
    q = make(tmp_path)
    with pytest.raises(ValueError, match="invalid message write size"):
        q.put_many([b"h" * 10, b"h" * 10], [b"x" * 100, b"x" * MAX])  # the second is too big
    assert q.depth() == 0 and drain(q) == []
    q.close()


def test_interleaved_reads_and_writes_in_the_write_file(tmp_path: Path) -> None:
    q = make(tmp_path)
    for i in range(50):
        q.put(rec(i))
        assert q.read_many(5) == [rec(i)]
    q.close()


def test_records_larger_than_the_read_chunk(tmp_path: Path) -> None:
    big = 3 << 20
    q = make(tmp_path, max_msg_size=big, max_bytes_per_file=8 << 20)
    records = [os.urandom(2_500_000), rec(1), os.urandom(big)]
    q.put_many(records)
    assert q.read_many(1) == records[:1]
    assert q.read_many(10) == records[1:]
    q.close()


def test_records_straddling_read_chunks(tmp_path: Path) -> None:
    # 4.2 MB in one file: records cross the 1 MiB read chunks at many different offsets
    q = make(tmp_path, max_bytes_per_file=100 << 20)
    records = [rec(i, 26 + (i * 7) % 300) for i in range(20_000)]
    q.put_many(records)
    got: list[bytes] = []
    while len(got) < len(records):
        got.extend(q.read_many(333))
    assert got == records
    assert q.depth() == 0
    q.close()


def test_file_deleted_once_the_reader_passes_it(tmp_path: Path) -> None:
    q = make(tmp_path, max_bytes_per_file=200)
    q.put_many([rec(i) for i in range(7)])  # files 0, 1, 2
    assert q.read_many(2) == [rec(0), rec(1)]
    assert "t.diskqueue.000000.dat" in data_files(tmp_path)
    assert q.read_many(1) == [rec(2)]  # the last record of file 0
    assert data_files(tmp_path) == ["t.diskqueue.000001.dat", "t.diskqueue.000002.dat"]
    # starting a new read file syncs: the metadata already says so
    assert meta(tmp_path) == b"4\n1,0\n2,54\n"
    assert drain(q) == [rec(i) for i in range(3, 7)]
    # the write file is never deleted by the reader
    assert data_files(tmp_path) == ["t.diskqueue.000002.dat"]
    q.close()


# -- metadata and sync -------------------------------------------------------------------------


def test_metadata_byte_exact_after_sync(tmp_path: Path) -> None:
    q = make(tmp_path, max_bytes_per_file=200)
    q.put_many([rec(i) for i in range(5)])
    q.read_many(1)
    q.sync()
    assert meta(tmp_path) == b"4\n0,54\n1,108\n"
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    q.close()


def test_sync_every_counts_reads_and_writes(tmp_path: Path) -> None:
    q = make(tmp_path, sync_every=3)
    q.put(rec(0))
    q.put(rec(1))
    assert not (tmp_path / "t.diskqueue.meta.dat").exists()
    q.put(rec(2))
    assert meta(tmp_path) == b"3\n0,0\n0,162\n"
    q.read_many(2)
    assert meta(tmp_path) == b"3\n0,0\n0,162\n"
    q.read_many(1)
    assert meta(tmp_path) == b"0\n0,162\n0,162\n"
    # a batch counts as many operations and is synced once at its end
    q.put_many([rec(i) for i in range(5)])
    assert meta(tmp_path) == b"5\n0,162\n0,432\n"
    q.close()


def test_sync_every_one_syncs_each_put(tmp_path: Path) -> None:
    q = make(tmp_path, sync_every=1)
    for i in range(3):
        q.put(rec(i))
        assert meta(tmp_path) == f"{i + 1}\n0,0\n0,{54 * (i + 1)}\n".encode()
    q.close()


def test_sync_if_due_only_after_activity(tmp_path: Path) -> None:
    q = make(tmp_path)
    q.sync_if_due(1.0)
    assert not (tmp_path / "t.diskqueue.meta.dat").exists()
    q.put(rec(0))
    q.sync_if_due(2.0)
    assert meta(tmp_path) == b"1\n0,0\n0,54\n"
    (tmp_path / "t.diskqueue.meta.dat").unlink()
    q.sync_if_due(3.0)  # nothing happened since the last sync
    assert not (tmp_path / "t.diskqueue.meta.dat").exists()
    q.close()


def test_reopen_after_close_keeps_everything(tmp_path: Path) -> None:
    q = make(tmp_path, max_bytes_per_file=200)
    q.put_many([rec(i) for i in range(10)])
    assert q.read_many(4) == [rec(i) for i in range(4)]
    q.close()
    assert meta(tmp_path) == b"6\n1,54\n3,54\n"
    q = make(tmp_path, max_bytes_per_file=200)
    assert q.depth() == 6
    q.put(rec(10))
    assert drain(q, 3) == [rec(i) for i in range(4, 11)]
    assert q.depth() == 0
    q.close()
    q = make(tmp_path, max_bytes_per_file=200)
    assert q.depth() == 0
    assert q.read_many(5) == []
    q.close()


def test_missing_metadata_is_a_new_empty_queue(tmp_path: Path) -> None:
    q = make(tmp_path)
    assert q.depth() == 0
    assert q.read_many(1) == []
    q.put(rec(0))
    assert data_files(tmp_path) == ["t.diskqueue.000000.dat"]
    q.close()


def test_unclean_stop_does_not_overwrite(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    q = make(tmp_path)
    q.put_many([rec(0), rec(1)])
    q.sync()
    q.put_many([rec(2), rec(3), rec(4)])  # written, but the metadata still says writePos 108
    assert meta(tmp_path) == b"2\n0,0\n0,108\n"
    # "kill -9": no close; a new process opens the same directory
    with caplog.at_level(logging.WARNING):
        q2 = make(tmp_path)
    assert "metadata writePos 108 < file size of 270, skipping to new file" in caplog.text
    assert q2.depth() == 5
    q2.put(rec(5))
    assert data_files(tmp_path) == ["t.diskqueue.000000.dat", "t.diskqueue.000001.dat"]
    assert (tmp_path / "t.diskqueue.000000.dat").stat().st_size == 270
    assert drain(q2) == [rec(i) for i in range(6)]
    assert q2.depth() == 0
    q2.close()
    q._close_write_file()


def test_unclean_stop_with_go_metadata(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Go left 3 records in file 0 but synced its metadata after the first one only
    (tmp_path / "t.diskqueue.000000.dat").write_bytes(b"".join(frame(rec(i)) for i in range(3)))
    (tmp_path / "t.diskqueue.meta.dat").write_bytes(b"1\n0,0\n0,54\n")
    q = make(tmp_path)
    assert q.depth() == 3
    q.put(rec(3))
    assert (tmp_path / "t.diskqueue.000001.dat").read_bytes() == frame(rec(3))
    assert drain(q) == [rec(i) for i in range(4)]
    assert "data loss" not in caplog.text
    q.close()


def test_missing_metadata_with_data_files_does_not_overwrite(tmp_path: Path) -> None:
    (tmp_path / "t.diskqueue.000004.dat").write_bytes(frame(rec(0)) + frame(rec(1)))
    (tmp_path / "t.diskqueue.000005.dat").write_bytes(frame(rec(2)))
    q = make(tmp_path)
    assert q.depth() == 3
    q.put(rec(3))
    assert (tmp_path / "t.diskqueue.000006.dat").read_bytes() == frame(rec(3))
    assert drain(q) == [rec(i) for i in range(4)]
    q.close()


def test_garbage_metadata_is_logged_and_repaired(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "t.diskqueue.meta.dat").write_bytes(b"not metadata")
    q = make(tmp_path)
    assert "failed to retrieveMetaData" in caplog.text
    assert meta(tmp_path) == b"0\n0,0\n0,0\n"
    q.put(rec(0))
    assert q.read_many(5) == [rec(0)]
    q.close()


# -- corruption --------------------------------------------------------------------------------


def _three_files(tmp_path: Path) -> DiskQueue:
    q = make(tmp_path, max_bytes_per_file=200)
    q.put_many([rec(i) for i in range(9)])  # files 0, 1, 2 with three records each
    q.close()
    return make(tmp_path, max_bytes_per_file=200)


def test_corrupt_length_renames_to_bad_and_serves_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = _three_files(tmp_path)
    q.close()
    f1 = tmp_path / "t.diskqueue.000001.dat"
    data = bytearray(f1.read_bytes())
    data[54:58] = struct.pack(">i", 0x7FFFFFF0)  # second record of file 1
    f1.write_bytes(bytes(data))
    q = make(tmp_path, max_bytes_per_file=200)
    assert q.depth() == 9
    got = drain(q, 2)
    # the record before the corruption is served; the two after it are lost
    assert got == [rec(i) for i in (0, 1, 2, 3, 6, 7, 8)]
    assert (tmp_path / "t.diskqueue.000001.dat.bad").exists()
    assert "invalid message read size (2147483632)" in caplog.text
    assert "jump to next file and saving bad file as" in caplog.text
    assert "positive depth at tail (2), data loss, resetting 0..." in caplog.text
    assert q.depth() == 0
    q.put(rec(9))
    assert q.read_many(5) == [rec(9)]
    q.close()
    assert meta(tmp_path) == b"0\n3,54\n3,54\n"


def test_corrupt_write_file_moves_writes_to_a_new_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = make(tmp_path)
    q.put_many([rec(0), rec(1), rec(2)])
    q.close()
    f0 = tmp_path / "t.diskqueue.000000.dat"
    data = bytearray(f0.read_bytes())
    data[54:58] = b"\x00\x00\x00\x01"  # below min_msg_size
    f0.write_bytes(bytes(data))
    q = make(tmp_path)
    assert q.read_many(10) == [rec(0)]
    assert (tmp_path / "t.diskqueue.000000.dat.bad").exists()
    assert q.depth() == 0
    q.put(rec(3))
    assert (tmp_path / "t.diskqueue.000001.dat").read_bytes() == frame(rec(3))
    assert q.read_many(10) == [rec(3)]
    q.close()


def test_truncated_tail_of_a_completed_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = _three_files(tmp_path)
    q.close()
    f0 = tmp_path / "t.diskqueue.000000.dat"
    f0.write_bytes(f0.read_bytes()[:130])  # the third record loses its last 32 bytes
    q = make(tmp_path, max_bytes_per_file=200)
    assert drain(q) == [rec(i) for i in (0, 1, 3, 4, 5, 6, 7, 8)]
    assert (tmp_path / "t.diskqueue.000000.dat.bad").exists()
    assert "truncated record" in caplog.text
    assert q.depth() == 0
    q.close()


def test_truncated_header_of_a_completed_file(tmp_path: Path) -> None:
    q = _three_files(tmp_path)
    q.close()
    f1 = tmp_path / "t.diskqueue.000001.dat"
    f1.write_bytes(f1.read_bytes()[:110])  # two records and two bytes of a length
    q = make(tmp_path, max_bytes_per_file=200)
    assert drain(q, 1) == [rec(i) for i in (0, 1, 2, 3, 4, 6, 7, 8)]
    assert (tmp_path / "t.diskqueue.000001.dat.bad").exists()
    q.close()


def test_write_file_shorter_than_metadata(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    q = make(tmp_path)
    q.put_many([rec(0), rec(1), rec(2)])
    q.close()
    f0 = tmp_path / "t.diskqueue.000000.dat"
    f0.write_bytes(f0.read_bytes()[:120])  # lost the end of the third record
    q = make(tmp_path)
    assert "metadata writePos 162 > file size of 120, skipping to new file" in caplog.text
    q.put(rec(3))  # must not land in the hole
    assert drain(q) == [rec(0), rec(1), rec(3)]
    assert (tmp_path / "t.diskqueue.000000.dat.bad").exists()
    # depth was 3 + 1: the lost record is found out at the tail
    assert "positive depth at tail (1), data loss, resetting 0..." in caplog.text
    assert q.depth() == 0
    q.close()


def test_negative_depth_at_tail_is_reset(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "t.diskqueue.000000.dat").write_bytes(frame(rec(0)) + frame(rec(1)))
    (tmp_path / "t.diskqueue.000001.dat").write_bytes(b"")
    (tmp_path / "t.diskqueue.meta.dat").write_bytes(b"1\n0,0\n1,0\n")
    q = make(tmp_path)
    assert q.depth() == 1
    assert drain(q) == [rec(0), rec(1)]
    assert q.depth() == 0
    assert "negative depth at tail (-1), metadata corruption, resetting 0..." in caplog.text
    q.close()
    assert meta(tmp_path) == b"0\n1,0\n1,0\n"


def test_missing_read_file_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    q = _three_files(tmp_path)
    q.close()
    (tmp_path / "t.diskqueue.000000.dat").unlink()
    q = make(tmp_path, max_bytes_per_file=200)
    assert drain(q) == [rec(i) for i in range(3, 9)]
    assert q.depth() == 0
    q.close()


# -- empty, delete, write errors ---------------------------------------------------------------


def test_empty(tmp_path: Path) -> None:
    q = make(tmp_path, max_bytes_per_file=200)
    q.put_many([rec(i) for i in range(7)])
    q.read_many(1)
    q.sync()
    (tmp_path / "t.diskqueue.000002.dat.bad").write_bytes(b"evidence")
    q.empty()
    assert q.depth() == 0
    assert data_files(tmp_path) == ["t.diskqueue.000002.dat.bad"]
    assert not (tmp_path / "t.diskqueue.meta.dat").exists()
    assert q.read_many(5) == []
    q.put(rec(100))
    assert data_files(tmp_path) == ["t.diskqueue.000002.dat.bad", "t.diskqueue.000003.dat"]
    assert q.read_many(5) == [rec(100)]
    q.close()
    assert meta(tmp_path) == b"0\n3,54\n3,54\n"


def test_delete_removes_every_file_of_the_queue(tmp_path: Path) -> None:
    other = make(tmp_path, name="t:c")
    other.put(rec(0))
    other.close()
    q = make(tmp_path, max_bytes_per_file=200)
    q.put_many([rec(i) for i in range(7)])
    q.sync()
    q.delete()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "t:c.diskqueue.000000.dat",
        "t:c.diskqueue.meta.dat",
    ]
    assert q.depth() == 0
    with pytest.raises(OSError):
        q.put(rec(1))
    q.sync()
    q.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "t:c.diskqueue.000000.dat",
        "t:c.diskqueue.meta.dat",
    ]


def test_put_raises_oserror_when_the_directory_is_unusable(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # a file in place of the data directory: works even as root
    path = tmp_path / "data"
    path.write_bytes(b"")
    q = make(path)
    with pytest.raises(OSError):
        q.put(rec(0))
    with pytest.raises(OSError):
        q.put_many([rec(0), rec(1)])
    with pytest.raises(OSError):
        q.sync()
    assert q.depth() == 0
    assert q.read_many(5) == []
    assert "failed to open" in caplog.text
    # the disk comes back: the queue goes on
    path.unlink()
    path.mkdir()
    q.put(rec(2))
    assert q.depth() == 1
    assert q.read_many(5) == [rec(2)]
    q.close()


def test_put_with_sync_every_one_raises_when_metadata_cannot_be_written(tmp_path: Path) -> None:
    q = make(tmp_path, sync_every=1)
    q.put(rec(0))
    # a directory in place of the metadata file makes the rename fail
    (tmp_path / "t.diskqueue.meta.dat").unlink()
    (tmp_path / "t.diskqueue.meta.dat").mkdir()
    with pytest.raises(OSError):
        q.put(rec(1))
    assert q.depth() == 2  # the record itself is in the queue
    assert q.read_many(5) == [rec(0), rec(1)]  # read_many only logs the sync failure
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    (tmp_path / "t.diskqueue.meta.dat").rmdir()
    q.close()
    assert meta(tmp_path) == b"0\n0,108\n0,108\n"


def test_closed_queue(tmp_path: Path) -> None:
    q = make(tmp_path)
    q.put(rec(0))
    q.close()
    q.close()
    with pytest.raises(OSError):
        q.put(rec(1))
    assert q.read_many(1) == []
    assert q.depth() == 1


# -- compatibility with Go's files -------------------------------------------------------------


def _payload(i: int, body: bytes) -> bytes:
    # nsqd's message encoding: [8 ts][2 attempts][16 id][body]
    return struct.pack(">qH", 1_700_000_000_000_000_000 + i, 1) + f"{i:016x}".encode() + body


def test_reads_a_directory_as_go_diskqueue_writes_it(tmp_path: Path) -> None:
    # Go nsqd with --max-bytes-per-file=110, after PUBs of "hello", "world", 40 bytes of "a",
    # "bye", then one message consumed and a clean shutdown.
    msgs = [
        _payload(0, b"hello"),
        _payload(1, b"world"),
        _payload(2, b"a" * 40),
        _payload(3, b"bye"),
    ]
    file0 = b"".join(struct.pack(">i", len(m)) + m for m in msgs[:2])
    file1 = struct.pack(">i", len(msgs[2])) + msgs[2] + struct.pack(">i", len(msgs[3])) + msgs[3]
    assert len(file0) == 70 and len(file1) == 103
    # file 0 is not deleted yet: the reader is still in it
    (tmp_path / "topic:chan.diskqueue.000000.dat").write_bytes(file0)
    (tmp_path / "topic:chan.diskqueue.000001.dat").write_bytes(file1)
    (tmp_path / "topic:chan.diskqueue.meta.dat").write_bytes(b"3\n0,35\n1,103\n")
    q = make(tmp_path, name="topic:chan", max_bytes_per_file=110)
    assert q.depth() == 3
    assert q.read_many(1) == [msgs[1]]
    assert data_files(tmp_path, "topic:chan") == ["topic:chan.diskqueue.000001.dat"]
    assert q.read_many(10) == msgs[2:]
    assert q.depth() == 0
    q.close()
    assert meta(tmp_path, "topic:chan") == b"0\n1,103\n1,103\n"


def test_writes_exactly_what_go_diskqueue_writes(tmp_path: Path) -> None:
    msgs = [
        _payload(0, b"hello"),
        _payload(1, b"world"),
        _payload(2, b"a" * 40),
        _payload(3, b"bye"),
    ]
    q = make(tmp_path, name="topic", max_bytes_per_file=110)
    for m in msgs[:2]:
        q.put(m)
    q.put_many(msgs[2:])
    q.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "topic.diskqueue.000000.dat",
        "topic.diskqueue.000001.dat",
        "topic.diskqueue.meta.dat",
    ]
    assert (tmp_path / "topic.diskqueue.000000.dat").read_bytes() == (
        b"\x00\x00\x00\x1f" + msgs[0] + b"\x00\x00\x00\x1f" + msgs[1]
    )
    assert (tmp_path / "topic.diskqueue.000001.dat").read_bytes() == (
        b"\x00\x00\x00\x42" + msgs[2] + b"\x00\x00\x00\x1d" + msgs[3]
    )
    assert meta(tmp_path, "topic") == b"4\n0,0\n1,103\n"


# -- property: random interleavings behave like a FIFO -----------------------------------------

records_st = st.binary(min_size=4, max_size=60)


class DiskQueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="dq-")
        self.model: list[bytes] = []
        # records returned by read_many since the last sync: a crash may deliver them again
        self.unsynced_reads: list[bytes] = []
        self.max_bytes = 100
        self.sync_every = 1
        self.q: DiskQueue | None = None

    def open(self) -> DiskQueue:
        return DiskQueue(
            "p",
            self.dir,
            max_bytes_per_file=self.max_bytes,
            min_msg_size=4,
            max_msg_size=60,
            sync_every=self.sync_every,
            sync_timeout=2.0,
        )

    @initialize(max_bytes=st.integers(20, 300), sync_every=st.integers(1, 10))
    def start(self, max_bytes: int, sync_every: int) -> None:
        self.max_bytes = max_bytes
        self.sync_every = sync_every
        self.q = self.open()

    @property
    def queue(self) -> DiskQueue:
        assert self.q is not None
        return self.q

    @rule(data=records_st)
    def put(self, data: bytes) -> None:
        self.queue.put(data)
        self.model.append(data)

    @rule(batch=st.lists(records_st, max_size=12))
    def put_many(self, batch: list[bytes]) -> None:
        self.queue.put_many(batch)
        self.model.extend(batch)

    @rule(n=st.integers(0, 15))
    def read_many(self, n: int) -> None:
        got = self.queue.read_many(n)
        assert got == self.model[: len(got)]
        assert len(got) == min(n, len(self.model))
        del self.model[: len(got)]
        self.unsynced_reads.extend(got)

    @rule()
    def kill_and_restart(self) -> None:
        # kill -9: the OS closes the files, nothing is synced; written data is in the page cache
        self.queue._close_read_file()
        self.queue._close_write_file()
        self.q = self.open()
        # nothing put is lost; only records read since the last sync come back, in order
        redelivered = self.q.depth() - len(self.model)
        assert 0 <= redelivered <= len(self.unsynced_reads)
        self.model = self.unsynced_reads[len(self.unsynced_reads) - redelivered :] + self.model
        self.unsynced_reads = []

    @rule()
    def reopen(self) -> None:
        self.queue.close()
        self.q = self.open()
        self.unsynced_reads = []

    @precondition(lambda self: len(self.model) < 5)
    @rule()
    def empty(self) -> None:
        self.queue.empty()
        self.model.clear()

    @rule()
    def sync_if_due(self) -> None:
        self.queue.sync_if_due(0.0)

    @invariant()
    def depth_matches(self) -> None:
        if self.q is not None:
            if self.q._count == 0 and not self.q._need_sync:  # just synced
                self.unsynced_reads = []
            assert self.q.depth() == len(self.model)
            assert not [f for f in os.listdir(self.dir) if f.endswith(".bad")]

    def teardown(self) -> None:
        if self.q is not None:
            self.q.close()
        shutil.rmtree(self.dir, ignore_errors=True)


DiskQueueMachine.TestCase.settings = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_fifo_property = DiskQueueMachine.TestCase


# -- background sync ---------------------------------------------------------------------------


def make_bg(path: Path, name: str = "t", sync_every: int = 3, **kw: int) -> DiskQueue:
    return DiskQueue(
        name,
        str(path),
        max_bytes_per_file=kw.get("max_bytes_per_file", 1024),
        min_msg_size=MIN,
        max_msg_size=MAX,
        sync_every=sync_every,
        sync_timeout=2.0,
        background_sync=True,
    )


def test_background_sync_writes_the_snapshot_taken_at_request_time(tmp_path: Path) -> None:
    q = make_bg(tmp_path)
    q.put_many([rec(i) for i in range(3)])  # the op count asks for a sync
    q.put(rec(3))  # after the request: not in the snapshot
    q.wait_background_sync()
    assert meta(tmp_path) == b"3\n0,0\n0,162\n"
    q.sync_if_due(1.0)  # the timer hands its sync to the thread too
    q.wait_background_sync()
    assert meta(tmp_path) == b"4\n0,0\n0,216\n"
    assert q.take_sync_error() is None
    q.close()


def test_background_sync_newest_snapshot_wins(tmp_path: Path) -> None:
    q = make_bg(tmp_path, sync_every=2)
    for i in range(200):
        q.put(rec(i))
        if i % 3 == 0:
            q.read_many(1)
    q.sync_if_due(1.0)
    q.wait_background_sync()
    final = b"133\n3,702\n11,108\n"  # 200 puts (rolling every 18), 67 reads
    assert meta(tmp_path) == final
    q.close()
    assert meta(tmp_path) == final
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_close_and_delete_and_empty_wait_for_the_background_job(tmp_path: Path) -> None:
    q = make_bg(tmp_path, sync_every=2)
    q.put_many([rec(i) for i in range(4)])
    q.close()  # cancels or waits, then syncs the final state itself
    assert meta(tmp_path) == b"4\n0,0\n0,216\n"
    q = make_bg(tmp_path, sync_every=2)
    q.put_many([rec(i) for i in range(4)])
    q.delete()
    q.wait_background_sync()
    assert not (tmp_path / "t.diskqueue.meta.dat").exists()
    assert data_files(tmp_path) == []
    q = make_bg(tmp_path, sync_every=2)
    q.put_many([rec(i) for i in range(4)])
    q.empty()
    q.wait_background_sync()
    assert not (tmp_path / "t.diskqueue.meta.dat").exists()
    assert q.depth() == 0
    q.close()


def test_background_sync_survives_the_queue_rolling_and_closing_its_file(tmp_path: Path) -> None:
    q = make_bg(tmp_path, sync_every=2, max_bytes_per_file=200)
    for i in range(20):
        q.put(rec(i))  # rolls every 3 records while jobs hold duplicated descriptors
    q.wait_background_sync()
    assert drain(q) == [rec(i) for i in range(20)]
    q.close()


def test_failed_background_sync_is_logged_and_kept_for_the_owner(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = make_bg(tmp_path, sync_every=2)
    q.put(rec(0))
    (tmp_path / "t.diskqueue.meta.dat").mkdir()  # the rename of the metadata file fails
    q.put(rec(1))  # does not raise: the sync runs in the background
    q.wait_background_sync()
    err = q.take_sync_error()
    assert isinstance(err, OSError)
    assert q.take_sync_error() is None
    assert "failed to sync" in caplog.text
    (tmp_path / "t.diskqueue.meta.dat").rmdir()
    q.close()
    assert meta(tmp_path) == b"2\n0,0\n0,108\n"


def test_sync_every_one_stays_synchronous(tmp_path: Path) -> None:
    q = make_bg(tmp_path, sync_every=1)
    q.put(rec(0))
    assert meta(tmp_path) == b"1\n0,0\n0,54\n"  # no waiting: durable before put returns
    q.close()


class BackgroundDiskQueueMachine(DiskQueueMachine):
    """The same model with background syncs; a kill lands after the sync thread's last job."""

    def open(self) -> DiskQueue:
        return DiskQueue(
            "p",
            self.dir,
            max_bytes_per_file=self.max_bytes,
            min_msg_size=4,
            max_msg_size=60,
            sync_every=self.sync_every,
            sync_timeout=2.0,
            background_sync=True,
        )

    @rule()
    def kill_and_restart(self) -> None:
        self.queue.wait_background_sync()
        super().kill_and_restart()


BackgroundDiskQueueMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_fifo_property_background_sync = BackgroundDiskQueueMachine.TestCase


def test_peek_reads_across_rolls_and_moves_nothing(tmp_path: Path) -> None:
    """``GET /channel/peek``'s read: the next records, over file boundaries, while the read
    position, the depth and the files stay as they were (a restart reads the same)."""
    q = make(tmp_path, max_bytes_per_file=200)
    expected = [rec(i) for i in range(10)]
    q.put_many(expected)
    assert q.read_many(2) == expected[:2]
    files = data_files(tmp_path)
    assert q.peek(5) == expected[2:7]
    assert q.peek(100) == expected[2:]
    assert q.depth() == 8 and data_files(tmp_path) == files
    assert q.read_many(100) == expected[2:]
    assert q.peek(3) == []
    q.close()
