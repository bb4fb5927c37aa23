"""Fixtures shared by the integration tests: etcd, network namespaces, a data directory and
log for a real nsqd process, a small real filesystem."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..disks import tmpfs
from .replication_harness import Cluster, Etcd, Network


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    """A real etcd on free 127.0.0.1 ports, in the test's directory."""
    server = Etcd(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def three_nodes(tmp_path: Path, etcd: Etcd) -> Iterator[Cluster]:
    """Three replicating pynsqd processes on one etcd, stopped after the test."""
    c = Cluster(tmp_path, etcd, 3)
    yield c
    c.stop()


@pytest.fixture
def network() -> Iterator[Network]:
    """Nodes in network namespaces of their own, for partitions (needs root and iptables)."""
    net = Network()
    yield net
    net.close()


@pytest.fixture
def proc_dir(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    data, log = tmp_path / "data", tmp_path / "nsqd.log"
    data.mkdir()
    log.touch()
    yield data, log


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB filesystem for the data directory, to fill up."""
    with tmpfs(tmp_path / "small", "size=8m") as mnt:
        yield mnt
