"""The package structure: no import cycle between pynsqd's subpackages, and the sans-IO and core
packages stay free of I/O.

Every import counts, wherever it is: at module level, inside a function, or under
``TYPE_CHECKING`` (a cycle there is still a knot a reader has to untie). The nodes are the
subpackages of ``pynsqd`` (``core``, ``http``, ...) and its top-level modules (``cli``,
``options``, ``log``); the Spark connector is its own node and the server must never import it.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "pynsqd"


def _node(module: str) -> str | None:
    """``pynsqd.http.api`` -> ``http``; ``pynsqd.cli`` -> ``cli``; ``pynsqd_spark.x`` -> spark."""
    parts = module.split(".")
    if parts[0] == "pynsqd_spark":
        return "pynsqd_spark"
    if parts[0] != "pynsqd":
        return None
    if len(parts) == 1:
        return "__init__"
    return parts[1]


def _imports(path: Path) -> set[str]:
    """Absolute names of every module ``path`` imports."""
    rel = path.relative_to(SRC).with_suffix("")
    package = list(rel.parts[:-1])
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)  # `from . import lifecycle`
    return out


def _graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in [*PKG.rglob("*.py"), *(SRC / "pynsqd_spark").rglob("*.py")]:
        src = _node(".".join(path.relative_to(SRC).with_suffix("").parts))
        assert src is not None
        deps = graph.setdefault(src, set())
        for mod in _imports(path):
            dst = _node(mod)
            if (
                dst is not None
                and dst != src
                and (SRC / mod.replace(".", "/")).exists()
                | (SRC / (mod.replace(".", "/") + ".py")).exists()
            ):
                deps.add(dst)
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_no_import_cycle_between_subpackages() -> None:
    graph = _graph()
    assert {"core", "protocol", "server", "http", "lookupd", "storage", "internal"} <= set(graph)
    cycle = _cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def test_the_server_never_imports_the_spark_connector() -> None:
    graph = _graph()
    assert not [n for n, deps in graph.items() if n != "pynsqd_spark" and "pynsqd_spark" in deps]


FORBIDDEN_IN_SANS_IO = {"asyncio", "socket", "ssl", "selectors", "uvloop", "aiohttp"}


def test_protocol_and_core_do_no_io() -> None:
    for sub in ("protocol", "core"):
        for path in (PKG / sub).rglob("*.py"):
            for mod in _imports(path):
                top = mod.split(".")[0]
                assert top not in FORBIDDEN_IN_SANS_IO, f"{path.name} imports {mod}"
                node = _node(mod)
                assert node not in {"server", "http", "lookupd", "storage", "cli"}, (
                    f"{path.name} imports {mod}"
                )


#: The replication core: decisions and formats, no I/O (the shells around them do it).
CLUSTER_CORE = ("plan.py", "records.py", "partition.py", "settings.py", "report.py")


def test_the_replication_core_does_no_io() -> None:
    cluster = PKG / "cluster"
    io_modules = {"etcd", "leader", "follower", "replicator", "membership", "checkpoints"}
    for name in CLUSTER_CORE:
        for mod in _imports(cluster / name):
            top = mod.split(".")[0]
            assert top not in FORBIDDEN_IN_SANS_IO | {"os", "time", "subprocess"}, (
                f"{name} imports {mod}"
            )
            parts = mod.split(".")
            assert not (parts[:2] == ["pynsqd", "cluster"] and set(parts[2:3]) & io_modules), (
                f"{name} imports {mod}"
            )


def test_the_checker_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_the_spark_connector_uses_the_client_and_declares_no_wire_format() -> None:
    """pynsqd_spark keeps only the Spark API: no private name of pynsqd or of its own modules
    crosses a module boundary, and nothing of its own talks HTTP, TLS, JSON over the wire or
    packs bytes (the log record and the HTTP side are ``pynsqd.client``'s and ``protocol``'s)."""
    spark = SRC / "pynsqd_spark"
    for path in spark.rglob("*.py"):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                private = [
                    a.name
                    for a in node.names
                    if a.name.startswith("_") and not a.name.endswith("__")
                ]
                assert not private, f"{path.name} imports private {private} from {node.module}"
        tops = {mod.split(".")[0] for mod in _imports(path)}
        banned = tops & {"urllib", "http", "ssl", "struct", "zlib", "socket"}
        assert not banned, f"{path.name} imports {sorted(banned)}"


#: What each package may import (docs/architecture.md states the same): an upper bound.
ALLOWED = {
    "__init__": set(),
    "__main__": {"cli"},
    "log": set(),
    "options": {"internal"},
    "internal": {"log", "__init__"},
    "protocol": {"internal"},
    "core": {"protocol", "internal"},
    "storage": {"core", "protocol", "internal", "log"},
    "cluster": {"core", "storage", "protocol", "internal", "options", "log", "__init__"},
    "http": {"cluster", "core", "storage", "protocol", "internal", "options", "log", "__init__"},
    "server": {
        "cluster",
        "http",
        "storage",
        "core",
        "protocol",
        "internal",
        "options",
        "log",
        "__init__",
    },
    "cli": {"server", "options", "internal", "log"},
    "lookupd": {"protocol", "internal", "log", "__init__"},
    "client": {"protocol", "internal", "__init__"},
    "tools": {"client", "protocol", "internal", "log", "__init__"},
    "nsqadmin": {"client", "internal", "log", "__init__"},
    "pynsqd_spark": {"client", "protocol", "__init__"},
}


def test_every_package_imports_only_what_the_architecture_says() -> None:
    graph = _graph()
    assert set(graph) <= set(ALLOWED), f"a new package: {sorted(set(graph) - set(ALLOWED))}"
    extra = {n: sorted(deps - ALLOWED[n]) for n, deps in graph.items() if deps - ALLOWED[n]}
    assert not extra, f"imports beyond the architecture: {extra}"


def test_the_partition_is_the_only_writer_of_the_commit_point() -> None:
    """A replicated log's commit point moves only through ``cluster/partition.py``."""
    writers = sorted(
        str(path.relative_to(PKG))
        for path in PKG.rglob("*.py")
        if ".commit_to(" in path.read_text() or ".committed =" in path.read_text()
    )
    assert writers == ["cluster/partition.py"]


