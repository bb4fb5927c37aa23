"""Replicated topics on the HTTP port (pynsqd; ``docs/replication.md``).

- ``POST /topic/replication?topic=T[&replicas=3][&min_insync=2][&acks=all|leader]
  [&durability=fsync|pagecache]``: the topic's replication settings, kept in etcd for every node
  of the cluster (what is not given keeps its value, else the ``--replicas``/``--replication-*``
  flags). Needs ``--etcd-endpoints`` and a retained topic (``--retention-*`` or
  ``POST /topic/retention``): a 400 names what is missing.
- ``GET /topic/replication?topic=T``: the settings and the partitions of T this node holds a copy
  of: role, leader, epoch, in-sync set, committed offset and each follower's lag.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp.web_request import BaseRequest

from ..cluster.etcd import EtcdError
from ..cluster.replicator import Replicator
from ..cluster.settings import SettingsError
from ..internal.httpapi import HTTPError, Params
from ..internal.names import is_valid_name
from .host import NSQDHost


class ReplicationAPI:
    def __init__(self, nsqd: NSQDHost) -> None:
        self.nsqd = nsqd

    def _topic(self, params: Params) -> tuple[str, Replicator]:
        name = params.checked().get("topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_name(name):
            raise HTTPError(400, "INVALID_ARG_TOPIC")
        replication = self.nsqd.replication
        if replication is None:
            raise HTTPError(
                400, "REPLICATION_NEEDS_ETCD", {"reason": "nsqd runs without --etcd-endpoints"}
            )
        return name, replication

    def _describe(self, name: str, replication: Replicator) -> dict[str, Any]:
        settings = replication.settings_for(name) or replication.defaults
        return {
            "topic": name,
            **dataclasses.asdict(settings),
            "partitions": replication.describe(name),
        }

    async def get(self, request: BaseRequest, params: Params) -> Any:
        name, replication = self._topic(params)
        return self._describe(name, replication)

    async def set(self, request: BaseRequest, params: Params) -> Any:
        name, replication = self._topic(params)
        if self.nsqd.get_existing_topic(name) is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        wanted = params.get("replicas")
        if self.nsqd.topic_log(name) is None and wanted not in (None, "1"):
            raise HTTPError(
                400,
                "REPLICATION_NEEDS_RETENTION",
                {"reason": "replication copies the retained log: POST /topic/retention first"},
            )
        try:
            await replication.set_settings(name, params.get)
        except SettingsError as err:
            raise HTTPError(400, err.code, {"reason": str(err)}) from err
        except EtcdError as err:
            raise HTTPError(503, "ETCD_UNAVAILABLE", {"reason": str(err)}) from err
        return self._describe(name, replication)
