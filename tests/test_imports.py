"""Imports: no circle among the package's modules, nothing set by importing, lazy commands."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import hvdtrack

PACKAGE = Path(hvdtrack.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def import_time_imports(path: Path) -> set[str]:
    """The package's modules that importing ``path`` imports: statements run at import time
    (module level, inside if/try), not in functions and not under ``if TYPE_CHECKING``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(statements):
        for node in statements:
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(
                        [*package.split(".")[: len(package.split(".")) - node.level + 1], base]
                    ).strip(".")
                for alias in node.names:
                    sub = f"{base}.{alias.name}"
                    found.add(sub if sub in MODULES else base)
            elif isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                visit(node.body)
                for handler in node.handlers:
                    visit(handler.body)
                visit(node.orelse)
                visit(node.finalbody)

    visit(ast.parse(path.read_text()).body)
    return {m for m in found if m in MODULES and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


GRAPH = {name: import_time_imports(path) for name, path in MODULES.items()}


def test_the_import_graph_is_read_from_the_source():
    assert len(MODULES) > 40
    assert "hvdtrack.entry" in GRAPH["hvdtrack.train.__main__"]
    assert GRAPH["hvdtrack.entry"] == {"hvdtrack.errors"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle_among_the_package_modules():
    assert cycles(GRAPH) == []


def test_only_the_command_line_imports_the_command_line():
    importers = {name for name, imports in GRAPH.items() if "hvdtrack.cli" in imports}
    assert importers <= {"hvdtrack.__main__"}
    # the command imports its commands lazily, by name: it depends on nothing but entry
    assert GRAPH["hvdtrack.cli"] == {"hvdtrack.entry"}


def python(code: str) -> dict:
    """Runs ``code`` in a fresh interpreter without TensorFlow variables in its environment
    (so a default that something sets shows); returns the JSON it prints last."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=PACKAGE.parent,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


SNAPSHOT = """
import json, os, sys
before = dict(os.environ)
{body}
after = dict(os.environ)
changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
print(json.dumps({{"changed": changed, "tensorflow": "tensorflow" in sys.modules,
                   "modules": sorted(m for m in sys.modules if m.startswith("hvdtrack"))}}))
"""


def test_import_hvdtrack_changes_no_setting_and_imports_nothing_heavy():
    seen = python(SNAPSHOT.format(body="import hvdtrack"))
    assert seen == {"changed": [], "tensorflow": False, "modules": ["hvdtrack"]}


def test_importing_every_module_sets_no_tensorflow_setting():
    names = sorted(MODULES)
    seen = python(
        SNAPSHOT.format(body=f"import importlib\nfor m in {names!r}: importlib.import_module(m)")
    )
    assert seen["tensorflow"] and set(names) <= set(seen["modules"])
    # bench.construct pins numpy's threads at import, for its own timing (see its docstring)
    assert [k for k in seen["changed"] if not k.endswith("_NUM_THREADS")] == []


def test_the_command_imports_only_the_chosen_command_and_applies_its_settings():
    seen = python(SNAPSHOT.format(body="from hvdtrack import cli\nassert cli.main(['bench']) == 0"))
    assert not seen["tensorflow"]
    assert seen["modules"] == [
        "hvdtrack",
        "hvdtrack.bench",
        "hvdtrack.bench.__main__",
        "hvdtrack.cli",
        "hvdtrack.entry",
        "hvdtrack.errors",
    ]
    # bench gets the quiet log level, not the allocator: `bench model --bfc-allocator` decides
    assert seen["changed"] == ["TF_CPP_MIN_LOG_LEVEL"]


def test_a_command_applies_its_settings_when_it_starts_and_explicit_values_win():
    seen = python(
        SNAPSHOT.format(
            body="from hvdtrack import cli\nos.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
            "before['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
            "assert cli.main(['train', '--print-config']) == 0"
        )
    )
    assert seen["changed"] == ["TF_CPU_ALLOCATOR_USE_BFC"]


@pytest.mark.slow
@pytest.mark.extended
def test_every_module_imports_first_in_a_fresh_interpreter():
    def first_import(name: str) -> tuple[str, str]:
        result = subprocess.run(
            [sys.executable, "-c", f"import {name}"],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=PACKAGE.parent,
        )
        return name, "" if result.returncode == 0 else result.stderr.strip().splitlines()[-1]

    with ThreadPoolExecutor(2) as pool:
        failures = {name: err for name, err in pool.map(first_import, sorted(MODULES)) if err}
    assert failures == {}
