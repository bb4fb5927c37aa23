"""A local replicated pynsqd cluster in one command: etcd, three nodes, nsqlookupd, nsqadmin.

    scripts/cluster [--dir DIR] [--port-offset N]     start, print where, wait for Ctrl-C
    scripts/cluster stop [--dir DIR]                  stop the cluster started in DIR
    scripts/cluster revive [--dir DIR]                start its nodes that exited again

Everything lives under DIR (default ./pynsqd-cluster): each process's data and log, and
``pids`` (this command's own pid first). Ports (each + N with ``--port-offset``): etcd 2379
(and 2380 for its peers), nsqlookupd 4160/4161, nsqd 1-3 at 4150/4151, 4250/4251, 4350/4351,
nsqadmin 4171. Every topic the nodes retain (``--retention-time=24h``) is replicated on the
three nodes (``--replicas=3``). Ctrl-C, SIGTERM or ``scripts/cluster stop`` stops them all,
nodes first, etcd last.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from pynsqd.internal.listener import port_free

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
START_TIMEOUT = 60.0


def etcd_binary() -> str | None:
    found = shutil.which("etcd")
    if found:
        return found
    unpacked = ROOT / ".venv" / "opt" / "etcd" / "usr" / "bin" / "etcd"
    return str(unpacked) if unpacked.exists() else None


def answers(url: str) -> bool:
    """Whether ``url`` answers 200. Raises SystemExit when something else holds its port (it
    took the port between the check and the start, and does not speak HTTP)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False
    except http.client.HTTPException as err:
        port = urllib.parse.urlsplit(url).port
        raise SystemExit(
            f"cluster: port {port} is taken by another program (it answered {url} with "
            f"{type(err).__name__}); stop it or give --port-offset"
        ) from None


class Cluster:
    def __init__(self, directory: Path, offset: int) -> None:
        self.dir = directory
        self.offset = offset
        self.procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        #: How each was started: a node that exited is started the same way (``revive``).
        self.commands: dict[str, tuple[list[str], str]] = {}

    def port(self, base: int) -> int:
        return base + self.offset

    def spawn(self, name: str, cmd: list[str], ready_url: str) -> None:
        log = (self.dir / f"{name.replace(' ', '')}.log").open("ab")
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.dir
        )
        self.commands[name] = (cmd, ready_url)
        self.procs = [(n, p) for n, p in self.procs if n != name] + [(name, proc)]
        self.write_pids()
        deadline = time.monotonic() + START_TIMEOUT
        while not answers(ready_url):
            if proc.poll() is not None:
                tail = (self.dir / f"{name.replace(' ', '')}.log").read_text(errors="replace")
                raise SystemExit(
                    f"cluster: {name} exited ({proc.returncode}) while starting; its log ends:\n"
                    + "\n".join(tail.splitlines()[-5:])
                )
            if time.monotonic() > deadline:
                raise SystemExit(f"cluster: {name} did not answer {ready_url} in 60 s")
            time.sleep(0.05)

    def revive(self) -> None:
        """Start again, as before, every nsqd that exited (it takes its partition back)."""
        for name, proc in list(self.procs):
            if name.startswith("nsqd") and proc.poll() is not None:
                self.spawn(name, *self.commands[name])
                print(f"cluster: {name} started again (pid {self.pid(name)})", flush=True)

    def pid(self, name: str) -> int:
        return next(p.pid for n, p in self.procs if n == name)

    def write_pids(self) -> None:
        pids = [os.getpid()] + [p.pid for _, p in self.procs]
        (self.dir / "pids").write_text("".join(f"{p}\n" for p in pids))

    def start(self) -> None:
        etcd = etcd_binary()
        if etcd is None:
            raise SystemExit(
                "cluster: etcd not found: install Debian's etcd-server, or run scripts/bootstrap"
                " cluster (it unpacks etcd into .venv/opt/etcd)"
            )
        ports = {
            "etcd": (2379, 2380),
            "nsqlookupd": (4160, 4161),
            "nsqd 1": (4150, 4151),
            "nsqd 2": (4250, 4251),
            "nsqd 3": (4350, 4351),
            "nsqadmin": (4171,),
        }
        for name, ps in ports.items():
            for p in ps:
                if not port_free(self.port(p)):
                    raise SystemExit(
                        f"cluster: port {self.port(p)} ({name}) is taken; stop what uses it or"
                        " give --port-offset"
                    )
        e_client, e_peer = self.port(2379), self.port(2380)
        self.spawn(
            "etcd",
            [
                etcd,
                "--name=local",
                f"--data-dir={self.dir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{e_client}",
                f"--advertise-client-urls=http://127.0.0.1:{e_client}",
                f"--listen-peer-urls=http://127.0.0.1:{e_peer}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{e_peer}",
                f"--initial-cluster=local=http://127.0.0.1:{e_peer}",
            ],
            f"http://127.0.0.1:{e_client}/health",
        )
        lt, lh = self.port(4160), self.port(4161)
        self.spawn(
            "nsqlookupd",
            [
                str(BIN / "nsqlookupd"),
                f"--tcp-address=127.0.0.1:{lt}",
                f"--http-address=127.0.0.1:{lh}",
                "--broadcast-address=127.0.0.1",
            ],
            f"http://127.0.0.1:{lh}/ping",
        )
        for n in (1, 2, 3):
            tcp, http = ports[f"nsqd {n}"]
            data = self.dir / f"nsqd{n}"
            data.mkdir(exist_ok=True)
            self.spawn(
                f"nsqd {n}",
                [
                    str(BIN / "nsqd"),
                    f"--node-id={n}",
                    f"--data-path={data}",
                    f"--tcp-address=127.0.0.1:{self.port(tcp)}",
                    f"--http-address=127.0.0.1:{self.port(http)}",
                    "--broadcast-address=127.0.0.1",
                    f"--lookupd-tcp-address=127.0.0.1:{lt}",
                    f"--etcd-endpoints=127.0.0.1:{e_client}",
                    "--cluster-name=local",
                    "--retention-time=24h",
                    "--replicas=3",
                ],
                f"http://127.0.0.1:{self.port(http)}/ping",
            )
        admin = self.port(4171)
        self.spawn(
            "nsqadmin",
            [
                str(BIN / "nsqadmin"),
                f"--http-address=127.0.0.1:{admin}",
                f"--lookupd-http-address=127.0.0.1:{lh}",
            ],
            f"http://127.0.0.1:{admin}/ping",
        )
        self.describe()

    def describe(self) -> None:
        p = self.port
        pid = {name: proc.pid for name, proc in self.procs}
        n1 = f"http://127.0.0.1:{p(4151)}"
        tails = " ".join(f"--nsqd-tcp-address=127.0.0.1:{p(t)}" for t in (4150, 4250, 4350))
        print(
            f"""pynsqd cluster running in {self.dir} (each process's data and log there)

  etcd        127.0.0.1:{p(2379)}
  nsqlookupd  tcp 127.0.0.1:{p(4160)}  http 127.0.0.1:{p(4161)}
  nsqd 1      tcp 127.0.0.1:{p(4150)}  http 127.0.0.1:{p(4151)}  pid {pid["nsqd 1"]}
  nsqd 2      tcp 127.0.0.1:{p(4250)}  http 127.0.0.1:{p(4251)}  pid {pid["nsqd 2"]}
  nsqd 3      tcp 127.0.0.1:{p(4350)}  http 127.0.0.1:{p(4351)}  pid {pid["nsqd 3"]}
  nsqadmin    http://127.0.0.1:{p(4171)}

Every topic is retained and replicated on the three nodes. Try, in another terminal:

  {BIN / "nsq_tail"} --topic=orders {tails}

then here:

  curl -d 'hello' '{n1}/pub?topic=orders'
  curl '{n1}/topic/replication?topic=orders'
  kill -9 {pid["nsqd 1"]}        # nsqd 1's partition is served by another node within seconds
  curl -d 'after' 'http://127.0.0.1:{p(4251)}/pub?topic=orders'
  {Path(__file__).resolve().with_name("cluster")} revive --dir {self.dir}
                                 # nsqd 1 starts again and takes its partition back:
  curl '{n1}/topic/replication?topic=orders'

Ctrl-C here (or scripts/cluster stop --dir {self.dir}) stops everything.""",
            flush=True,
        )

    def stop(self) -> None:
        for name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    print(f"cluster: {name} did not stop in 30 s; killed", file=sys.stderr)
                    proc.kill()
                    proc.wait()
        (self.dir / "pids").unlink(missing_ok=True)