def test_positions_and_a_topics_replication_move_only_through_their_owners() -> None:
    """A log's hand-off position moves only through ``TopicLog.hand_to`` (outside the log
    itself and the position's own class); a topic's origin and its held hand-off only through
    the topic's methods."""
    import re

    owners = {
        re.compile(r"\.handed\s*(\+|-)?=[^=]"): ("storage/topiclog.py", "storage/handed.py"),
        re.compile(r"\.origin\s*=[^=]"): ("core/topic.py",),
        re.compile(r"\bhand_off\.held\s*=[^=]"): ("core/handoff.py",),
    }
    found = [
        f"{path.relative_to(PKG)}:{n}: {line.strip()}"
        for path in PKG.rglob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        for pattern, owner in owners.items()
        if pattern.search(line) and str(path.relative_to(PKG)) not in owner
    ]
    assert not found, found


def test_replication_changes_a_channel_only_through_its_methods() -> None:
    """``cluster/`` reads a channel's windows but changes them, and its queues, only through
    ``core/windows.py``'s functions (``track_partition``, ``adopted_below``, ...)."""
    import re

    reach_in = re.compile(r"\b(ch|channel)\.(queue|tq|deferred|in_flight)\b|\.windows(\[.*\])? =")
    found = [
        f"{path.name}:{n}: {line.strip()}"
        for path in (PKG / "cluster").glob("*.py")
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if reach_in.search(line)
    ]
    assert not found, found


def test_no_test_module_imports_another() -> None:
    """Shared test parts have a home of their own (``tests/processes.py``, ``waiting.py``,
    ``tests/unit/doubles.py``, ``tests/integration/servers.py``, ``replication_harness.py``,
    ``tests/spark/helpers.py``, ...): a test module (``test_*.py``) is never imported, by a test
    or by the benchmarks, so that each can move or go without breaking another."""
    root = Path(__file__).resolve().parents[1]
    found = []
    for path in [*(root / "tests").rglob("*.py"), *(root / "bench").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            bad = [n for n in names if n.rsplit(".", 1)[-1].startswith("test_")]
            if bad:
                found.append(f"{path.relative_to(root)}:{node.lineno}: {bad}")
    assert not found, found


def test_the_checker_sees_an_import_of_a_test_module() -> None:
    tree = ast.parse("from .test_http import request\nimport tests.unit.test_channel")
    hits = [
        n
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for n in ([a.name for a in node.names] + [getattr(node, "module", "") or ""])
        if n.rsplit(".", 1)[-1].startswith("test_")
    ]
    assert sorted(hits) == ["test_http", "tests.unit.test_channel"]
