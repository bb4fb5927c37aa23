"""Monitoring with the real tools: the metrics reference against a real scrape, the alert rules
through Debian's ``promtool``, and a real Prometheus scraping a real replicated cluster so that
every query of the Grafana dashboard returns data (``docs/metrics.md``, ``contrib/``)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..conftest import ServerThread
from ..integration.replication_harness import Cluster, Etcd, replicate
from ..processes import free_port
from ..waiting import until, wait_for
from ..wire import Conn

ROOT = Path(__file__).resolve().parents[2]
CONTRIB = ROOT / "contrib"
#: Debian's prometheus package: installed, or unpacked by scripts/bootstrap.
PROMETHEUS_BIN = Path(
    shutil.which("prometheus")
    or ROOT / ".venv" / "opt" / "prometheus" / "usr" / "bin" / "prometheus"
)
PROMTOOL = PROMETHEUS_BIN.with_name("promtool")
#: A metric name as the docs write one (tool names such as nsq_to_file are not metrics).
METRIC_NAME = re.compile(
    r"\bnsq_(?:(?:topic|channel|partition)_[a-z0-9_]+|build_info|healthy|start_time_seconds"
    r"|clients|topics)\b(?:\{([a-z_,]+)\})?"
)


def served_families(text: str) -> set[str]:
    return {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE nsq_")}


def named_in(text: str) -> set[str]:
    """Metric names written in ``text``; ``nsq_topic_log_{bytes,segments}`` is two."""
    out: set[str] = set()
    for m in METRIC_NAME.finditer(text):
        name = m.group(0).split("{")[0]
        if m.group(1):
            out |= {name + part for part in m.group(1).split(",")}
        else:
            out.add(name)
    return out


def test_the_metrics_reference_is_what_nsqd_serves(
    make_nsqd: Callable[..., ServerThread],
) -> None:
    """``docs/metrics.md`` lists every family a real scrape has and nothing else; every metric
    name the README and the other docs write is a real one (``..._total`` for counters)."""
    server = make_nsqd(retention_time=3600.0, e2e_processing_latency_percentiles=[0.99])
    with server.connect() as c:
        c.pub("t", b"x")
    with urllib.request.urlopen(f"http://127.0.0.1:{server.http_port}/metrics", timeout=10) as r:
        served = served_families(r.read().decode())
    assert "nsq_topic_messages_total" in served and "nsq_partition_follower_lag" in served
    reference = (ROOT / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(nsq_[a-z0-9_]+)` \|", reference, re.M))
    assert documented == served
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        unknown = named_in(doc.read_text()) - served
        assert not unknown, f"{doc.name} names metrics nsqd does not serve: {sorted(unknown)}"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL.exists(), f"{PROMTOOL} missing: scripts/bootstrap unpacks Debian's prometheus"
    return subprocess.run(
        [str(PROMTOOL), *args],
        cwd=CONTRIB / "prometheus",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_alert_rules_check_and_fire_as_their_unit_tests_say() -> None:
    res = _promtool("check", "rules", "alerts.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    res = _promtool("test", "rules", "alerts_test.yml")
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr
    res = _promtool("check", "config", "prometheus.yml")
    assert res.returncode == 0, res.stdout + res.stderr


def dashboard_queries() -> list[str]:
    doc = json.loads((CONTRIB / "grafana" / "pynsqd-dashboard.json").read_text())
    return [t["expr"] for p in doc["panels"] for t in p["targets"]]


class Prometheus:
    """A real Prometheus scraping ``targets`` every second, with ``contrib``'s alert rules."""

    def __init__(self, directory: Path, targets: list[str]) -> None:
        directory.mkdir()
        config = directory / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{CONTRIB / 'prometheus' / 'alerts.yml'}]\n"
            "scrape_configs:\n"
            "  - job_name: nsqd\n"
            f"    static_configs: [{{targets: {json.dumps(targets)}}}]\n"
        )
        self.address = f"127.0.0.1:{free_port()}"
        self.log = (directory / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [
                str(PROMETHEUS_BIN),
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address={self.address}",
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def api(self, path: str, **query: str) -> Any:
        url = f"http://{self.address}/api/v1/{path}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(url, timeout=10) as r:
            doc = json.loads(r.read())
        assert doc["status"] == "success", doc
        return doc["data"]

    def query(self, expr: str) -> list[Any]:
        try:
            return list(self.api("query", query=expr)["result"])
        except OSError:
            return []

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self.log.close()


def test_prometheus_scrapes_a_replicated_cluster_and_every_dashboard_query_has_data(
    tmp_path: Path,
) -> None:
    assert PROMETHEUS_BIN.exists(), f"{PROMETHEUS_BIN} missing: scripts/bootstrap unpacks it"
    etcd = Etcd(tmp_path)
    cluster = Cluster(tmp_path, etcd, 3, "--e2e-processing-latency-percentile=0.99")
    prom: Prometheus | None = None
    try:
        replicate(cluster)
        node = cluster.node(1)
        assert node.proc is not None
        assert node.http("POST", "/channel/create?topic=orders&channel=work")[0] == 200
        status, body = node.http("POST", "/channel/config?topic=orders&channel=work&max_attempts=5")
        assert status == 200, body
        with Conn(("127.0.0.1", node.proc.port)) as c:
            c.mpub("orders", [b"o%d" % i for i in range(20)])
            c.mpub("logs", [b"l%d" % i for i in range(5)])
            c.sub("orders", "work", rdy=20)
            first = c.read_message()
            c.req(first.id, 0)
            for _ in range(19):
                c.fin(c.read_message().id)
        targets = [f"127.0.0.1:{n.proc.http_port}" for n in cluster.nodes if n.proc is not None]
        prom = Prometheus(tmp_path / "prometheus", targets)
        wait_for(
            lambda: len([r for r in prom.query('up{job="nsqd"}') if r["value"][1] == "1"]) == 3,
            "Prometheus scraping the three nodes",
            60,
        )
        empty = [q for q in dashboard_queries() if not until(lambda q=q: prom.query(q), 30)]
        assert empty == [], f"dashboard queries without data: {empty}"
        groups = prom.api("rules")["groups"]
        rules = [r for g in groups for r in g["rules"]]
        assert len(rules) == 10 and all(r["health"] == "ok" for r in rules), rules
    finally:
        if prom is not None:
            prom.stop()
        cluster.stop()
        etcd.stop()
