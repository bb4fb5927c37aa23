"""Charts from Graphite, as Go's nsqadmin draws them (``--graphite-url``).

nsqd pushes its stats to statsd (``--statsd-address``, prefix ``nsq.%s`` with ``%s`` the node's
``<host>_<http port>``), statsd flushes them to Graphite every ``--statsd-interval`` under its
own key formats (``stats.counters.%s.count`` for counters, ``stats.gauges.%s`` for gauges). With
``--graphite-url`` the topic, channel and counter pages add Graphite's own rendering of the
same series over the last hours (Graphite keeps what the five minutes nsqadmin keeps cannot):
a ``/render`` image of every node summed (``*`` in place of the host), the message rate scaled
to per second by the statsd interval. With ``--proxy-graphite`` the browser asks nsqadmin,
which forwards ``/render`` to Graphite (a Graphite the browser cannot reach, or one on another
origin); otherwise it asks Graphite directly.
"""

from __future__ import annotations

import urllib.parse

from .options import AdminOptions

__all__ = ["chart_urls", "metric"]

#: How far back the Graphite charts go, and their size (the pages' own charts' size).
SPAN = "-2h"
WIDTH, HEIGHT = 420, 150


def metric(opts: AdminOptions, kind: str, stat: str) -> str:
    """The Graphite series of nsqd's statsd ``stat`` on every node (``kind``: counter or
    gauge), through ``--statsd-prefix`` and the ``--statsd-*-format`` statsd applies."""
    prefix = opts.statsd_prefix.replace("%s", "*")
    if prefix and not prefix.endswith("."):
        prefix += "."
    name = prefix + stat
    fmt = opts.statsd_counter_format if kind == "counter" else opts.statsd_gauge_format
    return fmt.replace("%s", name) if fmt else name


def render_url(opts: AdminOptions, base_path: str, target: str, title: str) -> str:
    query = urllib.parse.urlencode(
        {
            "target": target,
            "from": SPAN,
            "width": WIDTH,
            "height": HEIGHT,
            "title": title,
            "hideLegend": "true",
            "format": "png",
        }
    )
    base = base_path if opts.proxy_graphite else opts.graphite_url.rstrip("/")
    return f"{base}/render?{query}"


def chart_urls(
    opts: AdminOptions, base_path: str, topic: str = "", channel: str = ""
) -> dict[str, str] | None:
    """The Graphite charts of a page: ``rate`` (messages/s) and, for a topic or a channel,
    ``depth``; None without ``--graphite-url``. ``topic`` empty: every topic (``/counter``)."""
    if not opts.graphite_url:
        return None
    stat = f"topic.{topic or '*'}" + (f".channel.{channel}" if channel else "")
    per_second = 1 / opts.statsd_interval if opts.statsd_interval > 0 else 1.0
    rate = f"scale(sumSeries({metric(opts, 'counter', stat + '.message_count')}),{per_second:g})"
    urls = {"rate": render_url(opts, base_path, rate, "messages/s (Graphite)")}
    if topic:
        depth = f"sumSeries({metric(opts, 'gauge', stat + '.depth')})"
        urls["depth"] = render_url(opts, base_path, depth, "depth (Graphite)")
    return urls
