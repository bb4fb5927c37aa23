"""Damaged metadata on a real nsqd process: one line naming the file and what was done, never a
500 or a node that cannot start (issue 56, item 4: a flipped byte in ``cluster.id`` put a
control character into the storage id, and every ``GET /topic/log`` answered 500)."""

from __future__ import annotations

import json
from pathlib import Path

from pynsqd.protocol.log_record import decode_records

from ..processes import NsqdProcess


def start(tmp_path: Path) -> NsqdProcess:
    return NsqdProcess(tmp_path / "data", tmp_path / "nsqd.log", "--retention-time=1h")


def info(node: NsqdProcess) -> dict[str, object]:
    status, body = node.http("GET", "/info")
    assert status == 200, body
    doc: dict[str, object] = json.loads(body)
    return doc


def test_a_flipped_byte_in_the_storage_id_is_repaired_and_the_log_still_served(
    tmp_path: Path,
) -> None:
    (tmp_path / "data").mkdir()
    node = start(tmp_path)
    with node.connect() as c:
        c.mpub("t", [b"body-%d" % i for i in range(3)])
    before = info(node)["storage_id"]
    assert node.stop() == 0
    path = tmp_path / "data" / "cluster.id"
    raw = bytearray(path.read_bytes())
    raw[3] = 0x01  # a control character: what a header cannot carry
    path.write_bytes(bytes(raw))
    node = start(tmp_path)
    try:
        assert info(node)["storage_id"] == before
        assert f"{path} was damaged (not an id); written again from {path}.copy" in node.output()
        status, body = node.http("GET", "/topic/log?topic=t&offset=0")
        assert status == 200, body
        assert all(b"body-%d" % i in body for i in range(3)), body
    finally:
        node.stop()


def test_a_flipped_bit_in_a_closed_segment_of_a_lone_log_is_never_served(tmp_path: Path) -> None:
    """Issue 56 item 4, with no other copy: a bit flipped inside a closed segment (its index
    kept) was served by ``GET /topic/log`` as it was; now the segment is checked when read,
    the bad record and the rest of its segment are never served, and one line names the topic
    and the offsets lost."""
    (tmp_path / "data").mkdir()
    args = ("--retention-time=1h", "--max-bytes-per-file=16384")
    node = NsqdProcess(tmp_path / "data", tmp_path / "nsqd.log", *args)
    bodies = [b"body-%05d" % i for i in range(2000)]
    with node.connect() as c:
        for i in range(0, len(bodies), 100):
            c.mpub("t", bodies[i : i + 100])
    assert node.stop() == 0
    first = tmp_path / "data" / "t.log" / f"{0:020d}.log"
    assert first.with_suffix(".index").exists()
    raw = bytearray(first.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    first.write_bytes(bytes(raw))
    node = NsqdProcess(tmp_path / "data", tmp_path / "nsqd2.log", *args)
    try:
        served: dict[int, bytes] = {}
        offset = 0
        while offset < len(bodies):
            status, body = node.http("GET", f"/topic/log?topic=t&offset={offset}")
            assert status == 200, body
            records = list(decode_records(body))  # each one's checksum checked
            served.update((r.offset, r.body) for r in records)
            offset = records[-1].offset + 1
        assert all(bodies[o] == body for o, body in served.items())
        lost = sorted(set(range(len(bodies))) - set(served))
        assert lost and lost == list(range(lost[0], lost[-1] + 1)), lost
        line = f"offsets {lost[0]}-{lost[-1]} are lost here and never served"
        assert "TOPICLOG(t): segment 0 failed its check when read" in node.output()
        assert line in node.output()
    finally:
        node.stop()
