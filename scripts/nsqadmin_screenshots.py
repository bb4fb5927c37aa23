"""Screenshots of pynsqd's nsqadmin, and of Go's beside it, over one real cluster.

    .venv/bin/python scripts/nsqadmin_screenshots.py \
        [--go-nsqadmin PATH]   (Go's nsqadmin 1.3.0 binary, from NSQ's release, to draw it too)

Starts an nsqlookupd and two pynsqd nodes on 127.0.0.1, publishes to a topic with a channel
and a connected consumer, starts pynsqd's nsqadmin (and Go's, given its path) on the lookupd,
and saves each page as headless Chromium draws it to docs/images/nsqadmin-<page>.png (and
go-nsqadmin-<page>.png). Needs Debian's chromium and chromium-driver (scripts/bootstrap).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from pynsqd.client import Connection

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
IMAGES = ROOT / "docs" / "images"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--go-nsqadmin", default="", help="Go nsqadmin's path: screenshot it too")
    args = p.parse_args()
    procs: list[subprocess.Popen[bytes]] = []
    tmp = Path(tempfile.mkdtemp(prefix="pynsqd-shots-"))
    try:
        lt, lh = free_port(), free_port()
        procs.append(
            subprocess.Popen(
                [
                    BIN / "nsqlookupd",
                    f"--tcp-address=127.0.0.1:{lt}",
                    f"--http-address=127.0.0.1:{lh}",
                ]
            )
        )
        wait_http(f"http://127.0.0.1:{lh}/ping")
        nodes = []
        for name in ("a", "b"):
            t, h = free_port(), free_port()
            (tmp / name).mkdir()
            procs.append(
                subprocess.Popen(
                    [
                        BIN / "nsqd",
                        f"--tcp-address=127.0.0.1:{t}",
                        f"--http-address=127.0.0.1:{h}",
                        f"--data-path={tmp / name}",
                        f"--lookupd-tcp-address=127.0.0.1:{lt}",
                        "--broadcast-address=127.0.0.1",
                        "--e2e-processing-latency-percentile=0.5,0.99",
                    ]
                )
            )
            wait_http(f"http://127.0.0.1:{h}/ping")
            nodes.append((t, h))
        with Connection(f"127.0.0.1:{nodes[0][0]}").connect() as c:
            c.mpub("orders", [json.dumps({"n": i}).encode() for i in range(500)])
        with Connection(f"127.0.0.1:{nodes[1][0]}").connect() as c:
            c.mpub("orders", [b"x"] * 120)
            c.mpub("clicks", [b"y"] * 40)
        consumer = Connection(f"127.0.0.1:{nodes[0][0]}").connect()
        consumer.subscribe(
            "orders", "billing", lambda conn, ts, att, ids, bodies: conn.fin_many(ids[:1]), rdy=5
        )
        admins = {"": free_port()}
        procs.append(
            subprocess.Popen(
                [
                    BIN / "nsqadmin",
                    f"--http-address=127.0.0.1:{admins['']}",
                    f"--lookupd-http-address=127.0.0.1:{lh}",
                ]
            )
        )
        if args.go_nsqadmin:
            admins["go-"] = free_port()
            procs.append(
                subprocess.Popen(
                    [
                        args.go_nsqadmin,
                        f"--http-address=127.0.0.1:{admins['go-']}",
                        f"--lookupd-http-address=127.0.0.1:{lh}",
                    ]
                )
            )
        for port in admins.values():
            wait_http(f"http://127.0.0.1:{port}/ping")
        options = webdriver.ChromeOptions()
        for arg in (
            "--headless=new",
            "--no-sandbox",
            "--disable-dev-shm-usage",
            "--window-size=1200,900",
        ):
            options.add_argument(arg)
        options.binary_location = "/usr/bin/chromium"
        driver = webdriver.Chrome(
            options=options, service=webdriver.ChromeService("/usr/bin/chromedriver")
        )
        node = f"127.0.0.1:{nodes[0][1]}"
        pages = {
            "topics": "topics",
            "topic": "topics/orders",
            "channel": "topics/orders/billing",
            "nodes": "nodes",
            "node": f"nodes/{node}",
            "lookup": "lookup",
            "counter": "counter",
        }
        try:
            for prefix, port in admins.items():
                for name, path in pages.items():
                    if prefix and name == "topics":
                        path = ""  # Go's topic list is its index page
                    driver.get(f"http://127.0.0.1:{port}/{path}")
                    want = "orders" if name not in ("counter", "nodes", "lookup") else ""
                    WebDriverWait(driver, 20).until(
                        lambda d, want=want: want in d.find_element(By.TAG_NAME, "body").text
                    )
                    if not prefix and name in ("topic", "channel", "counter"):
                        chart = "rate-chart" if name == "counter" else "depth-chart"
                        WebDriverWait(driver, 30).until(
                            lambda d, chart=chart: (
                                int(d.find_element(By.ID, chart).get_attribute("data-points") or 0)
                                >= 4
                            )
                        )
                    else:
                        time.sleep(1)  # Go's pages fetch and draw after load
                    out = IMAGES / f"{prefix}nsqadmin-{name}.png"
                    driver.save_screenshot(str(out))
                    print(out.relative_to(ROOT))
        finally:
            driver.quit()
            consumer.close()
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            proc.wait(20)
    return 0


if __name__ == "__main__":
    sys.exit(main())
