"""Damaged metadata on a real nsqd process: one line naming the file and what was done, never a
500 or a node that cannot start (issue 56, item 4: a flipped byte in ``cluster.id`` put a
control character into the storage id, and every ``GET /topic/log`` answered 500)."""

from __future__ import annotations

import json
from pathlib import Path

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
