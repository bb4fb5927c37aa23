"""The etcd key layout's one decision without I/O: which changes a watch wakes the cluster's
read for (``Keys.moves_partitions``)."""

from __future__ import annotations

import pytest

from pynsqd.cluster.records import Keys

pytestmark = pytest.mark.unit

KEYS = Keys("/pynsqd/c1")


@pytest.mark.parametrize(
    ("key", "deleted", "version", "wakes"),
    [
        ("/pynsqd/c1/parts/orders/1/leader", False, 3, True),
        ("/pynsqd/c1/parts/orders/1/leader", True, 0, True),  # a lease ended
        ("/pynsqd/c1/parts/orders/2/isr", False, 7, True),
        ("/pynsqd/c1/parts/orders/2/assignment", False, 1, True),
        ("/pynsqd/c1/topics/orders", False, 2, True),
        ("/pynsqd/c1/nodes/3", False, 1, True),  # a node joined
        ("/pynsqd/c1/nodes/3", True, 0, True),  # ... or left
        ("/pynsqd/c1/nodes/3", False, 9, False),  # a beat
        ("/pynsqd/c1/parts/orders/1/channels/2", False, 40, False),  # a checkpoint
        ("/pynsqd/c1/parts/leader/1/channels/2", False, 40, False),  # a topic named so
        ("/pynsqd/c1/secret", False, 1, False),
        ("/pynsqd/c10/parts/orders/1/leader", False, 3, False),  # another cluster
        ("/pynsqd/c1", False, 1, False),
    ],
)
def test_a_watch_wakes_the_read_only_for_what_moves_a_partition(
    key: str, deleted: bool, version: int, wakes: bool
) -> None:
    assert KEYS.moves_partitions(key, deleted, version) is wakes
