"""AUTH against an auth server, as nsqd's ``internal/auth`` does it.

The request carries ``common_name``, ``remote_ip``, ``secret`` and ``tls``: as a query string in
Go's sorted ``url.Values.Encode`` order for GET, or as the JSON of ``url.Values`` (every value an
array) for POST. The reply's authorizations are topic and channel regexes, matched unanchored
(Go's ``MatchString``); publishing checks the channel ``""``, so it needs a channel regex that
matches the empty string (kept as nsqd: README, "Differences from nsqd"). Errors here are
for the log only: the client sees
``E_AUTH_FAILED AUTH failed``.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import ssl
from dataclasses import dataclass, field
from urllib.parse import quote_plus, urlsplit, urlunsplit

import aiohttp
from yarl import URL

from ..internal import jsonbound
from ..internal.gotext import go_json
from ..options import Options
from .tls import client_context

log = logging.getLogger("pynsqd")

ACCEPT = "application/vnd.nsq; version=1.0"
PERMISSIONS = frozenset({"subscribe", "publish"})


class AuthError(Exception):
    """The auth server could not be asked, or its answer is not a valid authorization."""


@dataclass(frozen=True, slots=True)
class Authorization:
    topic: re.Pattern[str]
    channels: tuple[re.Pattern[str], ...]
    permissions: frozenset[str]

    def is_allowed(self, topic: str, channel: str) -> bool:
        if ("subscribe" if channel else "publish") not in self.permissions:
            return False
        if self.topic.search(topic) is None:
            return False
        return any(c.search(channel) is not None for c in self.channels)


@dataclass(slots=True)
class AuthState:
    identity: str
    identity_url: str
    ttl: int
    authorizations: list[Authorization]
    #: The loop's clock (``loop.time()``) after which the server is asked again.
    expires: float
    _allowed: dict[tuple[str, str], bool] = field(default_factory=dict)

    def is_expired(self, now: float) -> bool:
        """``now``: the loop's clock (a fake one in tests)."""
        return self.expires < now

    def may_read_log(self, topic: str) -> bool:
        """Reading a replayable topic's log: ``subscribe`` on the topic, for any channel."""
        return any(
            "subscribe" in a.permissions and a.topic.search(topic) is not None
            for a in self.authorizations
        )

    def is_allowed(self, topic: str, channel: str) -> bool:
        key = (topic, channel)
        ok = self._allowed.get(key)
        if ok is None:
            ok = any(a.is_allowed(topic, channel) for a in self.authorizations)
            if len(self._allowed) < 1024:
                self._allowed[key] = ok
        return ok


def auth_url(address: str) -> str:
    return address if "://" in address else f"http://{address}/auth"


def request_values(remote_ip: str, tls: bool, common_name: str, secret: bytes) -> dict[str, str]:
    """nsqd's url.Values, in sorted key order; Go strings are bytes, shown as UTF-8."""
    return {
        "common_name": common_name,
        "remote_ip": remote_ip,
        "secret": secret.decode("utf-8", "replace"),
        "tls": "true" if tls else "false",
    }


def encode_query(remote_ip: str, tls: bool, common_name: str, secret: bytes) -> str:
    """Go's ``url.Values.Encode``: keys sorted, QueryEscape (space as "+")."""
    raw: dict[str, str | bytes] = {
        "common_name": common_name,
        "remote_ip": remote_ip,
        "secret": secret,
        "tls": "true" if tls else "false",
    }
    return "&".join(f"{k}={quote_plus(v)}" for k, v in raw.items())


def encode_post_body(remote_ip: str, tls: bool, common_name: str, secret: bytes) -> bytes:
    values = request_values(remote_ip, tls, common_name, secret)
    return go_json({k: [v] for k, v in values.items()}, sort_keys=True)  # url.Values


def parse_state(body: bytes, now: float) -> AuthState:
    """Decode and validate the reply, as ``QueryAuthd`` does; raises ``AuthError``."""
    try:
        doc = jsonbound.loads(body)
    except ValueError as err:
        raise AuthError(f"invalid JSON - {err}") from None
    if not isinstance(doc, dict):
        raise AuthError("invalid JSON - not an object")
    doc = {k.lower(): v for k, v in doc.items()}  # Go matches keys case-insensitively
    ttl = doc.get("ttl") or 0
    identity = doc.get("identity") or ""
    identity_url = doc.get("identity_url") or ""
    raw_auths = doc.get("authorizations") or []
    if not isinstance(ttl, int) or isinstance(ttl, bool):
        raise AuthError("invalid JSON - ttl is not an integer")
    if not isinstance(identity, str) or not isinstance(identity_url, str):
        raise AuthError("invalid JSON - identity is not a string")
    if not isinstance(raw_auths, list):
        raise AuthError("invalid JSON - authorizations is not an array")
    if ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")
    auths: list[Authorization] = []
    for raw in raw_auths:
        if not isinstance(raw, dict):
            raise AuthError("invalid JSON - authorization is not an object")
        raw = {k.lower(): v for k, v in raw.items()}
        topic = raw.get("topic") or ""
        channels = raw.get("channels") or []
        perms = raw.get("permissions") or []
        if (
            not isinstance(topic, str)
            or not isinstance(channels, list)
            or not isinstance(perms, list)
            or not all(isinstance(c, str) for c in channels)
            or not all(isinstance(p, str) for p in perms)
        ):
            raise AuthError("invalid JSON - bad authorization")
        for p in perms:
            if p not in PERMISSIONS:
                raise AuthError(f"unknown permission {p}")
        try:
            topic_re = re.compile(topic)
            channel_res = tuple(re.compile(c) for c in channels)
        except re.error as err:
            raise AuthError(f"unable to compile regex - {err}") from None
        auths.append(Authorization(topic_re, channel_res, frozenset(perms)))
    return AuthState(identity, identity_url, ttl, auths, now + ttl)


