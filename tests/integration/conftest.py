"""Fixtures shared by the integration tests of replicated topics."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .replication_harness import Etcd


@pytest.fixture
def etcd(tmp_path: Path) -> Iterator[Etcd]:
    """A real etcd on free 127.0.0.1 ports, in the test's directory."""
    server = Etcd(tmp_path)
    yield server
    server.stop()
