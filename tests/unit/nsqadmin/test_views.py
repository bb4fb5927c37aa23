"""nsqadmin's pages shaped from the nodes' /stats answers, without a server."""

from __future__ import annotations

from typing import Any

from pynsqd.nsqadmin.views import channel_view, node_view, topic_view


def _stats(depth: int, role: str, committed: int, clients: int, at: float) -> dict[str, Any]:
    return {
        "topics": [
            {
                "topic_name": "t",
                "depth": depth,
                "message_count": 5,
                "channels": [
                    {
                        "channel_name": "c",
                        "depth": depth,
                        "in_flight_count": 1,
                        "clients": [{"client_id": f"x{i}"} for i in range(clients)],
                    }
                ],
                "replication": {
                    "partitions": [
                        {
                            "partition": 1,
                            "role": role,
                            "committed": committed,
                            "latest": 9,
                            "readers": [
                                {"reader": "q", "committed": 6, "lag": committed - 6, "updated": at}
                            ],
                        }
                    ]
                },
            }
        ]
    }


STATS = {"a:1": _stats(2, "follower", 7, 1, 5.0), "b:2": _stats(3, "leader", 9, 2, 8.0)}


def test_a_topic_is_summed_over_its_nodes_and_counts_what_its_leaders_committed() -> None:
    view = topic_view("t", STATS, ["nsqd c:3: down"])
    assert view is not None
    assert view["depth"] == 5
    assert view["message_count"] == 9  # the leader's committed offset, not 5 + 5
    assert [c["node"] for c in view["copies"]] == ["b:2", "a:1"]  # the leader's copy first
    assert view["copies"][1]["bytes"] == 0  # a key an older node does not report
    assert view["channels"] == [
        {
            "channel": "c",
            "depth": 5,
            "backend_depth": 0,
            "in_flight_count": 2,
            "deferred_count": 0,
            "requeue_count": 0,
            "timeout_count": 0,
            "message_count": 0,
            "clients": 3,
            "paused": False,
        }
    ]
    assert view["errors"] == ["nsqd c:3: down"]
    # A reader that keeps its own offsets: its freshest report of each partition (a copy
    # that led once keeps an older one).
    assert [(r["node"], r["partition"], r["reader"], r["lag"]) for r in view["readers"]] == [
        ("b:2", 1, "q", 3)
    ]
    assert topic_view("other", STATS, []) is None


def test_plain_retained_logs_show_their_readers_node_by_node() -> None:
    """Each node's own log is another log: a reader of two nodes is two rows."""
    t = {"topic_name": "t", "log": {"readers": [{"reader": "q", "committed": 2, "lag": 5}]}}
    view = topic_view("t", {"a:1": {"topics": [t]}, "b:2": {"topics": [t]}}, [])
    assert view is not None
    assert view["readers"] == [
        {"reader": "q", "committed": 2, "lag": 5, "node": "a:1", "partition": ""},
        {"reader": "q", "committed": 2, "lag": 5, "node": "b:2", "partition": ""},
    ]


def test_a_channel_is_summed_and_lists_every_client_with_its_node() -> None:
    view = channel_view("t", "c", STATS, [])
    assert view is not None
    assert view["depth"] == 5
    assert [(c["node"], c["client_id"]) for c in view["clients"]] == [
        ("a:1", "x0"),
        ("b:2", "x0"),
        ("b:2", "x1"),
    ]
    assert channel_view("t", "nope", STATS, []) is None


def test_a_node_lists_its_topics_channels_and_clients() -> None:
    view = node_view("b:2", STATS["b:2"], [])
    assert [t["topic"] for t in view["topics"]] == ["t"]
    assert view["channels"][0]["clients"] == 2
    assert len(view["clients"]) == 2
