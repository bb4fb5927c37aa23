"""The replication fetch's wire format (``cluster/fetch.py``): round trips, and every malformed
message refused with a ``ValueError`` that names what is wrong (never another exception)."""

from __future__ import annotations

import contextlib
import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pynsqd.cluster.fetch import FetchAnswer, FetchRequest
from pynsqd.protocol.log_record import encode_record


def test_a_request_round_trips() -> None:
    req = FetchRequest(
        offset=7, epoch=3, last_epoch=2, replica=5, storage="ab12", wait_ms=500, max_bytes=1 << 20
    )
    assert FetchRequest.decode(req.encode()) == req


def test_an_answer_round_trips_with_its_records_verbatim() -> None:
    records = b"".join(
        b"".join(encode_record(i, 1000 + i, b"%016d" % i, 0, 0, b"body %d" % i)) for i in range(3)
    )
    answer = FetchAnswer(
        200, epoch=9, hw=2, latest=3, earliest=0, epochs=[(4, 0), (9, 2)], records=records
    )
    back = FetchAnswer.decode(answer.encode())
    assert back == answer
    assert back.records == records


def test_a_refusal_round_trips() -> None:
    answer = FetchAnswer(409, "TRUNCATE", epoch=4, truncate_to=17)
    assert FetchAnswer.decode(answer.encode()) == answer


@pytest.mark.parametrize(
    "data, named",
    [
        (b"", "unreadable"),
        (b"{", "unreadable"),
        (b"[]", "unreadable"),
        (b'{"offset": 1}', "unreadable"),
        (
            json.dumps(
                {k: 1 for k in ("offset", "epoch", "last_epoch", "replica", "wait_ms", "max_bytes")}
                | {"storage": 5}
            ).encode(),
            "storage",
        ),
        (
            json.dumps(
                {
                    k: -1
                    for k in ("offset", "epoch", "last_epoch", "replica", "wait_ms", "max_bytes")
                }
                | {"storage": "s"}
            ).encode(),
            "offset",
        ),
        (
            json.dumps(
                {
                    k: "1"
                    for k in ("offset", "epoch", "last_epoch", "replica", "wait_ms", "max_bytes")
                }
                | {"storage": "s"}
            ).encode(),
            "offset",
        ),
        (
            json.dumps(
                {
                    k: True
                    for k in ("offset", "epoch", "last_epoch", "replica", "wait_ms", "max_bytes")
                }
                | {"storage": "s"}
            ).encode(),
            "offset",
        ),
    ],
)
def test_a_malformed_request_is_refused_by_name(data: bytes, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        FetchRequest.decode(data)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x00\x00",
        struct.pack(">I", 100) + b"{}",
        struct.pack(">I", 2) + b"{}",
        struct.pack(">I", 4) + b"null",
        struct.pack(">I", 1) + b"\xff",
    ],
)
def test_a_malformed_answer_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError, match="fetch answer"):
        FetchAnswer.decode(data)


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_value_error(data: bytes) -> None:
    for decode in (FetchRequest.decode, FetchAnswer.decode):
        with contextlib.suppress(ValueError):
            decode(data)
