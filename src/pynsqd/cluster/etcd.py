"""etcd v3 through its JSON gateway, over aiohttp: the only way pynsqd talks to etcd.

Theory of operation. etcd (Jepsen-tested: its key-value operations and multi-key transactions are
strict serializable) holds what the nodes of a cluster must agree on: who is a member, who leads
each partition, its in-sync set, each topic's replication settings. pynsqd uses five calls of
etcd's gRPC API, reached through the JSON gateway every etcd 3.4+ serves on its client URL
(``POST /v3/...``): lease grant / keepalive / revoke, range, put, delete, txn and compaction
(``compact``: the history of keys written often is dropped every few minutes), and one watch
(``watch``: a hint that the cluster's state changed, so that it is read again at once rather
than at the next tick; the state is always what a range read, never the events). Keys and values
are bytes, base64 in JSON; 64-bit numbers are JSON strings; fields that are zero or false are left
out of answers (so ``succeeded`` is absent when a txn's compares failed).

Leases are never trusted as locks (etcd's Jepsen report: locks alone are unsafe). A key's
revision is the fencing token the data path checks; see ``cluster/partition.py``.

Several ``--etcd-endpoints`` may be given: a call goes to the endpoint that answered last and moves
on to the next one when it cannot be reached. ``EtcdError`` names the endpoint and what failed.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from ..internal.waits import wait_set

__all__ = [
    "Compare",
    "EtcdClient",
    "EtcdError",
    "KeyValue",
    "TxnResult",
    "WatchEvent",
    "delete_op",
    "every",
    "prefix_end",
    "put_op",
    "range_op",
]

log = logging.getLogger("pynsqd")

#: Seconds one call may take before the next endpoint is tried.
CALL_TIMEOUT = 2.0


#: While etcd is unreachable, a reminder line this often (the first failure is said at once).
OUTAGE_REMINDER = 30.0


class EtcdError(Exception):
    """etcd could not be reached, or refused the call (the message says which and why).
    ``unreachable``: no endpoint answered (the client says so once per outage)."""

    def __init__(self, message: str, *, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


def _b64(data: str | bytes) -> str:
    raw = data.encode() if isinstance(data, str) else data
    return base64.b64encode(raw).decode()


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def prefix_end(prefix: str) -> str:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    raw = bytearray(prefix.encode())
    raw[-1] += 1
    return raw.decode()


@dataclass(frozen=True)
class KeyValue:
    key: str
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    def json(self) -> Any:
        return json.loads(self.value)

    @classmethod
    def parse(cls, kv: dict[str, Any]) -> KeyValue:
        return cls(
            _unb64(kv.get("key")).decode(),
            _unb64(kv.get("value")),
            int(kv.get("create_revision", 0)),
            int(kv.get("mod_revision", 0)),
            int(kv.get("version", 0)),
            int(kv.get("lease", 0)),
        )


@dataclass(frozen=True)
class Compare:
    """One txn condition: ``target`` (CREATE, MOD, VERSION, VALUE, LEASE) of ``key``
    ``result`` (EQUAL, NOT_EQUAL, GREATER, LESS) ``value``."""

    key: str
    target: str
    result: str
    value: int | bytes

    def encode(self) -> dict[str, Any]:
        field = {
            "CREATE": "create_revision",
            "MOD": "mod_revision",
            "VERSION": "version",
            "LEASE": "lease",
        }
        out: dict[str, Any] = {"key": _b64(self.key), "target": self.target, "result": self.result}
        if self.target == "VALUE":
            assert isinstance(self.value, bytes)
            out["value"] = _b64(self.value)
        else:
            out[field[self.target]] = str(self.value)
        return out


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int
    #: The key-values of each range operation of the branch that ran, in order.
    ranges: list[list[KeyValue]]


def put_op(key: str, value: bytes, lease: int = 0) -> dict[str, Any]:
    op: dict[str, Any] = {"key": _b64(key), "value": _b64(value)}
    if lease:
        op["lease"] = str(lease)
    return {"request_put": op}


def range_op(key: str, *, prefix: bool = False) -> dict[str, Any]:
    op = {"key": _b64(key)}
    if prefix:
        op["range_end"] = _b64(prefix_end(key))
    return {"request_range": op}


def delete_op(key: str, *, prefix: bool = False) -> dict[str, Any]:
    op = {"key": _b64(key)}
    if prefix:
        op["range_end"] = _b64(prefix_end(key))
    return {"request_delete_range": op}


class EtcdClient:
    """One small client for one cluster; every call may raise ``EtcdError``."""

    def __init__(self, endpoints: list[str]) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.endpoints = [e if "://" in e else f"http://{e}" for e in endpoints]
        self._current = 0
        self._session: aiohttp.ClientSession | None = None
        #: Since when (loop time) no endpoint has answered, and why; None: etcd answers.
        self.down_since: float | None = None
        self.down_reason = ""
        self._failed_calls = 0
        self._reminded_at = 0.0

    def _unreachable(self, reason: str) -> EtcdError:
        """No endpoint answered: said once per outage, then every ``OUTAGE_REMINDER`` s."""
        now = asyncio.get_running_loop().time()
        self._failed_calls += 1
        self.down_reason = reason
        if self.down_since is None:
            self.down_since = self._reminded_at = now
            log.warning(
                "CLUSTER: etcd unreachable (%s); commits, elections and membership wait for it "
                "(--etcd-endpoints=%s)",
                reason,
                ",".join(self.endpoints),
            )
        elif now - self._reminded_at >= OUTAGE_REMINDER:
            self._reminded_at = now
            log.warning(
                "CLUSTER: etcd still unreachable after %.0fs (%d calls failed; %s)",
                now - self.down_since,
                self._failed_calls,
                reason,
            )
        return EtcdError(f"etcd unreachable ({reason})", unreachable=True)

    def _answered(self) -> None:
        if self.down_since is not None:
            log.info(
                "CLUSTER: etcd answers again after %.1fs (%d calls failed)",
                asyncio.get_running_loop().time() - self.down_since,
                self._failed_calls,
            )
            self.down_since = None
            self._failed_calls = 0

    def outage(self) -> str | None:
        """While etcd is unreachable: for how long and why, for a client's error."""
        if self.down_since is None:
            return None
        since = asyncio.get_running_loop().time() - self.down_since
        return f"etcd unreachable for {since:.0f}s ({self.down_reason})"

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=CALL_TIMEOUT),
                connector=aiohttp.TCPConnector(limit=16, force_close=False),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` to ``/v3/<path>`` on the first endpoint that answers."""
        session = self._get_session()
        last = ""
        for i in range(len(self.endpoints)):
            index = (self._current + i) % len(self.endpoints)
            url = f"{self.endpoints[index]}/v3/{path}"
            try:
                async with session.post(url, json=body) as resp:
                    text = await resp.text()
            except (aiohttp.ClientError, TimeoutError, OSError) as err:
                last = f"{self.endpoints[index]}: {type(err).__name__} {err}".rstrip()
                continue
            self._current = index
            self._answered()
            try:
                doc = json.loads(text) if text else {}
            except ValueError:
                raise EtcdError(f"etcd {url}: not JSON ({text[:80]!r})") from None
            if resp.status != 200 or "error" in doc or ("code" in doc and "message" in doc):
                message = doc.get("message") or doc.get("error") or text[:200]
                raise EtcdError(f"etcd {path}: {message}")
            if isinstance(doc.get("result"), dict):  # streamed calls (keepalive) answer so
                doc = doc["result"]
            return dict(doc)
        raise self._unreachable(last)

    # -- leases ---------------------------------------------------------------------------

    async def grant(self, ttl: int) -> int:
        doc = await self.call("lease/grant", {"TTL": str(ttl)})
        return int(doc["ID"])

    async def keepalive(self, lease: int) -> int:
        """Refresh ``lease``; returns its TTL, 0 when it has expired (it cannot come back)."""
        doc = await self.call("lease/keepalive", {"ID": str(lease)})
        return int(doc.get("TTL", 0))

    async def revoke(self, lease: int) -> None:
        try:
            await self.call("kv/lease/revoke", {"ID": str(lease)})
        except EtcdError as err:
            if "not found" not in str(err):
                raise

    # -- keys -----------------------------------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        doc = await self.call("kv/range", {"key": _b64(key)})
        kvs = doc.get("kvs") or []
        return KeyValue.parse(kvs[0]) if kvs else None

    async def get_prefix(self, prefix: str) -> tuple[list[KeyValue], int]:
        """Every key under ``prefix``, and the store's revision they were read at."""
        doc = await self.call(
            "kv/range", {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        )
        revision = int(doc.get("header", {}).get("revision", 0))
        return [KeyValue.parse(kv) for kv in doc.get("kvs") or []], revision

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        body = put_op(key, value, lease)["request_put"]
        doc = await self.call("kv/put", body)
        return int(doc.get("header", {}).get("revision", 0))

    async def delete(self, key: str) -> None:
        await self.call("kv/deleterange", {"key": _b64(key)})

    async def compact(self, revision: int) -> None:
        """Drop the key history before ``revision`` (etcd keeps every revision until told:
        the checkpoints write one a second). Compacting to a revision already compacted is
        not an error here."""
        try:
            await self.call("kv/compaction", {"revision": str(revision)})
        except EtcdError as err:
            if "compacted" not in str(err):
                raise

    async def txn(
        self,
        compare: list[Compare],
        success: list[dict[str, Any]],
        failure: list[dict[str, Any]] | None = None,
    ) -> TxnResult:
        doc = await self.call(
            "kv/txn",
            {
                "compare": [c.encode() for c in compare],
                "success": success,
                "failure": failure or [],
            },
        )
        ranges = [
            [KeyValue.parse(kv) for kv in r["response_range"].get("kvs") or []]
            for r in doc.get("responses") or []
            if "response_range" in r
        ]
        return TxnResult(
            bool(doc.get("succeeded", False)),
            int(doc.get("header", {}).get("revision", 0)),
            ranges,
        )

    # -- watching -------------------------------------------------------------------------

    async def watch(
        self,
        prefix: str,
        start_revision: int,
        on_events: Callable[[list[WatchEvent]], None],
    ) -> None:
        """Watch the keys under ``prefix`` from ``start_revision``: ``on_events`` with each
        batch of changes, until the stream ends (etcd cancelled it: a compacted revision, a
        restart) or fails (``EtcdError``). One stream on the endpoint that answered last;
        a message longer than ``WATCH_MESSAGE_MAX`` ends it (a watch here is a hint to read
        the state again, never the state itself)."""
        session = self._get_session()
        endpoint = self.endpoints[self._current]
        body = {
            "create_request": {
                "key": _b64(prefix),
                "range_end": _b64(prefix_end(prefix)),
                "start_revision": str(start_revision),
            }
        }
        try:
            async with session.post(
                f"{endpoint}/v3/watch",
                json=body,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CALL_TIMEOUT),
            ) as resp:
                if resp.status != 200:
                    raise EtcdError(f"etcd {endpoint} watch: HTTP {resp.status}")
                buffer = bytearray()
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    while (end := buffer.find(b"\n")) >= 0:
                        line, buffer = bytes(buffer[:end]), buffer[end + 1 :]
                        if line.strip() and not _watched(line, on_events):
                            return
                    if len(buffer) > WATCH_MESSAGE_MAX:
                        raise EtcdError(f"etcd {endpoint} watch: a message over 16 MiB")
        except (aiohttp.ClientError, TimeoutError, OSError) as err:
            raise EtcdError(f"etcd {endpoint} watch: {type(err).__name__} {err}") from None

    async def wait_ready(self, timeout: float) -> None:
        """Until one endpoint answers a range (a start-up check with a clear error)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            try:
                await self.call("kv/range", {"key": _b64("/")})
                return
            except EtcdError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.1)


#: The longest watch message read (etcd sends one per batch of changes).
WATCH_MESSAGE_MAX = 16 << 20


@dataclass(frozen=True)
class WatchEvent:
    """One change a watch saw: the key, whether it was deleted, and its version (1: made)."""

    key: str
    deleted: bool
    version: int


def _watched(line: bytes, on_events: Callable[[list[WatchEvent]], None]) -> bool:
    """One message of a watch stream, its events passed on; False: the watch is over (etcd
    cancelled it, or answered an error)."""
    try:
        doc = json.loads(line)
    except ValueError:
        raise EtcdError(f"etcd watch: not JSON ({line[:80]!r})") from None
    result = doc.get("result") if isinstance(doc, dict) else None
    if not isinstance(result, dict):
        return False  # {"error": ...}
    events = [
        WatchEvent(
            _unb64(ev.get("kv", {}).get("key")).decode(errors="replace"),
            ev.get("type") == "DELETE",
            int(ev.get("kv", {}).get("version", 0)),
        )
        for ev in result.get("events") or []
    ]
    if events:
        on_events(events)
    return not result.get("canceled", False)


async def every(
    seconds: float,
    step: Callable[[], Awaitable[object]],
    doing: str,
    wake: asyncio.Event | None = None,
) -> None:
    """Run ``step`` every ``seconds`` (or as soon as ``wake`` is set) until cancelled: an etcd
    failure is one warning line (``failed to <doing>``) and the next round tries again;
    anything else is logged with its traceback, and the loop goes on."""
    while True:
        if wake is None:
            await asyncio.sleep(seconds)
        else:
            await wait_set(wake, seconds)  # not wait_for: it can swallow a cancellation
            wake.clear()
        try:
            await step()
        except EtcdError as err:
            if not err.unreachable:  # an outage is said by the client, once
                log.warning("CLUSTER: failed to %s - %s", doing, err)
        except Exception:
            log.exception("CLUSTER: internal error (%s)", doing)
