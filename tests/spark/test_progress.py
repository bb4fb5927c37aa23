"""Kafka-style source metrics read back from a query's progress (pure: no Spark needed)."""

from __future__ import annotations

import json

from pynsqd_spark.progress import offsets_behind_latest, source_metrics


def test_log_mode_lag_per_node_and_summed_up() -> None:
    src = {
        "endOffset": json.dumps({"a:4151": 70, "b:4151": 10}),
        "latestOffset": json.dumps({"a:4151": 300, "b:4151": 10, "c:4151": 5}),
    }
    m = source_metrics(src)
    assert m["perNode"] == {"a:4151": 230, "b:4151": 0, "c:4151": 5}  # c: not reached yet
    assert (m["minOffsetsBehindLatest"], m["maxOffsetsBehindLatest"]) == (0, 230)
    assert m["avgOffsetsBehindLatest"] == 235 / 3 and m["offsetsBehindLatest"] == 235


def test_a_node_behind_the_query_never_counts_negative() -> None:
    # A node that lost its log reports a latest offset below where the query already is.
    assert offsets_behind_latest({"a": 3}, {"a": 9})["maxOffsetsBehindLatest"] == 0


def test_channel_mode_counts_come_back_as_reported() -> None:
    latest = {"seq": 4, "received": 10, "finished": 8, "requeued": 1, "redelivered": 0}
    assert source_metrics({"latestOffset": json.dumps(latest), "endOffset": '{"seq": 4}'}) == {
        "received": 10,
        "finished": 8,
        "requeued": 1,
        "redelivered": 0,
    }


def test_nothing_to_compute_from() -> None:
    assert source_metrics({}) == {}
    assert source_metrics({"latestOffset": None, "endOffset": None}) == {}
    assert source_metrics({"latestOffset": "{}", "endOffset": "{}"}) == {}
    assert source_metrics({"latestOffset": {"a": 1}}) == {
        "minOffsetsBehindLatest": 1,
        "maxOffsetsBehindLatest": 1,
        "avgOffsetsBehindLatest": 1.0,
        "offsetsBehindLatest": 1,
        "perNode": {"a": 1},
    }
