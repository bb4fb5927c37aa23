"""nsqadmin's memory of the nodes that answered (``nsqadmin/cluster.Cluster._down``), on a fake
clock: a node that stops answering is listed as down with its last row, and forgotten an hour
after its last answer."""

from __future__ import annotations

from pynsqd.nsqadmin.cluster import FORGET_DOWN_AFTER, Cluster
from pynsqd.nsqadmin.options import AdminOptions


def test_a_node_gone_is_down_until_forgotten() -> None:
    now = [1_000.0]
    cluster = Cluster(AdminOptions(), clock=lambda: now[0])
    row = {"node": "n1:4151", "health": "OK", "down_since": 0, "lookupd_connections": 1}
    cluster.last_rows["n1:4151"] = (now[0], row)
    assert cluster._down({"n1:4151"}, {"n1:4151": 1}, now[0]) == []  # answering: not down
    now[0] += 30
    (down,) = cluster._down(set(), {}, now[0])
    assert down["down_since"] == 1_000 and down["health"].startswith("DOWN - no answer since")
    assert down["lookupd_connections"] == 0 and row["health"] == "OK"  # the last row, copied
    now[0] = 1_000 + FORGET_DOWN_AFTER + 1
    assert cluster._down(set(), {}, now[0]) == []
    assert "n1:4151" not in cluster.last_rows
