"""The fault tier's fixtures: the integration tier's (``tests/integration/conftest.py``)."""

from ..integration.conftest import etcd, network, proc_dir, small_disk, three_nodes

__all__ = ["etcd", "network", "proc_dir", "small_disk", "three_nodes"]
