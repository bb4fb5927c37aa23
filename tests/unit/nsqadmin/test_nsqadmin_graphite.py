"""The Graphite series nsqadmin draws (``nsqadmin/graphite.py``): statsd's key formats over
nsqd's statsd names, as Go's nsqadmin builds them."""

from __future__ import annotations

import urllib.parse

from pynsqd.nsqadmin.graphite import chart_urls, metric
from pynsqd.nsqadmin.options import AdminOptions


def targets(urls: dict[str, str]) -> dict[str, str]:
    return {
        k: urllib.parse.parse_qs(urllib.parse.urlsplit(u).query)["target"][0]
        for k, u in urls.items()
    }


def test_series_follow_the_statsd_prefix_and_formats() -> None:
    opts = AdminOptions(graphite_url="http://graphite:8080/")
    assert metric(opts, "counter", "topic.t.message_count") == (
        "stats.counters.nsq.*.topic.t.message_count.count"
    )
    assert metric(opts, "gauge", "topic.t.depth") == "stats.gauges.nsq.*.topic.t.depth"
    urls = chart_urls(opts, "", "orders", "billing")
    assert urls is not None
    assert urls["rate"].startswith("http://graphite:8080/render?")
    assert targets(urls) == {
        "rate": "scale(sumSeries(stats.counters.nsq.*.topic.orders.channel.billing"
        ".message_count.count),0.0166667)",  # per second over the 60 s statsd interval
        "depth": "sumSeries(stats.gauges.nsq.*.topic.orders.channel.billing.depth)",
    }
    plain = AdminOptions(
        graphite_url="http://g",
        statsd_counter_format="",
        statsd_gauge_format="",
        statsd_prefix="prod.%s",
        statsd_interval=10.0,
    )
    assert targets(chart_urls(plain, "") or {}) == {
        "rate": "scale(sumSeries(prod.*.topic.*.message_count),0.1)"  # /counter: every topic
    }


def test_no_graphite_no_charts_and_the_proxy_is_nsqadmins_own_path() -> None:
    assert chart_urls(AdminOptions(), "", "t") is None
    proxied = chart_urls(AdminOptions(graphite_url="http://g", proxy_graphite=True), "/admin", "t")
    assert proxied is not None and proxied["depth"].startswith("/admin/render?")
