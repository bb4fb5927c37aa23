"""The data directory's storage id (``storage/identity.py``): two copies with a checksum, so a
damaged file is repaired, never served (issue 56: a flipped byte in ``cluster.id`` put a
control character into an HTTP header, and every ``GET /topic/log`` answered 500)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from pynsqd.log import LOGGER_NAME
from pynsqd.storage.identity import COPY_SUFFIX, STORAGE_ID_FILE, parse, storage_id


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def logged() -> Iterator[list[str]]:
    """What the server logs at WARNING and above (its logger does not propagate)."""
    handler = Lines()
    logger = logging.getLogger(LOGGER_NAME)
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)


def flip(path: Path, index: int, bit: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[index] ^= 1 << bit
    path.write_bytes(bytes(raw))


def test_an_id_is_made_once_and_written_twice_with_its_checksum(tmp_path: Path) -> None:
    value = storage_id(str(tmp_path))
    assert value == storage_id(str(tmp_path))
    for name in (STORAGE_ID_FILE, STORAGE_ID_FILE + COPY_SUFFIX):
        assert parse((tmp_path / name).read_bytes()) == (value, "", True)


def test_an_old_file_with_the_id_alone_is_kept_and_written_again_with_its_checksum(
    tmp_path: Path,
) -> None:
    (tmp_path / STORAGE_ID_FILE).write_text("0123456789abcdef\n")
    assert storage_id(str(tmp_path)) == "0123456789abcdef"
    assert parse((tmp_path / (STORAGE_ID_FILE + COPY_SUFFIX)).read_bytes())[2]


@pytest.mark.parametrize("damaged", [STORAGE_ID_FILE, STORAGE_ID_FILE + COPY_SUFFIX])
def test_every_bit_flipped_in_either_file_is_repaired_from_the_other(
    tmp_path: Path, damaged: str, logged: list[str]
) -> None:
    value = storage_id(str(tmp_path))
    good = (tmp_path / damaged).read_bytes()
    said = 0
    for index in range(len(good)):
        for bit in range(8):
            flip(tmp_path / damaged, index, bit)
            logged.clear()
            assert storage_id(str(tmp_path)) == value, (index, bit)
            assert (tmp_path / damaged).read_bytes() == good, (index, bit)
            # Said in one line, but for a newline turned into other white space (the same id
            # and checksum: written again silently).
            assert all(line.startswith(f"{tmp_path / damaged} was damaged") for line in logged)
            said += len(logged)
    assert said >= 8 * len(good) - 8
    assert (tmp_path / (damaged + ".damaged")).exists()


def test_both_copies_damaged_give_a_new_id_and_one_line_naming_the_way_forward(
    tmp_path: Path, logged: list[str]
) -> None:
    old = storage_id(str(tmp_path))
    (tmp_path / STORAGE_ID_FILE).write_bytes(b"01234\x0156789abcdef\n")  # a control character
    (tmp_path / (STORAGE_ID_FILE + COPY_SUFFIX)).write_bytes(b"")
    new = storage_id(str(tmp_path))
    assert new != old and parse((tmp_path / STORAGE_ID_FILE).read_bytes()) == (new, "", True)
    (line,) = logged
    assert f"{tmp_path / STORAGE_ID_FILE} is damaged (not an id)" in line
    assert f"now storage {new}" in line and "To keep the old id, stop nsqd" in line
    assert (tmp_path / (STORAGE_ID_FILE + ".damaged")).read_bytes() == b"01234\x0156789abcdef\n"


def test_an_old_file_that_is_not_an_id_is_never_used(tmp_path: Path) -> None:
    """Before the checksum, nothing checked: bytes that cannot go into a header are refused."""
    for raw in (b"\xff\xfe", b"abc def", b"x" * 65, b"\n", b"a\nb\nc"):
        assert parse(raw)[0] is None, raw
    (tmp_path / STORAGE_ID_FILE).write_bytes(b"0123456789ab\x7fdef")
    assert storage_id(str(tmp_path)).isalnum()
