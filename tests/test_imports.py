"""Imports: no circle among the package's modules, one layer order, nothing set by importing,
lazy commands.

The import graph counts every import statement of a module at any depth (module level, inside
functions and methods, under ``if TYPE_CHECKING``, in try/if blocks, relative ones too): a circle
or an upward import through a function-level import is still one, it only fails later.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import hvdtrack

PACKAGE = Path(hvdtrack.__file__).parent
REPO = PACKAGE.parent

# ------------------------------------------------------------------------------ the layer order
# A module may import the bottom layer, its own package, and packages BEFORE its own in ORDER;
# never a later one, at any depth (a function-level import is still an upward dependency).
# The bottom layer may be imported by anyone: these modules, every ``hvdtrack.<pkg>.config``
# and ``hvdtrack.utils.*``.
BOTTOM = (
    "hvdtrack",
    "hvdtrack.errors",
    "hvdtrack.entry",
    "hvdtrack.configtools",
    "hvdtrack.config",
)
ORDER = (
    "events",
    "graphs",
    "records",
    "prepare",
    "inputs",
    "model",
    "tracks",
    "runs",
    "distributed",
    "train",
    "evaluate",
    "reconstruct",
    "export",
    "scaling",
    "bench",
)
TOP = ("hvdtrack.cli", "hvdtrack.__main__")  # may import anything
# The config layer (hvdtrack.config, configtools, every *.config) imports only the bottom layer,
# which includes the other config modules. Exception, until their sections move to a config
# module: these still hold their section's dataclass, which hvdtrack.config composes; they import
# no TensorFlow at import time (test_loading_a_config_imports_no_tensorflow holds them to it).
CONFIG_SECTIONS_OUTSIDE_CONFIG_MODULES = frozenset(
    {
        "hvdtrack.events.synthetic",
        "hvdtrack.graphs.construction",
        "hvdtrack.records.shards",
        "hvdtrack.inputs.subgraphs",
    }
)
# hvdtrack.utils.* imports only these and other utils.
UTILS_MAY_IMPORT = frozenset({"hvdtrack.errors", "hvdtrack.configtools"})
CONFIG_MODULE = re.compile(r"hvdtrack\.[a-z_0-9]+\.config$")


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def parents(name: str) -> list[str]:
    """``a.b.c`` -> ``["a", "a.b"]``: the packages Python imports before ``a.b.c``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def imports_in(source: str, name: str, is_package: bool, modules) -> list[tuple[str, int, bool]]:
    """``(module, line, explicit)`` for each module of ``modules`` that module ``name`` imports:
    every import statement at any depth (``ast.walk``). A name that is not a module (``from a.b
    import f``) is an import of its package ``a.b`` (its ``__init__``). Importing ``a.b.c`` also
    imports the packages ``a`` and ``a.b`` (not explicit) unless ``name`` is inside them (then
    they are already being imported)."""
    package = name if is_package else name.rpartition(".")[0]
    inside = {*parents(name), name}
    found: dict[tuple[str, int], bool] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base]).strip(".")
            subs = [f"{base}.{alias.name}" for alias in node.names]
            named = [sub for sub in subs if sub in modules]
            targets = named + ([base] if len(named) < len(subs) else [])
        else:
            continue
        for target in targets:
            for module in [*parents(target), target]:
                if module in modules and module not in inside:
                    key = (module, node.lineno)
                    found[key] = found.get(key, False) or module == target
    return sorted(((m, line, e) for (m, line), e in found.items()), key=lambda x: (x[1], x[0]))


IMPORTS = {
    name: imports_in(path.read_text(), name, path.name == "__init__.py", MODULES)
    for name, path in MODULES.items()
}
GRAPH = {name: {module for module, _, _ in found} for name, found in IMPORTS.items()}


def layer(module: str) -> tuple[int, str]:
    """``(rank, group)``: rank 0 the bottom layer, 1.. the packages of ORDER, one past them the
    top; group the package a module may import freely (its own), or "config"/"utils"/"bottom"."""
    if module in TOP:
        return len(ORDER) + 1, "top"
    if module in ("hvdtrack.config", "hvdtrack.configtools") or CONFIG_MODULE.match(module):
        return 0, "config"
    if module == "hvdtrack.utils" or module.startswith("hvdtrack.utils."):
        return 0, "utils"
    if module in BOTTOM:
        return 0, "bottom"
    package = module.split(".")[1] if module.count(".") >= 1 else ""
    if package in ORDER:
        return ORDER.index(package) + 1, package
    raise LookupError(f"{module} is in no layer: add its package to ORDER (tests/test_imports.py)")


