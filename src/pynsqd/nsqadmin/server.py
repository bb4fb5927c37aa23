"""nsqadmin's HTTP side: the JSON API under ``<base>/api/`` and the pages (one static app that
renders nsqadmin's URLs: ``/nodes``, ``/topics``, ``/topics/<topic>``,
``/topics/<topic>/<channel>``, ``/counter``). Served by the router nsqd and nsqlookupd share.

Actions (``POST`` with ``{"action": "pause"|"unpause"|"empty"}``, ``DELETE``) are refused with
403 ``{"message":"FORBIDDEN"}`` when ``--admin-user`` is set and the ``--acl-http-header``
of the request names none of them (the reverse proxy in front sets it)."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import os
from importlib import resources
from typing import Any

import aiohttp
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import Response
from yarl import URL

from ..internal.httpapi import HTTPError, Params
from ..internal.names import is_valid_name
from ..internal.optiontable import config_key, option_fields
from ..internal.router import Methods, Router
from ..log import LOGGER_NAME, parse_log_level
from .cluster import Cluster
from .graphite import chart_urls
from .history import History
from .options import AdminOptions

log = logging.getLogger("pynsqd.nsqadmin")

PAGES = ("", "nodes", "topics", "counter", "lookup")
ACTIONS = ("pause", "unpause", "empty")
_STATIC_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html"}
#: The largest ``PUT /config/<option>`` body (Go's).
CONFIG_BODY_MAX = 1024 * 1024
#: The largest Graphite image nsqadmin passes on (``--proxy-graphite``).
RENDER_MAX = 8 * 1024 * 1024


def _config_fields() -> dict[str, str]:
    """Config-file name -> option field."""
    return {config_key(f): f.name for f in option_fields(AdminOptions)}


def set_config(opts: AdminOptions, name: str, body: bytes) -> None:
    """``PUT /config/<name>``: the options Go's nsqadmin lets change at run time."""
    if name == "nsqlookupd_http_addresses":
        try:
            value = json.loads(body)
        except ValueError:
            raise HTTPError(400, "INVALID_VALUE") from None
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            raise HTTPError(400, "INVALID_VALUE")
        opts.lookupd_http_addresses = value
    elif name == "log_level":
        level = body.decode(errors="replace").strip().lower()
        try:
            levelno = parse_log_level(level)
        except ValueError:
            raise HTTPError(400, "INVALID_VALUE") from None
        opts.log_level = level
        logging.getLogger(LOGGER_NAME).setLevel(levelno)
    else:
        raise HTTPError(400, "INVALID_OPTION")


