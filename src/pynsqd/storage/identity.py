"""Which storage a data directory is: a random id kept in the directory itself.

A node is known by it rather than by how it is reached (an address changes, several names reach
one node) or by ``--node-id`` (whose default, a hash of the hostname, is the same for every node
on one host): the Spark connector keys a query's log offsets by it, and the cluster tells a node
back with an empty disk (a new id) from one that kept its data (the same id). Copying a data
directory copies its id: two processes answering with one id are refused where it matters.
"""

from __future__ import annotations

import os
import secrets

from .atomic import write_atomic

__all__ = ["STORAGE_ID_FILE", "storage_id"]

#: The file naming this data directory's storage (its name predates its use outside clusters).
STORAGE_ID_FILE = "cluster.id"


def storage_id(data_path: str) -> str:
    """The directory's storage id, made (crash-safely) the first time it is asked for."""
    path = os.path.join(data_path, STORAGE_ID_FILE)
    try:
        with open(path) as f:
            value = f.read().strip()
        if value:
            return value
    except FileNotFoundError:
        pass
    value = secrets.token_hex(8)
    write_atomic(path, value.encode())
    return value