def may_import(importer: str, imported: str) -> bool:
    rank, group = layer(importer)
    imported_rank, imported_group = layer(imported)
    if group == "utils":
        return imported_group == "utils" or imported in UTILS_MAY_IMPORT
    if group == "config":
        return imported_rank == 0 or imported in CONFIG_SECTIONS_OUTSIDE_CONFIG_MODULES
    if group == "bottom":
        return imported_rank == 0
    return imported_rank == 0 or imported_group == group or imported_rank < rank


def layer_violations(imports: dict[str, list[tuple[str, int, bool]]]) -> list[str]:
    """``importer -> imported (line N)`` for each explicit import the layer order forbids."""
    return [
        f"{importer} -> {imported} (line {line})"
        for importer, found in sorted(imports.items())
        for imported, line, explicit in found
        if explicit and not may_import(importer, imported)
    ]


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
        for w in sorted(graph.get(v, ())):
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


def describe(component: list[str]) -> str:
    """A circle's modules, and the imports inside it, with their lines."""
    members = set(component)
    edges = [
        f"  {importer} -> {imported} (line {line}{'' if explicit else ', its package'})"
        for importer in component
        for imported, line, explicit in IMPORTS.get(importer, ())
        if imported in members
    ]
    return "\n".join([" <-> ".join(component), *edges])


# --------------------------------------------------------------------- the checkers, by hand


def test_the_import_graph_counts_imports_at_any_depth():
    source = (
        "from __future__ import annotations\n"
        "from typing import TYPE_CHECKING\n"
        "import os\n"
        "from p.a import f\n"  # 4: a name: its module p.a
        "from p import b\n"  # 5: a module p.b (p: a parent of the importer)
        "from . import c\n"  # 6: relative, a module: p.q.c
        "from .d import g\n"  # 7: relative, a name: p.q.d
        "if TYPE_CHECKING:\n"
        "    from p.b.z import r\n"  # 9: p.b.z, and its package p.b
        "try:\n"
        "    import p.x.s\n"  # 11: p.x.s, and its package p.x
        "except ImportError:\n"
        "    pass\n"
        "def h():\n"
        "    from ..x import y\n"  # 15: two levels up from p.q.here: p.x
        "    class K:\n"
        "        def m(self):\n"
        "            import p.q.t as t\n"  # 18: in a method
        "            return t\n"
        "    return y\n"
    )
    modules = {"p", "p.a", "p.b", "p.b.z", "p.q", "p.q.c", "p.q.d", "p.q.t", "p.q.here", "p.x"}
    modules |= {"p.x.s"}
    assert imports_in(source, "p.q.here", False, modules) == [
        ("p.a", 4, True),
        ("p.b", 5, True),
        ("p.q.c", 6, True),
        ("p.q.d", 7, True),
        ("p.b", 9, False),
        ("p.b.z", 9, True),
        ("p.x", 11, False),
        ("p.x.s", 11, True),
        ("p.x", 15, True),
        ("p.q.t", 18, True),
    ]
    # a package's __init__: relative imports start from the package itself
    assert imports_in("from . import a\nfrom .a import f\n", "p", True, {"p", "p.a"}) == [
        ("p.a", 1, True),
        ("p.a", 2, True),
    ]


def test_the_cycle_finder_by_hand():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c", "e"}, "e": set()}) == [
        ["a", "b"],
        ["c", "d"],
    ]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []


