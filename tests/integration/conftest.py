"""Fixtures shared by the integration tests of replicated topics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .replication_harness import Etcd, Network


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    """A real etcd on free 127.0.0.1 ports, in the test's directory."""
    server = Etcd(tmp_path)
    yield server
    server.stop()


@pytest.fixture
def network() -> Iterator[Network]:
    """Nodes in network namespaces of their own, for partitions (needs root and iptables)."""
    net = Network()
    yield net
    net.close()
