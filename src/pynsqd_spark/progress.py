"""Source metrics from a streaming query's progress, named as Spark's Kafka source names them.

Spark's Kafka source adds ``minOffsetsBehindLatest`` and the like to
``query.lastProgress["sources"][i]["metrics"]`` through the JVM's ``ReportsSourceMetrics``.
PySpark 4.3's Python data sources have no such hook (``PythonMicroBatchStream`` does not
implement it), so the nsq source puts what it knows where Python can: the ``latestOffset`` it
reports for the progress (``reportLatestOffset``). :func:`source_metrics` turns one ``sources``
entry back into Kafka-style figures:

- log mode: ``latestOffset`` is each node's latest offset and ``endOffset`` where the batch
  ended, so per node ``latest - end`` is how far behind the query is: min, max and average
  over the nodes (``minOffsetsBehindLatest``, ``maxOffsetsBehindLatest``,
  ``avgOffsetsBehindLatest``), plus their sum (``offsetsBehindLatest``).
- channel mode: ``latestOffset`` carries the consumer's running counts (messages received,
  FIN'd, requeued, redelivered after a lost connection, reconnects, buffered) and, when the
  nodes were found through nsqlookupd, the channel's ``backlog`` (its depth on the nodes),
  returned as they are.

Pure functions over the progress JSON: no Spark needed to call them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = ["CHANNEL_COUNTS", "offsets_behind_latest", "source_metrics"]

#: the channel source's counts, in the order it reports them
CHANNEL_COUNTS = (
    "received",
    "finished",
    "requeued",
    "redelivered",
    "reconnects",
    "buffered",
    "backlog",
)


def _offset(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, str):
        return json.loads(value)
    return value


def offsets_behind_latest(latest: Mapping[str, int], end: Mapping[str, int]) -> dict[str, Any]:
    """Per-node lag of a log-mode query (``latest - end``, never negative) summed up as Kafka's
    source does; a node the batch did not reach yet counts from offset 0."""
    behind = {n: max(0, int(v) - int(end.get(n, 0))) for n, v in latest.items()}
    if not behind:
        return {}
    values = list(behind.values())
    return {
        "minOffsetsBehindLatest": min(values),
        "maxOffsetsBehindLatest": max(values),
        "avgOffsetsBehindLatest": sum(values) / len(values),
        "offsetsBehindLatest": sum(values),
        "perNode": behind,
    }


def source_metrics(source: Mapping[str, Any]) -> dict[str, Any]:
    """Kafka-style metrics of one ``query.lastProgress["sources"]`` entry of an nsq source.

    Empty when the progress holds nothing to compute them from (no batch yet, or a source that
    is not nsq's)."""
    latest = _offset(source.get("latestOffset"))
    end = _offset(source.get("endOffset"))
    if not isinstance(latest, dict):
        return {}
    if "seq" in latest:  # channel mode: batch numbers, and the consumer's counts beside
        return {k: int(latest[k]) for k in CHANNEL_COUNTS if k in latest}
    return offsets_behind_latest(latest, end if isinstance(end, dict) else {})
