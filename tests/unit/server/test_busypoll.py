"""BusyPoll on a fake loop: it spins only within its budget of the last poke."""

from __future__ import annotations

from pynsqd.server.busypoll import BusyPoll

from ..fakeloop import FakeLoop


def turn(loop: FakeLoop) -> int:
    """Run one loop turn (what was ready at its start); how many callbacks ran."""
    batch, loop._soon = loop._soon, []
    for h in batch:
        h.callback()
    return len(batch)


def test_spins_until_the_budget_after_the_last_poke_then_stops() -> None:
    loop = FakeLoop()
    bp = BusyPoll(loop, 0.00005, clock=loop.time)  # type: ignore[arg-type]
    assert not bp.active and turn(loop) == 0  # idle: nothing runs
    bp.poke()
    bp.poke()  # one spinner, however many pokes
    assert bp.active and turn(loop) == 1 and turn(loop) == 1  # re-queued: the loop polls on
    loop.now += 0.00003
    bp.poke()  # more I/O: the budget starts again from now
    loop.now += 0.00003
    assert turn(loop) == 1 and bp.active
    loop.now += 0.00003
    assert turn(loop) == 1 and not bp.active  # past the budget: the loop may sleep
    assert turn(loop) == 0


def test_a_zero_budget_never_spins() -> None:
    loop = FakeLoop()
    bp = BusyPoll(loop, 0, clock=loop.time)  # type: ignore[arg-type]
    bp.poke()
    assert not bp.active and turn(loop) == 0
