"""The packages' layers point one way (docs/architecture.md, "Package map").

protocol ← cluster ← server; protocol (+ cluster for watches) ← client; the `canal-ha`
command line (canal_ha) on top. Every import is read from the source (module level and
inside functions, ``importlib.import_module("…")`` with a literal name included), so a
lazy import that goes the wrong way fails here too. Within a package no two modules
import each other, directly or through others (TYPE_CHECKING imports included).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "canal_protocol": ROOT / "protocol" / "canal_protocol",
    "canal_cluster": ROOT / "cluster" / "canal_cluster",
    "canal_server": ROOT / "server" / "canal_server",
    "canal_client": ROOT / "client" / "canal_client",
    "canal_ha": ROOT / "cli" / "canal_ha",
}
# What each package may import of ours.
ALLOWED = {
    "canal_protocol": {"canal_protocol"},
    "canal_cluster": {"canal_protocol", "canal_cluster"},
    "canal_server": {"canal_protocol", "canal_cluster", "canal_server"},
    "canal_client": {"canal_protocol", "canal_cluster", "canal_client"},
    "canal_ha": set(PACKAGES),
}
# Third-party modules a package may import (the standard library is always allowed).
THIRD_PARTY = {
    "canal_protocol": {"msgpack", "google"},
    "canal_cluster": {"pyetcd", "grpc"},
    "canal_client": {"msgpack", "httpx", "pyspark", "pyarrow", "deltalake"},
}
SERVER_ONLY = {"fastapi", "starlette", "uvicorn", "pydantic", "pymysql", "pymysqlreplication"}


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def violations(package: str) -> list[str]:
    out = []
    for path in sorted(PACKAGES[package].rglob("*.py")):
        for line, module in imports_of(path):
            top = module.split(".")[0]
            where = f"{path.relative_to(ROOT)}:{line} imports {module}"
            if top in PACKAGES and top not in ALLOWED[package]:
                out.append(where)
            elif (
                package in THIRD_PARTY
                and top not in PACKAGES
                and top not in sys.stdlib_module_names
                and top not in THIRD_PARTY[package]
            ):
                out.append(f"{where} (not a dependency of {package})")
    return out


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_imports_point_one_way(package: str) -> None:
    assert violations(package) == []


def test_the_client_never_imports_the_servers_dependencies() -> None:
    assert not THIRD_PARTY["canal_client"] & SERVER_ONLY
    assert not THIRD_PARTY["canal_cluster"] & SERVER_ONLY


def test_the_checker_sees_a_wrong_way_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import importlib\n"
        "def f():\n"
        "    from canal_server.store import EventStore\n"
        "    importlib.import_module('canal_ha.cli')\n"
    )
    assert [m for _, m in imports_of(bad)] == ["importlib", "canal_server.store", "canal_ha.cli"]


def module_name(package: str, path: Path) -> str:
    rel = path.relative_to(PACKAGES[package]).with_suffix("")
    parts = [package, *rel.parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(package: str) -> dict[str, set[str]]:
    """Module → the package's modules it imports (at module level, inside functions or
    under TYPE_CHECKING alike); ``from p import m`` of a submodule ``m`` counts as ``p.m``."""
    paths = {module_name(package, p): p for p in sorted(PACKAGES[package].rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                subs = [f"{node.module}.{a.name}" for a in node.names]
                targets = [s for s in subs if s in paths] or [node.module]
            graph[name] |= {t for t in targets if t in paths and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected sets of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle(package: str) -> None:
    assert cycles(import_graph(package)) == []


def test_the_cycle_checker_sees_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
