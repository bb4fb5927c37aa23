"""A replicated node of several workers (``server/workers/members.py``): which worker a member
id names, and the members' answers made one node's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from pynsqd.server.workers.members import Members, merge_members

pytestmark = pytest.mark.unit


def members(base: int, count: int, index: int = 0) -> Members:
    return Members(SimpleNamespace(base=base, index=index), count)  # type: ignore[arg-type]


def test_a_member_id_names_its_worker_and_no_other_nodes() -> None:
    m = members(20, 3)
    assert [m.worker_of(i) for i in (20, 21, 22)] == [0, 1, 2]
    assert [m.worker_of(i) for i in (19, 23, 10, None)] == [None, None, None, None]
    wrapped = members(1022, 4)  # node ids wrap at 1024, as a worker's id does
    assert [wrapped.worker_of(i) for i in (1022, 1023, 0, 1, 2)] == [0, 1, 2, 3, None]


def copy(partition: int, holder: int, role: str = "follower") -> dict[str, Any]:
    return {"partition": partition, "node_id": holder, "role": role}


def test_the_members_answers_are_one_nodes_every_copy_named_by_its_member() -> None:
    first = {
        "topic": "t",
        "replicas": 3,
        "partitions": [copy(10, 10, "leader"), copy(21, 10)],
        "nodes": {"10": "a:1", "20": "b:1"},
    }
    second = {
        "topic": "t",
        "replicas": 3,
        "partitions": [copy(11, 11, "leader"), copy(20, 11)],
        "nodes": {"11": "a:1", "21": "b:1"},
    }
    out = merge_members([first, second])
    assert [(q["partition"], q["node_id"]) for q in out["partitions"]] == [
        (10, 10),
        (11, 11),
        (20, 11),
        (21, 10),
    ]
    assert out["nodes"] == {"10": "a:1", "11": "a:1", "20": "b:1", "21": "b:1"}
    assert out["replicas"] == 3 and first["partitions"] == [copy(10, 10, "leader"), copy(21, 10)]
    # A worker that holds nothing of the topic adds nothing; one doc is itself.
    assert merge_members([first])["partitions"] == first["partitions"]
    assert merge_members([{"topic": "t", "earliest": 0}]) == {"topic": "t", "earliest": 0}
