"""``cluster/etcd.py``'s client against a real etcd: the watch the replicator reads the
cluster again on (the other calls are exercised by every replication test)."""

from __future__ import annotations

import asyncio

import pytest

from pynsqd.cluster.etcd import EtcdClient, WatchEvent

from ..waiting import wait_for_async
from .replication_harness import Etcd

pytestmark = pytest.mark.integration


def test_a_watch_sees_each_change_from_its_revision_and_ends_when_etcd_cancels_it(
    etcd: Etcd,
) -> None:
    async def main() -> None:
        client = EtcdClient([etcd.url])
        seen: list[WatchEvent] = []
        try:
            start = await client.put("/w/a", b"1")
            watching = asyncio.create_task(client.watch("/w/", start + 1, seen.extend))
            # Written before or after the stream opens: a watch from a revision replays them.
            await client.put("/w/a", b"2")
            await client.put("/elsewhere", b"x")
            await client.delete("/w/a")
            await client.put("/w/b", b"1")
            await wait_for_async(lambda: len(seen) >= 3, "three events", 30)
            assert seen == [
                WatchEvent("/w/a", deleted=False, version=2),
                WatchEvent("/w/a", deleted=True, version=0),
                WatchEvent("/w/b", deleted=False, version=1),
            ]
            assert not watching.done()  # a watch stays open while etcd does
            watching.cancel()
            # From a revision etcd has compacted away, etcd cancels the watch: it ends.
            latest = await client.put("/w/c", b"1")
            await client.compact(latest)
            late: list[WatchEvent] = []
            await asyncio.wait_for(client.watch("/w/", start, late.extend), 30)
            assert late == []
        finally:
            await client.close()

    asyncio.run(main())