def test_the_layer_checker_by_hand():
    imports = {
        # allowed: an earlier package, its own, the bottom layer, any config, utils
        "hvdtrack.graphs.x": [
            ("hvdtrack.events.y", 1, True),
            ("hvdtrack.graphs.z", 2, True),
            ("hvdtrack.errors", 3, True),
            ("hvdtrack.train.config", 4, True),
            ("hvdtrack.utils.io", 5, True),
            ("hvdtrack.config", 6, True),
        ],
        # upward, in a function or not: reported once, not for the implied package import
        "hvdtrack.events.y": [("hvdtrack.graphs", 7, False), ("hvdtrack.graphs.x", 7, True)],
        "hvdtrack.config": [
            ("hvdtrack.events.synthetic", 1, True),  # the allow-list
            ("hvdtrack.train.config", 2, True),
            ("hvdtrack.train.loop", 3, True),
        ],
        "hvdtrack.model.config": [("hvdtrack.model.classifier", 2, True)],
        "hvdtrack.utils.io": [
            ("hvdtrack.errors", 1, True),
            ("hvdtrack.utils.console", 2, True),
            ("hvdtrack.config", 3, True),
        ],
        "hvdtrack.entry": [("hvdtrack.errors", 1, True), ("hvdtrack.events.synthetic", 2, True)],
        "hvdtrack.bench.model": [("hvdtrack.cli", 9, True), ("hvdtrack.train.loop", 9, True)],
        "hvdtrack.cli": [("hvdtrack.bench.model", 1, True)],
        "hvdtrack.train.loop": [("hvdtrack.bench.model", 4, True)],
    }
    assert layer_violations(imports) == [
        "hvdtrack.bench.model -> hvdtrack.cli (line 9)",
        "hvdtrack.config -> hvdtrack.train.loop (line 3)",
        "hvdtrack.entry -> hvdtrack.events.synthetic (line 2)",
        "hvdtrack.events.y -> hvdtrack.graphs.x (line 7)",
        "hvdtrack.model.config -> hvdtrack.model.classifier (line 2)",
        "hvdtrack.train.loop -> hvdtrack.bench.model (line 4)",
        "hvdtrack.utils.io -> hvdtrack.config (line 3)",
    ]
    with pytest.raises(LookupError, match="hvdtrack.somewhere.x is in no layer"):
        layer("hvdtrack.somewhere.x")


# ------------------------------------------------------------------------ the package, checked


def test_the_import_graph_is_read_from_the_source():
    assert len(MODULES) > 40
    assert "hvdtrack.entry" in GRAPH["hvdtrack.train.__main__"]
    assert GRAPH["hvdtrack.entry"] == {"hvdtrack.errors"}
    # imports inside functions count: each one that names a module of the package is an edge
    in_functions = {
        (name, node.module)
        for name, path in MODULES.items()
        for function in ast.walk(ast.parse(path.read_text()))
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
        for node in ast.walk(function)
        if isinstance(node, ast.ImportFrom)
        and node.module in MODULES
        # not the module itself nor its packages: those are imported before it runs
        and node.module not in {name, *parents(name)}
    }
    assert in_functions, "no function-level import of the package left to check against"
    assert {(name, module) for name, module in in_functions if module not in GRAPH[name]} == set()


def test_no_import_circle_among_the_package_modules():
    """Every import at any depth counts: a circle closed by a function-level import still ties
    the modules together (and fails when the function first runs in the wrong order)."""
    found = cycles(GRAPH)
    assert found == [], "import circles:\n" + "\n".join(describe(c) for c in found)


def _placed(name: str) -> bool:
    try:
        layer(name)
    except LookupError:
        return False
    return True


def test_every_module_has_a_layer():
    unplaced = [name for name in MODULES if not _placed(name)]
    assert unplaced == [], f"in no layer (add their package to ORDER): {unplaced}"


def test_no_module_imports_a_later_layer():
    """events -> graphs -> records -> prepare -> inputs -> model -> tracks -> runs ->
    distributed -> train -> evaluate -> reconstruct -> export -> scaling -> bench, then cli: a module imports its own
    package, the bottom layer and earlier packages only, at any depth."""
    placed = {name: found for name, found in IMPORTS.items() if _placed(name)}
    violations = layer_violations(placed)
    assert violations == [], "imports against the layer order:\n" + "\n".join(violations)


def test_only_the_command_line_imports_the_command_line():
    importers = {name for name, imports in GRAPH.items() if "hvdtrack.cli" in imports}
    assert importers <= {"hvdtrack.__main__"}
    # the command imports its commands lazily, by name: it depends on nothing but entry
    assert GRAPH["hvdtrack.cli"] == {"hvdtrack.entry"}


def python(code: str) -> dict:
    """Runs ``code`` in a fresh interpreter without TensorFlow variables in its environment, nor
    the record of settings a command supplied (left by a test that ran a command in this
    process), so a default that something sets shows; returns the JSON it prints last."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("TF_") and k != "HVDTRACK_SUPPLIED_SETTINGS"
    }
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
print(json.dumps({{"changed": changed, "set": {{k: after.get(k) for k in changed}},
                   "tensorflow": "tensorflow" in sys.modules,
                   "modules": sorted(m for m in sys.modules if m.startswith("hvdtrack"))}}))
"""