def signal_cluster(directory: Path, sig: int) -> bool:
    """Send ``sig`` to the cluster running in ``directory`` (its own pid is the first in
    ``pids``); False, said in one line, when none runs there."""
    pids = directory / "pids"
    if not pids.exists():
        print(f"cluster: no cluster runs in {directory} (no {pids})", file=sys.stderr)
        return False
    first = int(pids.read_text().split()[0])
    try:
        os.kill(first, sig)
    except ProcessLookupError:
        print(f"cluster: the cluster in {directory} is not running (pid {first})", file=sys.stderr)
        if sig == signal.SIGTERM:
            pids.unlink()
        return False
    return True


def stop_other(directory: Path) -> int:
    if not signal_cluster(directory, signal.SIGTERM):
        return 1
    pids = directory / "pids"
    deadline = time.monotonic() + 120
    while pids.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    print(f"cluster: stopped the cluster in {directory}")
    return 0


def revive_other(directory: Path) -> int:
    """Ask the cluster running in ``directory`` to start its exited nodes again (SIGHUP)."""
    if not signal_cluster(directory, signal.SIGHUP):
        return 1
    print(f"cluster: asked the cluster in {directory} to start its stopped nodes again")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(
        prog="scripts/cluster", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("command", nargs="?", default="start", choices=["start", "stop", "revive"])
    ap.add_argument("--dir", default="pynsqd-cluster", help="where everything lives")
    ap.add_argument("--port-offset", type=int, default=0, help="added to every port")
    args = ap.parse_args()
    directory = Path(args.dir).resolve()
    if args.command == "stop":
        return stop_other(directory)
    if args.command == "revive":
        return revive_other(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if (directory / "pids").exists():
        first = int((directory / "pids").read_text().split()[0])
        try:
            os.kill(first, 0)
            print(f"cluster: a cluster already runs in {directory} (pid {first})", file=sys.stderr)
            return 1
        except ProcessLookupError:
            pass  # left by a cluster that was killed: its processes are checked by their ports
    cluster = Cluster(directory, args.port_offset)

    def on_term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the wait below
    revive = [False]

    def on_hup(signum: int, frame: object) -> None:  # scripts/cluster revive
        revive[0] = True

    signal.signal(signal.SIGHUP, on_hup)
    reported: set[int] = set()
    try:
        cluster.start()
        while True:
            if revive[0]:
                revive[0] = False
                cluster.revive()
            for name, proc in cluster.procs:
                if proc.poll() is not None and proc.pid not in reported:
                    reported.add(proc.pid)
                    print(
                        f"cluster: {name} exited ({proc.returncode}); its log is in {directory};"
                        f" scripts/cluster revive --dir {directory} starts it again",
                        flush=True,
                    )
            signal.pause()
    except KeyboardInterrupt:
        print("\ncluster: stopping", flush=True)
    except SystemExit as err:
        print(err, file=sys.stderr)
        cluster.stop()
        return 1
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