class AdminService(Router):
    def __init__(self, opts: AdminOptions) -> None:
        super().__init__(log)
        self.opts = opts
        self.base = "/" + opts.base_path.strip("/") if opts.base_path.strip("/") else ""
        self.cluster = Cluster(opts)
        self.history = History()
        add = self.add
        add("GET", "/ping", "plain", self._ping)
        add("GET", "/api/nodes", "v1", self._nodes)
        add("GET", "/api/topics", "v1", self._topics)
        add("POST", "/api/topics", "v1", self._create)
        add("GET", "/api/lookup", "v1", self._lookup)
        for page in PAGES:
            add("GET", f"/{page}", "raw", self._page)

    # -- routing: nsqadmin's paths, under the base path ----------------------------------

    def find_route(self, path: str) -> Methods | None:
        if self.base:
            if not path.startswith(self.base):
                return None
            path = path[len(self.base) :] or "/"
        found = self.routes.get(path)
        if found is not None:
            return found
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) in (3, 4) and parts[1] == "topics":
            return {
                "GET": ("v1", self._topic_api),
                "POST": ("v1", self._act),
                "DELETE": ("v1", self._act),
            }
        if parts[0] == "api" and len(parts) == 3 and parts[1] == "nodes":
            return {"GET": ("v1", self._node_api), "DELETE": ("v1", self._tombstone)}
        if (parts[0] == "topics" and len(parts) in (2, 3)) or (
            parts[0] == "nodes" and len(parts) == 2
        ):
            return {"GET": ("raw", self._page)}
        if parts[0] == "static" and len(parts) == 2:
            return {"GET": ("raw", self._static)}
        if path == "/render" and self.opts.graphite_url and self.opts.proxy_graphite:
            return {"GET": ("raw", self._render)}
        if parts[0] == "config" and len(parts) == 2:
            return {"GET": ("v1", self._config), "PUT": ("v1", self._config)}
        return None

    def _names(self, request: BaseRequest) -> tuple[str, str]:
        parts = request.path[len(self.base) :].strip("/").split("/")
        topic = parts[2] if len(parts) > 2 else ""
        channel = parts[3] if len(parts) > 3 else ""
        if not is_valid_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        if channel and not is_valid_name(channel):
            raise HTTPError(400, "INVALID_CHANNEL")
        return topic, channel

    # -- API -------------------------------------------------------------------------------

    async def _ping(self, request: BaseRequest, params: Params) -> Any:
        return "OK"

    async def _nodes(self, request: BaseRequest, params: Params) -> Any:
        return await self.cluster.node_rows()

    async def _node_api(self, request: BaseRequest, params: Params) -> Any:
        name = request.path.rsplit("/", 1)[1]
        found = await self.cluster.node(name)
        if found is None:
            raise HTTPError(404, "NODE_NOT_FOUND")
        return found

    async def _topics(self, request: BaseRequest, params: Params) -> Any:
        doc = await self.cluster.topics()
        depth = sum(t["depth"] for t in doc["topics"])
        count = sum(t["message_count"] for t in doc["topics"])
        doc["history"] = self.history.add("", depth, count)
        doc["graphite"] = chart_urls(self.opts, self.base)
        return doc

    async def _topic_api(self, request: BaseRequest, params: Params) -> Any:
        topic, channel = self._names(request)
        if channel:
            found = await self.cluster.channel(topic, channel)
            if found is not None:
                depth = found["depth"]
        else:
            found = await self.cluster.topic(topic)
            if found is not None:  # the whole backlog: the topic's own and its channels'
                depth = found["depth"] + sum(c["depth"] for c in found["channels"])
        if found is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND" if channel else "TOPIC_NOT_FOUND")
        # What waits in it, on the nodes that have it (a topic: not yet handed to a channel).
        nodes = [n["node"] for n in found["nodes"]]
        found["messages"], more = await self.cluster.peek(topic, channel, nodes)
        found["errors"] = found.get("errors", []) + more
        key = f"{topic}/{channel}" if channel else topic
        found["history"] = self.history.add(key, depth, found["message_count"])
        found["graphite"] = chart_urls(self.opts, self.base, topic, channel)
        return found

    async def _create(self, request: BaseRequest, params: Params) -> Any:
        """Go's ``POST /api/topics`` ``{"topic": ..., "channel": ...}``: the create form."""
        user = self._admin(request)
        try:
            body = json.loads(await request.content.read(CONFIG_BODY_MAX) or b"{}")
        except ValueError:
            raise HTTPError(400, "INVALID_BODY") from None
        topic = body.get("topic") if isinstance(body, dict) else None
        channel = (body.get("channel") or "") if isinstance(body, dict) else ""
        if not isinstance(topic, str) or not is_valid_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        if not isinstance(channel, str) or (channel and not is_valid_name(channel)):
            raise HTTPError(400, "INVALID_CHANNEL")
        errors = await self.cluster.create(topic, channel)
        await self._acted("create", topic, channel, user, errors)
        return None

    async def _lookup(self, request: BaseRequest, params: Params) -> Any:
        return await self.cluster.lookup()

    def _admin(self, request: BaseRequest) -> str:
        """The user making an action; 403 when --admin-user names others only."""
        user = request.headers.get(self.opts.acl_http_header, "")
        if self.opts.admin_users and user not in self.opts.admin_users:
            log.warning(
                "refused %s %s for user %r (not an --admin-user)",
                request.method,
                request.path,
                user,
            )
            raise HTTPError(403, "FORBIDDEN")
        return user

    async def _tombstone(self, request: BaseRequest, params: Params) -> Any:
        user = self._admin(request)
        node = request.path.rsplit("/", 1)[1]
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            raise HTTPError(400, "INVALID_BODY") from None
        topic = body.get("topic") if isinstance(body, dict) else None
        if not isinstance(topic, str) or not is_valid_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        errors = await self.cluster.tombstone(node, topic)
        log.info("tombstone topic %s on node %s: %s", topic, node, errors or "ok")
        await self.cluster.notify(
            {"action": "tombstone_topic_producer", "topic": topic, "node": node, "user": user}
        )
        if errors:
            raise HTTPError(502, "; ".join(errors))
        return None

    async def _act(self, request: BaseRequest, params: Params) -> Any:
        topic, channel = self._names(request)
        user = self._admin(request)
        action: str
        if request.method == "DELETE":
            action = "delete"
        else:
            try:
                body = json.loads(await request.read() or b"{}")
            except ValueError:
                raise HTTPError(400, "INVALID_BODY") from None
            given = body.get("action") if isinstance(body, dict) else None
            if given not in ACTIONS:
                raise HTTPError(400, "INVALID_ACTION")
            action = str(given)
        errors = await self.cluster.act(topic, channel, action)
        await self._acted(action, topic, channel, user, errors)
        return None

    async def _acted(
        self, action: str, topic: str, channel: str, user: str, errors: list[str]
    ) -> None:
        """An action's log line and ``--notification-http-endpoint`` note (``<action>_topic``
        or ``<action>_channel``, as Go's); a 502 naming the nodes that failed."""
        log.info("%s %s%s: %s", action, topic, f":{channel}" if channel else "", errors or "ok")
        await self.cluster.notify(
            {
                "action": f"{action}_{'channel' if channel else 'topic'}",
                "topic": topic,
                "channel": channel,
                "user": user,
            }
        )
        if errors:
            raise HTTPError(502, "; ".join(errors))

    async def _config(self, request: BaseRequest, params: Params) -> Any:
        """Go nsqadmin's ``/config/<option>``, from ``--allow-config-from-cidr`` only: GET
        any option by its config-file name; PUT ``nsqlookupd_http_addresses`` (a JSON list)
        or ``log_level`` (the level's name) changes it while nsqadmin runs."""
        name = request.path.rsplit("/", 1)[1]
        if not self._config_allowed(request.remote or ""):
            raise HTTPError(403, "FORBIDDEN")
        if request.method == "PUT":
            body = await request.content.read(CONFIG_BODY_MAX + 1)
            if not body or len(body) > CONFIG_BODY_MAX:
                raise HTTPError(413, "INVALID_VALUE")
            set_config(self.opts, name, body)
            log.info("config %s set to %s", name, getattr(self.opts, _config_fields()[name]))
        field = _config_fields().get(name)
        if field is None:
            raise HTTPError(400, "INVALID_OPTION")
        return getattr(self.opts, field)

    def _config_allowed(self, remote: str) -> bool:
        cidr = self.opts.allow_config_from_cidr
        if not cidr:
            return True
        try:
            return ipaddress.ip_address(remote) in ipaddress.ip_network(cidr, strict=False)
        except ValueError:
            return False

    async def _render(self, request: BaseRequest, params: Params) -> Response:
        """``--proxy-graphite``: Graphite's ``/render`` through nsqadmin (at most
        ``RENDER_MAX`` bytes back)."""
        query = request.rel_url.raw_query_string  # passed on as it came, not re-encoded
        url = URL(f"{self.opts.graphite_url.rstrip('/')}/render?{query}", encoded=True)
        try:
            async with self.cluster.session.get(url) as r:
                body = await r.content.read(RENDER_MAX + 1)
                ctype = r.headers.get("Content-Type", "application/octet-stream")
                status = r.status
        except (aiohttp.ClientError, TimeoutError) as e:
            raise HTTPError(502, f"graphite: {e}") from None
        if len(body) > RENDER_MAX:
            raise HTTPError(502, "graphite: answer too large")
        return Response(status=status, body=body, headers={"Content-Type": ctype})

    # -- pages -----------------------------------------------------------------------------

    def _static_file(self, name: str) -> bytes:
        """A file of the web app: from ``--dev-static-dir`` when given (editing the app
        without reinstalling), else the package's. Raises FileNotFoundError."""
        if self.opts.dev_static_dir:
            with open(os.path.join(self.opts.dev_static_dir, name), "rb") as f:
                return f.read()
        try:
            return resources.files(__package__).joinpath(f"static/{name}").read_bytes()
        except IsADirectoryError:
            raise FileNotFoundError(name) from None

    async def _page(self, request: BaseRequest, params: Params) -> Response:
        html = self._static_file("index.html").decode()
        html = html.replace("{{BASE}}", self.base)
        return Response(status=200, body=html.encode(), content_type="text/html")

    async def _static(self, request: BaseRequest, params: Params) -> Response:
        name = request.path.rsplit("/", 1)[1]
        suffix = name[name.rfind(".") :] if "." in name else ""
        if suffix not in _STATIC_TYPES or "/" in name or name.startswith("."):
            raise HTTPError(404, "NOT_FOUND")
        try:
            data = self._static_file(name)
        except (FileNotFoundError, IsADirectoryError):
            raise HTTPError(404, "NOT_FOUND") from None
        return Response(status=200, body=data, content_type=_STATIC_TYPES[suffix])

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        await self.serve_on(asyncio.get_running_loop(), self.opts.http_address)

    async def stop(self) -> None:
        await self.close()
        await self.cluster.close()
