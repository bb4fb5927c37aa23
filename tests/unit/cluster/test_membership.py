"""The node's lease kept apart from its beats: a registration re-write that etcd is slow to
answer (a write waits for etcd's fsync; a lease refresh does not) must not hold up the lease's
refresh, or a loaded disk expires the lease and the node steps down from every leadership
(seen in a full suite run: a 6 MB record's publish failed with "the node's etcd lease
expired")."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pynsqd.cluster.membership import Membership
from pynsqd.options import Options


class SlowWritesEtcd:
    """etcd whose writes (the beat's txn) never answer; its lease refreshes answer at once."""

    def __init__(self) -> None:
        self.keepalives = 0
        self.txns = 0
        self.refreshed = asyncio.Event()

    async def txn(self, *args: Any) -> Any:
        self.txns += 1
        await asyncio.Event().wait()  # a write stuck behind a slow fsync

    async def keepalive(self, lease: int) -> int:
        self.keepalives += 1
        if self.keepalives >= 3:
            self.refreshed.set()
        return 2

    async def close(self) -> None:
        pass


def test_a_beat_etcd_is_slow_to_answer_does_not_hold_up_the_lease(tmp_path: Path) -> None:
    async def run() -> tuple[int, int, bool]:
        # A fake clock: each wait moves it and only yields, so the loops run through their
        # TTL/3 periods without real time; decided on what happened (refreshes sent, the
        # lease's end moved). The wait_for is only a guard against a hang.
        clock = [0.0]

        async def sleep(seconds: float) -> None:
            clock[0] += seconds
            await asyncio.sleep(0)

        opts = Options(
            etcd_endpoints=["127.0.0.1:1"], data_path=str(tmp_path), node_id=1, etcd_lease_ttl=2
        )
        member = Membership(
            opts,
            str(tmp_path),
            "127.0.0.1:4151",
            "127.0.0.1:4150",
            now=lambda: clock[0],
            sleep=sleep,
        )
        etcd = SlowWritesEtcd()
        member.etcd = etcd  # type: ignore[assignment]
        member.lease, member.lease_until = 7, 1.5
        granted_until = member.lease_until
        expired: list[bool] = []
        task = asyncio.create_task(member.keepalive_loop(lambda: expired.append(True)))
        try:
            await asyncio.wait_for(etcd.refreshed.wait(), 60)
        except TimeoutError:
            pass
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        return etcd.keepalives, etcd.txns, member.lease_until > granted_until

    keepalives, txns, extended = asyncio.run(run())
    assert txns >= 1  # a beat was sent, and is still waiting
    assert keepalives >= 3, f"{keepalives} lease refreshes while a beat waited"
    assert extended  # each refresh moved the lease's end
