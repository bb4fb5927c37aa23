"""nsqlookupd's registration DB and command line."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pynsqd.internal.flags import UsageError, parse_command_line, usage
from pynsqd.internal.version import version_string
from pynsqd.lookupd.cli import main, parse_options
from pynsqd.lookupd.options import LookupdOptions
from pynsqd.lookupd.registration_db import (
    PeerInfo,
    Producer,
    Registration,
    RegistrationDB,
    filter_by_active,
)
from pynsqd.protocol.lookup import Identify


def peer(pid: str) -> PeerInfo:
    return PeerInfo(pid, pid, Identify("host", 4150, 4151, "1.3.0"))


def test_add_remove_keeps_keys() -> None:
    db = RegistrationDB()
    a, b = peer("a:1"), peer("b:1")
    t = Registration("topic", "t", "")
    c = Registration("channel", "t", "c")
    assert db.add_producer(t, Producer(a))
    assert not db.add_producer(t, Producer(a))  # same ID: kept once
    assert db.add_producer(t, Producer(b))
    assert db.add_producer(c, Producer(a))
    assert [p.peer_info.id for p in db.find_producers("topic", "t", "")] == ["a:1", "b:1"]
    assert db.lookup_registrations("a:1") == [c, t]
    assert db.remove_producer(t, "a:1") == (True, 1)
    assert db.remove_producer(t, "a:1") == (False, 1)
    assert db.remove_producer(Registration("topic", "nope", ""), "a:1") == (False, 0)
    assert db.lookup_registrations("a:1") == [c]
    assert db.remove_producer(c, "a:1") == (True, 0)
    assert db.find_registrations("channel", "t", "*") == [c]  # the key stays
    assert db.lookup_registrations("a:1") == []
    db.remove_registration(t)
    assert db.find_registrations("topic", "*", "") == []
    assert db.lookup_registrations("b:1") == []


def test_find_registrations_wildcards_sorted() -> None:
    db = RegistrationDB()
    for key, sub in [("b", ""), ("a", ""), ("a", "y"), ("a", "x"), ("b", "z")]:
        db.add_registration(Registration("channel" if sub else "topic", key, sub))
    assert [r.key for r in db.find_registrations("topic", "*", "")] == ["a", "b"]
    assert [r.subkey for r in db.find_registrations("channel", "a", "*")] == ["x", "y"]
    assert [r.subkey for r in db.find_registrations("channel", "*", "*")] == ["x", "y", "z"]
    assert db.find_registrations("channel", "a", "q") == []


def test_tombstone_and_activity_filter() -> None:
    live, old, dead = Producer(peer("l:1")), Producer(peer("o:1")), Producer(peer("d:1"))
    old.peer_info.last_update_ns = time.time_ns() - 400 * 10**9
    dead.tombstone()
    assert dead.is_tombstoned(45)
    assert not dead.is_tombstoned(0)
    active = filter_by_active([live, old, dead], 300, 45)
    assert active == [live]
    assert filter_by_active([live, old, dead], 300, 0) == [live, dead]


# -- the command line -------------------------------------------------------------------------


def test_defaults_and_flags() -> None:
    opts = parse_options([])
    assert opts.tcp_address == "0.0.0.0:4160"
    assert opts.http_address == "0.0.0.0:4161"
    assert opts.inactive_producer_timeout == 300
    assert opts.tombstone_lifetime == 45
    assert opts.log_prefix == "[nsqlookupd] "
    assert opts.broadcast_address  # the hostname
    opts = parse_options(
        ["-tcp-address", "127.0.0.1:1", "--tombstone-lifetime=1m30s", "--broadcast-address=x"]
    )
    assert (opts.tcp_address, opts.tombstone_lifetime, opts.broadcast_address) == (
        "127.0.0.1:1",
        90,
        "x",
    )


def test_config_file_and_precedence(tmp_path: Path) -> None:
    path = tmp_path / "l.cfg"
    path.write_text('inactive_producer_timeout = "10s"\ntcp_address = "127.0.0.1:9"\n')
    opts = parse_options([f"--config={path}", "--tcp-address=127.0.0.1:8"])
    assert opts.inactive_producer_timeout == 10
    assert opts.tcp_address == "127.0.0.1:8"


def test_bad_flags() -> None:
    with pytest.raises(UsageError, match="flag provided but not defined: -mem-queue-size"):
        parse_options(["--mem-queue-size=1"])
    with pytest.raises(UsageError, match="tombstone-lifetime"):
        parse_options(["--tombstone-lifetime=5"])
    with pytest.raises(UsageError, match="--tcp-address must be"):
        parse_options(["--tcp-address=/tmp/sock"])
    with pytest.raises(UsageError, match="--http-address must be"):
        parse_options(["--http-address="])


def test_usage_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    text = usage(LookupdOptions, "nsqlookupd")
    assert text.startswith("Usage of nsqlookupd:\n")
    assert "-inactive-producer-timeout duration" in text
    assert "(default 5m0s)" in text
    assert "lookupd-tcp-address" not in text
    assert version_string("nsqlookupd").startswith("nsqlookupd v1.3.0 (built w/pynsqd-")
    assert parse_command_line(["--version"], LookupdOptions, "nsqlookupd").version
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("nsqlookupd v1.3.0 (built w/pynsqd-")
    assert main(["-h"]) == 0
    assert capsys.readouterr().out.startswith("Usage of nsqlookupd:")
    assert main(["--nope"]) == 2
    assert capsys.readouterr().err == "nsqlookupd: flag provided but not defined: -nope\n"
