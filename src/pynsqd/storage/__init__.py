"""Storage backends: the go-diskqueue compatible disk queue."""

from __future__ import annotations

from .diskqueue import DiskQueue

__all__ = ["DiskQueue"]