def test_import_hvdtrack_changes_no_setting_and_imports_nothing_heavy():
    seen = python(SNAPSHOT.format(body="import hvdtrack"))
    assert (seen["changed"], seen["tensorflow"], seen["modules"]) == ([], False, ["hvdtrack"])


@functools.cache
def set_by_tensorflow() -> tuple[tuple[str, str | None], ...]:
    """What ``import tensorflow`` alone sets in a fresh interpreter (name, value): TensorFlow's
    own, not the package's (TF2_BEHAVIOR, TPU_ML_PLATFORM, ... depending on its version)."""
    seen = python(SNAPSHOT.format(body="import tensorflow"))
    assert seen["tensorflow"]
    return tuple(sorted(seen["set"].items()))


def test_importing_every_module_sets_no_tensorflow_setting():
    names = sorted(MODULES)
    seen = python(
        SNAPSHOT.format(body=f"import importlib\nfor m in {names!r}: importlib.import_module(m)")
    )
    assert seen["tensorflow"] and set(names) <= set(seen["modules"])
    tensorflow_own = set(set_by_tensorflow())
    set_by_the_package = {
        name: value
        for name, value in seen["set"].items()
        if (name, value) not in tensorflow_own
        # bench.construct pins numpy's threads at import, for its own timing (see its docstring)
        and not name.endswith("_NUM_THREADS")
    }
    assert set_by_the_package == {}, f"(TensorFlow itself sets {dict(tensorflow_own)})"


def test_importing_every_module_leaves_tensorflows_threads_to_set():
    # A tensor made at import (a module-level tf.constant) starts TensorFlow's runtime, after
    # which the thread counts can no longer be set: a rank pinned to one core would run on all.
    names = sorted(MODULES)
    seen = python(
        "import importlib, json\n"
        f"for m in {names!r}: importlib.import_module(m)\n"
        "import tensorflow as tf\n"
        "try:\n"
        "    tf.config.threading.set_intra_op_parallelism_threads(1)\n"
        "    print(json.dumps('settable'))\n"
        "except RuntimeError as error:\n"
        "    print(json.dumps(str(error)))\n"
    )
    assert seen == "settable"


HEAVY = ("tensorflow", "sonnet", "graph_nets")
CONFIGS = sorted(path.name for path in (REPO / "configs").glob("*.yaml"))


def test_there_are_configs_to_load():
    assert "default.yaml" in CONFIGS


@pytest.mark.parametrize("config", CONFIGS)
def test_loading_a_config_imports_no_tensorflow(config):
    """Config sections live beside their code; loading one imports that code's config side only."""
    code = (
        "import json, sys\n"
        "from hvdtrack.config import load_config\n"
        f"load_config({f'configs/{config}'!r})\n"
        f"print(json.dumps({{'heavy': [m for m in {HEAVY!r} if m in sys.modules],\n"
        "  'modules': sorted(m for m in sys.modules if m.startswith('hvdtrack'))}))"
    )
    seen = python(code)
    assert seen["heavy"] == [], f"hvdtrack modules imported: {seen['modules']}"


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
    # bench gets the quiet log level, not the allocator: `bench model` chooses it by its model
    assert seen["changed"] == ["HVDTRACK_SUPPLIED_SETTINGS", "TF_CPP_MIN_LOG_LEVEL"]
    assert seen["set"]["HVDTRACK_SUPPLIED_SETTINGS"] == "TF_CPP_MIN_LOG_LEVEL"


def test_a_command_applies_its_settings_when_it_starts_and_explicit_values_win():
    seen = python(
        SNAPSHOT.format(
            body="from hvdtrack import cli\nos.environ['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
            "before['TF_CPP_MIN_LOG_LEVEL'] = '3'\n"
            "assert cli.main(['train', '--print-config']) == 0"
        )
    )
    assert seen["changed"] == [
        "HVDTRACK_SUPPLIED_SETTINGS",
        "TF_CPU_ALLOCATOR_USE_BFC",
        "TF_ENABLE_ONEDNN_OPTS",
    ]
    assert seen["set"]["TF_ENABLE_ONEDNN_OPTS"] == "0"
    # what the command supplied, not the log level the user set
    supplied = "TF_CPU_ALLOCATOR_USE_BFC,TF_ENABLE_ONEDNN_OPTS"
    assert seen["set"]["HVDTRACK_SUPPLIED_SETTINGS"] == supplied


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
