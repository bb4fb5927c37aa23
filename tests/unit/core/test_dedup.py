"""Idempotent publishing's rules (``core/dedup.py``) on a fake clock, its record layout
(``protocol/log_record.py``), and the log that rebuilds the index (``storage/topiclog.py``)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pynsqd.core.dedup import Dedup, DedupError, Verdict
from pynsqd.core.message import Message
from pynsqd.protocol.log_record import (
    IDENTIFIED_NEXT,
    decode_records,
    encode_record,
    follow_after,
)
from pynsqd.storage.topiclog import TopicLog

S = 10**9
NOW = time.time_ns()


def test_a_new_producer_starts_anywhere_and_a_retry_is_a_duplicate() -> None:
    d = Dedup(100, 60 * S)
    assert d.check(b"p", 7, 2, 0, 0)[:2] == (0, -1)
    d.record(b"p", 7, 2, 0, 0)
    assert d.check(b"p", 7, 2, 1, 2)[:2] == (2, 1)
    assert d.check(b"p", 8, 2, 1, 2)[:2] == (1, 1)  # b held, c new
    assert d.check(b"p", 9, 1, 1, 2)[:2] == (0, -1)
    assert d.high(b"p") == 8 and d.high(b"q") is None


def test_a_gap_is_refused_naming_the_number_expected() -> None:
    d = Dedup(100, 60 * S)
    d.record(b"p", 7, 2, 0, 0)
    with pytest.raises(DedupError) as err:
        d.check(b"p", 10, 1, 0, 2)
    assert err.value.code == "E_BAD_SEQUENCE"
    assert "producer p sequence 10 is not the next one (expected 9" in str(err.value)


def test_a_gap_is_no_error_when_the_caller_judges_it() -> None:
    d = Dedup(100, 60 * S)
    d.record(b"p", 0, 1, 0, 0)
    assert d.check(b"p", 5, 1, 0, 1, gaps=True)[:2] == (0, -1)


def test_the_window_forgets_by_count_from_the_oldest() -> None:
    d = Dedup(3, 60 * S)
    d.record(b"p", 0, 2, 0, 0)
    d.record(b"q", 0, 1, 2, 0)
    d.record(b"p", 2, 1, 3, 0)  # offsets 0..3: offset 0 (p's 0) leaves the window
    assert len(d) == 3
    # p's sequence 0 is below the window but p is known: still a duplicate (no body check)
    assert d.check(b"p", 0, 1, 0, 4)[:2] == (1, -1)
    assert d.check(b"p", 1, 1, 0, 4)[:2] == (1, 1)
    d.record(b"r", 0, 3, 4, 0)  # p's and q's records leave the count window entirely
    assert set(d.idle) == {b"p", b"q"} and len(d) == 3
    # Their bodies are gone, not the producers (kept by time): a retry is still a duplicate,
    # a new number goes on, a gap is still refused.
    assert d.check(b"p", 0, 3, 0, 7)[:2] == (3, -1)
    assert d.check(b"p", 3, 1, 0, 7)[:2] == (0, -1)
    with pytest.raises(DedupError):
        d.check(b"q", 5, 1, 0, 7)
    d.record(b"p", 3, 1, 7, 0)  # p back in the window
    assert set(d.idle) == {b"q"} and d.check(b"p", 2, 2, 0, 8)[:2] == (2, 7)


def test_a_retry_after_a_million_other_records_is_a_duplicate_until_the_producer_expires() -> None:
    """Issue 56: a retry after more than the count window of other records was written again
    (Spark ran a failed task's retry last). The producer is kept by time (``window_ns``),
    whatever is written meanwhile, in a few dozen bytes once its records left the window."""
    d = Dedup(100_000, 3600 * S)
    d.record(b"spark-7", 0, 45_000, 0, 0)
    offset = 45_000
    for _ in range(1000):
        d.record(b"other", offset - 45_000, 1000, offset, 10 * S)
        offset += 1000
    assert len(d) == 100_000 and b"spark-7" in d.idle
    assert d.check(b"spark-7", 0, 45_000, 60 * S, offset)[:2] == (45_000, -1)
    with pytest.raises(DedupError):
        d.check(b"spark-7", 45_001, 1, 60 * S, offset)
    # An hour after its last publish, it is forgotten: a new run from any number.
    assert d.check(b"spark-7", 0, 1, 3601 * S, offset)[:2] == (0, -1)
    assert b"spark-7" not in d.producers


def test_the_window_forgets_by_time_on_a_fake_clock() -> None:
    d = Dedup(1000, 10 * S)
    d.record(b"p", 0, 1, 0, 0)
    d.record(b"q", 0, 1, 1, 5 * S)
    assert d.check(b"p", 0, 1, 9 * S, 2)[:2] == (1, 0)
    assert d.check(b"p", 0, 1, 11 * S, 2)[:2] == (0, -1)  # p's one record aged out
    assert d.check(b"q", 0, 1, 11 * S, 2)[:2] == (1, 1)
    assert set(d.producers) == {b"q"}


def test_the_least_recently_seen_producer_is_forgotten_first() -> None:
    d = Dedup(100, 60 * S, max_producers=2)
    d.record(b"p", 0, 1, 0, 0)
    d.record(b"q", 0, 1, 1, 0)
    d.record(b"p", 1, 1, 2, 0)  # p seen again: q is now the least recent
    d.record(b"r", 0, 1, 3, 0)
    assert set(d.producers) == {b"p", b"r"}
    # p lost the entries of its older run to the bound, not its place: still recognised.
    assert d.check(b"p", 0, 2, 0, 4)[:2] == (2, 2)
    assert len(d) == 2


def test_a_producer_that_comes_back_after_a_gap_in_a_rebuilt_log_starts_its_run_again() -> None:
    d = Dedup(100, 60 * S)
    d.record(b"p", 0, 1, 0, 0)
    d.record(b"p", 5, 1, 1, 0)
    assert d.high(b"p") == 5 and len(d) == 1
    assert d.check(b"p", 5, 1, 0, 2)[:2] == (1, 1)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([b"p", b"q", b"r"]), st.integers(0, 3), st.integers(1, 4)),
        max_size=40,
    )
)
def test_against_a_model_retries_are_written_once(ops: list[tuple[bytes, int, int]]) -> None:
    """Producers publish runs, often repeating part of what they sent before (a retry that
    overlaps what was written): the duplicates are exactly the numbers already written, and
    the log ends with each producer's numbers once each, in order."""
    d = Dedup(10**6, 10**18)
    written: list[tuple[bytes, int]] = []  # the log: (producer, seq) by offset
    nxt: dict[bytes, int] = {}
    for producer, back, n in ops:
        first = max(nxt.get(producer, 0) - back, 0)
        bodies = [b"%s-%d" % (producer, first + i) for i in range(n)]
        v = d.check(producer, first, n, 0, len(written))
        held = set(written)
        assert v.duplicates == sum((producer, s) in held for s in range(first, first + n))
        if v.duplicates:
            assert v.last_offset == written.index((producer, first + v.duplicates - 1))
        new = bodies[v.duplicates :]
        d.record(producer, first + v.duplicates, len(new), len(written), 0)
        written += [(producer, first + v.duplicates + i) for i in range(len(new))]
        nxt[producer] = max(nxt.get(producer, 0), first + n)
    for producer, end in nxt.items():
        starts = min(s for p, s in written if p == producer)
        assert [s for p, s in written if p == producer] == list(range(starts, end))


def test_the_record_layout_carries_the_identity_and_old_records_read_as_before() -> None:
    head, body = encode_record(3, 10, b"0" * 16, 0, 5, b"body", (b"prod", 42))
    plain_head, plain_body = encode_record(4, 11, b"1" * 16, 0, 0, b"plain")
    records = list(decode_records(head + body + plain_head + plain_body))
    assert [
        (r.offset, r.body, r.producer, r.sequence, r.defer_ms, r.attempts) for r in records
    ] == [
        (3, b"body", b"prod", 42, 5, 0),
        (4, b"plain", b"", -1, 0, 0),
    ]
    damaged = bytearray(head + body)
    damaged[46] = 200  # the producer's length runs past the record
    with pytest.raises(ValueError, match="record"):
        list(decode_records(bytes(damaged)))


def _log(path: Path, **kw: int) -> TopicLog:
    return TopicLog(
        str(path),
        segment_bytes=kw.get("segment_bytes", 1 << 20),
        sync_every=1,
        logger=logging.getLogger("test"),
    )


def _msgs(*bodies: bytes) -> list[Message]:
    return [Message(b"%016d" % i, b, NOW) for i, b in enumerate(bodies)]


def test_the_log_rebuilds_the_index_after_a_reopen_and_a_truncation(tmp_path: Path) -> None:
    log = _log(tmp_path / "t.log", segment_bytes=200)  # several segments
    for i in range(0, 20, 4):
        bodies = [b"m%d" % j for j in range(i, i + 4)]
        log.append(_msgs(*bodies), (b"p", i))
    log.append(_msgs(b"plain"))
    assert log.identities().check(b"p", 16, 2, NOW, log.latest)[:2] == (2, 17)
    assert log.segment_count > 1
    log.close()
    log = _log(tmp_path / "t.log")
    d = log.identities()
    assert d.high(b"p") == 19 and len(d) == 20
    assert d.check(b"p", 0, 1, NOW, log.latest)[:2] == (1, 0)
    # What a consumer of the log is handed has no identity in its body.
    handed: list[bytes] = []
    offset = 0
    while offset < log.latest:
        msgs, offset = log.read_messages(offset, 100)
        handed += [m.body for m in msgs]
    assert handed == [b"m%d" % j for j in range(20)] + [b"plain"]
    log.truncate(10)
    d = log.identities()
    assert d.high(b"p") == 9
    assert d.check(b"p", 10, 1, NOW, log.latest)[:2] == (0, -1)
    log.close()


def _copy(leader: TopicLog, follower: TopicLog) -> None:
    """What a replica's fetches do: the leader's records, appended as they are."""
    while follower.latest < leader.latest:
        rng = leader.read_range(follower.latest, 7, 1 << 20)
        assert rng is not None
        with open(rng.path, "rb") as f:
            f.seek(rng.start)
            follower.append_raw(f.read(rng.end - rng.start))


def test_a_producer_older_than_the_count_window_survives_a_restart_and_a_failover(
    tmp_path: Path,
) -> None:
    """Issue 56: after a start the index is read back from the count window, which no longer
    names a producer whose records all precede it: its retry was written twice after a
    kill -9. Each roll writes the producers down (``storage/producers.py``), on a replica's
    copy too, which never used its index before it leads."""
    leader = _log(tmp_path / "a", segment_bytes=2000)
    leader.set_dedup(50, 3600 * S)
    leader.append(_msgs(*[b"s%d" % i for i in range(10)]), (b"spark", 0))
    for i in range(0, 300, 3):
        leader.append(_msgs(b"o%d" % i, b"o%d" % (i + 1), b"o%d" % (i + 2)), (b"other", i))
    assert leader.segment_count > 3 and b"spark" in leader.identities().idle
    follower = _log(tmp_path / "b", segment_bytes=2000)
    follower.set_dedup(50, 3600 * S)
    _copy(leader, follower)
    for log in (leader, follower):
        path = log.directory
        log.close()  # (a kill -9 leaves the same files: the snapshots are written at rolls)
        log = _log(Path(path))
        log.set_dedup(50, 3600 * S)
        d = log.identities()
        assert d.check(b"spark", 0, 10, NOW, log.latest)[:2] == (10, -1), path
        assert d.check(b"other", 297, 3, NOW, log.latest)[:2] == (3, log.latest - 1), path
        log.truncate(5)  # a cut below every snapshot: only what the records say is left
        assert log.identities().high(b"spark") == 4
        log.close()


def test_an_mpubs_other_records_continue_its_first_s_identity() -> None:
    """Only an identified MPUB's first record carries the identity; the others follow it."""
    head, body = encode_record(7, 10, b"0" * 16, 0, 0, b"a", (b"prod", 42))
    nxt = [
        encode_record(8 + i, 10, b"%016d" % i, IDENTIFIED_NEXT, 0, b)
        for i, b in enumerate([b"b", b"c"])
    ]
    data = head + body + b"".join(h + b for h, b in nxt)
    records = list(decode_records(data))
    assert [(r.body, r.producer, r.sequence, r.attempts) for r in records] == [
        (b"a", b"prod", 42, 0),
        (b"b", b"prod", 43, 0),
        (b"c", b"prod", 44, 0),
    ]
    # Read from the middle of the run: unknown, unless the record before is given.
    tail = b"".join(h + b for h, b in nxt[1:])
    assert [(r.producer, r.sequence) for r in decode_records(tail)] == [(b"", -1)]
    follow = follow_after(records[1])
    assert [(r.producer, r.sequence) for r in decode_records(tail, follow=follow)] == [
        (b"prod", 44)
    ]


def test_a_replicas_copy_keeps_the_index_as_it_appends(tmp_path: Path) -> None:
    leader = _log(tmp_path / "a")
    follower = _log(tmp_path / "b")
    follower.identities()  # built (empty) before the copy starts
    leader.append(_msgs(b"v", b"w", b"x", b"y", b"z"), (b"p", 0))
    # Two fetches that cut the MPUB's run: the second starts with records that continue it.
    for first, count in ((0, 2), (2, 3)):
        rng = leader.read_range(first, count, 1 << 20)
        assert rng is not None
        with open(rng.path, "rb") as f:
            f.seek(rng.start)
            follower.append_raw(f.read(rng.end - rng.start))
    assert follower.identities().check(b"p", 0, 5, NOW, 5) == Verdict(5, 4, (0, 1, 2, 3, 4))
    leader.close()
    follower.close()


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([b"p", b"q", b"r"]),
            st.integers(0, 3),
            st.integers(1, 5),
            st.booleans(),  # another producer's record in between (a gap in offsets)
        ),
        max_size=50,
    ),
    st.integers(1, 15),
)
def test_against_a_reference_the_count_window_is_exact(
    ops: list[tuple[bytes, int, int, bool]], window: int
) -> None:
    """The index (segments of offsets, evicted from the oldest) answers as a plain list of
    (producer, seq, offset) cut to the newest ``window`` offsets does."""
    d = Dedup(window, 10**18)
    entries: list[tuple[bytes, int, int]] = []  # (producer, seq, offset) as appended
    latest = 0
    nxt: dict[bytes, int] = {}
    for producer, back, n, interleave in ops:
        if interleave:
            latest += 1  # a record without an identity
        floor = latest - window
        known = [s for p, s, _ in entries if p == producer]  # kept by time: never forgotten
        mine = [(s, o) for p, s, o in entries if p == producer and o >= floor]
        first = max(nxt.get(producer, 0) - back, 0)
        v = d.check(producer, first, n, 0, latest, gaps=True)
        if not known or first > max(known) + 1:
            assert v == Verdict(0, -1)
            dups = 0
            if known:
                continue  # a gap: nothing written
        else:
            high = max(known)
            base = min(s for s, _ in mine) if mine else high + 1
            dups = min(n, high - first + 1)
            where = dict(mine)
            want = tuple(where[s] for s in range(max(first, base), first + dups))
            assert v.duplicates == dups and v.offsets == want
        new = n - dups
        d.record(producer, first + dups, new, latest, 0)
        entries += [(producer, first + dups + i, latest + i) for i in range(new)]
        latest += new
        nxt[producer] = max(nxt.get(producer, 0), first + n)
        in_window = [e for e in entries if e[2] >= latest - window]
        assert len(d) == len(in_window)
