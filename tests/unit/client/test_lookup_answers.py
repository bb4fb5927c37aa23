"""The client's one reading of nsqlookupd's answers (``client/cluster.py``), which the tools,
nsq_stat, the Spark connector and nsqadmin share: addresses (IPv6 in brackets, the hostname
when no broadcast address), the V1 envelope and the old ``data`` one, junk skipped."""

from __future__ import annotations

from pynsqd.client import producer_address, producers_of, topics_of


def test_a_producers_address_for_either_port() -> None:
    p = {"broadcast_address": "10.0.0.1", "hostname": "h", "tcp_port": 4150, "http_port": 4151}
    assert producer_address(p) == "10.0.0.1:4150"
    assert producer_address(p, "http_port") == "10.0.0.1:4151"
    assert producer_address({"hostname": "h", "tcp_port": 1}) == "h:1"
    assert producer_address({"broadcast_address": "::1", "http_port": 2}, "http_port") == "[::1]:2"
    assert producer_address({"broadcast_address": "10.0.0.1"}) is None  # no port: None


def test_answers_in_either_envelope_and_junk_skipped() -> None:
    one = {"broadcast_address": "a", "tcp_port": 1}
    assert producers_of({"producers": [one, "junk", 3]}) == [one]
    assert producers_of({"data": {"producers": [one]}}) == [one]
    assert producers_of(None) == [] and producers_of({"producers": None}) == []
    assert topics_of({"topics": ["t", 7, "u"]}) == ["t", "u"]
    assert topics_of({"data": {"topics": ["t"]}}) == ["t"]
    assert topics_of([]) == []