class AuthClient:
    """Asks the --auth-http-address servers; one aiohttp session for the whole nsqd."""

    def __init__(self, opts: Options) -> None:
        self.addresses = list(opts.auth_http_addresses)
        self.method = opts.auth_http_request_method
        self.timeout = aiohttp.ClientTimeout(
            total=opts.http_client_request_timeout,
            sock_connect=opts.http_client_connect_timeout,
        )
        self._opts = opts
        self._session: aiohttp.ClientSession | None = None
        self._ssl: ssl.SSLContext | None = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._ssl = client_context(self._opts)
            self._session = aiohttp.ClientSession(
                timeout=self.timeout, connector=aiohttp.TCPConnector(ssl=self._ssl)
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def query_any(
        self, remote_ip: str, tls: bool, common_name: str, secret: bytes
    ) -> AuthState:
        """``QueryAnyAuthd``: from a random server on, the first good answer wins."""
        n = len(self.addresses)
        start = random.randrange(n)
        error = ""
        for i in range(n):
            address = self.addresses[(start + i) % n]
            try:
                return await self.query(address, remote_ip, tls, common_name, secret)
            except AuthError as err:
                msg = f"failed to auth against {address} - {err}"
                error = f"{msg}; {error}" if error else msg
        raise AuthError(error)

    async def query(
        self, address: str, remote_ip: str, tls: bool, common_name: str, secret: bytes
    ) -> AuthState:
        endpoint = auth_url(address)
        if self.method == "post":
            body: bytes | None = encode_post_body(remote_ip, tls, common_name, secret)
        else:
            body = None
            endpoint = f"{endpoint}?{encode_query(remote_ip, tls, common_name, secret)}"
        headers = {"Accept": ACCEPT}
        if body is not None:
            headers["Content-Type"] = "application/json"
        session = self._get_session()
        for _attempt in range(2):
            try:
                async with session.request(
                    "POST" if body is not None else "GET",
                    URL(endpoint, encoded=True),
                    data=body,
                    headers=headers,
                    allow_redirects=False,
                ) as resp:
                    status, reason, data = resp.status, resp.reason, await resp.read()
            except (aiohttp.ClientError, TimeoutError, ValueError) as err:
                raise AuthError(f"{type(err).__name__}: {err}") from None
            if status == 403 and not endpoint.startswith("https"):
                # nsqd's http_api client: a 403 from plain HTTP says where its HTTPS port is.
                endpoint = _https_endpoint(endpoint, data)
                continue
            if status != 200:
                raise AuthError(f"got response {status} {reason} {data[:200]!r}")
            return parse_state(data, asyncio.get_running_loop().time())
        raise AuthError("too many redirects to https")


def _https_endpoint(endpoint: str, body: bytes) -> str:
    try:
        port = int(jsonbound.loads(body)["https_port"])
    except (ValueError, KeyError, TypeError) as err:
        raise AuthError(f"got 403 without an https_port - {err}") from None
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    return urlunsplit(("https", f"{host}:{port}", parts.path, parts.query, parts.fragment))


class LogReadAuth:
    """Who may read a replayable topic's log over HTTP (``GET /topic/log``, ``/topic/offsets``):
    a secret the auth server grants ``subscribe`` on the topic. Answers are kept for their TTL
    by secret, as a TCP connection keeps its own; at most ``MAX_SECRETS`` (the oldest goes)."""

    MAX_SECRETS = 1024

    def __init__(self, client: AuthClient) -> None:
        self.client = client
        self._states: dict[str, AuthState] = {}

    async def authorize(self, topic: str, secret: str, remote_ip: str, tls: bool) -> str | None:
        """None if allowed, else nsqd's error token."""
        if not secret:
            return "AUTH_REQUIRED"
        state = self._states.get(secret)
        if state is None or state.is_expired(asyncio.get_running_loop().time()):
            try:
                state = await self.client.query_any(remote_ip, tls, "", secret.encode())
            except AuthError as err:
                log.warning("HTTP: auth for reading topic(%s) failed - %s", topic, err)
                return "AUTH_FAILED"
            if len(self._states) >= self.MAX_SECRETS:
                self._states.pop(next(iter(self._states)))
            self._states[secret] = state
        return None if state.may_read_log(topic) else "UNAUTHORIZED"
