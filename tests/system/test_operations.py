"""The operations files do what docs/operations.md says: the cluster walkthrough runs as
written, the systemd units pass systemd-analyze, and the compose file and Kubernetes manifests
(which cannot run here: no Docker daemon, no Kubernetes) hold commands whose flags the real
parsers take and addresses that point at their services."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from pynsqd import cli as nsqd_cli
from pynsqd.lookupd import cli as lookupd_cli
from pynsqd.nsqadmin import cli as admin_cli

from ..processes import free_offset

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.mark.skipif(not (BIN / "nsqd").exists(), reason="needs the installed nsqd console script")
def test_the_cluster_walkthrough_runs_as_written() -> None:
    # The ports are free when chosen, but a test beside this one (the suite runs in parallel
    # workers) may bind one before the script does: that try is made again on other ports.
    for _ in range(3):
        base = free_offset(range(22))  # the walkthrough uses base .. base+21
        res = subprocess.run(
            [str(ROOT / "contrib" / "cluster-walkthrough.sh"), str(BIN)],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
            env={**os.environ, "BASE": str(base)},
            cwd=ROOT,
        )
        if "address already in use" not in res.stderr:
            break
    assert res.returncode == 0, res.stderr[-2000:]
    assert f"nodes: [{base + 10}, {base + 20}]" in res.stdout
    assert res.stdout.rstrip().endswith("cluster ok")


@pytest.mark.parametrize("unit", ["nsqd.service", "nsqlookupd.service", "nsqadmin.service"])
def test_the_systemd_units_verify(unit: str, tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed")
    text = (ROOT / "contrib" / unit).read_text().replace("/opt/pynsqd/bin", str(BIN))
    path = tmp_path / unit
    path.write_text(text)
    res = subprocess.run(
        [analyze, "verify", str(path)], capture_output=True, text=True, check=False
    )
    assert res.returncode == 0 and res.stderr.strip() == "", res.stderr


def _parse(program: str, args: list[str]) -> Any:
    """The options the real command line parser makes of ``args`` (raises on a bad flag)."""
    if program == "nsqd":
        return nsqd_cli.parse_options(args)
    if program == "nsqlookupd":
        return lookupd_cli.parse_options(args)
    assert program == "nsqadmin", program
    opts, warnings = admin_cli.parse_options(args)
    assert warnings == []
    return opts


def _dockerfile_entrypoint() -> list[str]:
    text = (ROOT / "contrib" / "Dockerfile").read_text()
    m = re.search(r"^ENTRYPOINT (\[.*\])$", text, re.M)
    assert m is not None
    return list(yaml.safe_load(m.group(1)))


def _host_port(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def test_the_compose_file_runs_real_commands_against_its_own_services() -> None:
    doc = yaml.safe_load((ROOT / "contrib" / "docker-compose.yml").read_text())
    services = doc["services"]
    assert services["nsqlookupd"]["build"]["dockerfile"] == "contrib/Dockerfile"
    base = _dockerfile_entrypoint()  # nsqd --data-path=/data ...
    parsed: dict[str, Any] = {}
    for name, svc in services.items():
        argv = [*(svc.get("entrypoint") or base), *svc.get("command", [])]
        program, args = Path(argv[0]).name, argv[1:]
        parsed[name] = (program, _parse(program, args))
    lookupd = parsed["nsqlookupd"][1]
    nsqds = [o for p, o in parsed.values() if p == "nsqd"]
    assert len(nsqds) == 2
    assert len({o.node_id for o in nsqds}) == 2  # distinct node ids
    for name, (program, opts) in parsed.items():
        if program == "nsqd":
            assert opts.broadcast_address == name  # what lookupd tells consumers resolves
            for address in opts.lookupd_tcp_addresses:
                host, port = _host_port(address)
                assert host in services and port == _host_port(lookupd.tcp_address)[1]
        if program == "nsqadmin":
            for address in opts.lookupd_http_addresses:
                host, port = _host_port(address)
                assert host in services and port == _host_port(lookupd.http_address)[1]
    published = [p for svc in services.values() for p in svc.get("ports", [])]
    assert len(published) == len(set(p.split(":")[0] for p in published))  # no host port twice


def test_the_kubernetes_manifests_run_real_commands_against_their_services() -> None:
    docs = list(yaml.safe_load_all((ROOT / "contrib" / "kubernetes" / "pynsqd.yaml").read_text()))
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    assert {w["metadata"]["name"] for w in workloads} == {"nsqlookupd", "nsqd", "nsqadmin"}
    ports = {name: {p["port"] for p in svc["spec"]["ports"]} for name, svc in services.items()}
    for w in workloads:
        name = w["metadata"]["name"]
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert services[name]["spec"]["selector"] == labels  # the service reaches the pods
        (container,) = w["spec"]["template"]["spec"]["containers"]
        command = container["command"]
        if command[:2] == ["/bin/sh", "-c"]:
            # The StatefulSet's pod nsqd-1: its ordinal is its node id, its DNS name its address.
            script = command[2].replace("${HOSTNAME##*-}", "1").replace("${HOSTNAME}", "nsqd-1")
            command = shlex.split(script.removeprefix("exec "))
        program, opts = command[0], _parse(command[0], command[1:])
        assert {p["containerPort"] for p in container["ports"]} == ports[name]
        probe = container["readinessProbe"]["httpGet"]
        assert probe["path"] == "/ping" and probe["port"] in ports[name]
        if program == "nsqd":
            assert opts.node_id == 1 and opts.broadcast_address == "nsqd-1.nsqd"
            assert services["nsqd"]["spec"]["clusterIP"] == "None"  # per-pod DNS names
            for address in opts.lookupd_tcp_addresses:
                host, port = _host_port(address)
                assert host in services and port in ports[host]
        if program == "nsqadmin":
            for address in opts.lookupd_http_addresses:
                host, port = _host_port(address)
                assert host in services and port in ports[host]
