from __future__ import annotations

from tests.conftest import ServerThread


def test_pub_sub_fin(nsqd: ServerThread) -> None:
    with nsqd.connect() as pub, nsqd.connect() as sub:
        sub.sub("t", "c", rdy=10)
        pub.pub("t", b"hello")
        pub.mpub("t", [b"a", b"b"])
        msgs = sub.read_messages(3)
        assert [m.body for m in msgs] == [b"hello", b"a", b"b"]
        assert all(m.attempts == 1 for m in msgs)
        for m in msgs:
            sub.fin(m.id)
        sub.send(b"NOP\n")
        sub.expect_nothing()
