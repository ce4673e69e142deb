"""The package's layout (issue 24): a package per concern, one name per concept, small modules,
no reaching into another module's private names. Pure file reading: nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.test_imports import ORDER

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "hvdtrack"

# The packages of the data flow (one list: the import test's layer order) and utils.
CONCERNS = (*ORDER, "utils")
MAX_MODULE_LINES = 500
MAX_TRAIN_LINES = 2000
MAX_FOLDER_SHARE = 0.15  # of the package's Python lines, for any top-level folder of hvdtrack/
THE_PIPELINE = "hvdtrack/inputs/pipeline.py"  # the tf.data one; no other module takes the name


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def module_name(path: str) -> str:
    parts = Path(path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


SOURCES = {relative(p): p.read_text() for p in sorted(PACKAGE.rglob("*.py"))}
LINES = {path: len(text.splitlines()) for path, text in SOURCES.items()}
MODULES = {module_name(path): path for path in SOURCES}


# ------------------------------------------------------------------------------ the measures


def modules_over(lines: dict[str, int], limit: int) -> list[str]:
    return [f"{path}: {n} lines" for path, n in sorted(lines.items()) if n > limit]


def folder_lines(lines: dict[str, int], package: str = "hvdtrack") -> dict[str, int]:
    """Python lines per top-level folder of ``package`` (modules directly in it count for the
    package's total only)."""
    folders: dict[str, int] = {}
    for path, n in lines.items():
        parts = Path(path).parts
        if len(parts) > 2 and parts[0] == package:
            folder = f"{package}/{parts[1]}"
            folders[folder] = folders.get(folder, 0) + n
    return folders


def folders_over(lines: dict[str, int], share: float) -> list[str]:
    total = sum(lines.values())
    return [
        f"{folder}: {n:,} of {total:,} lines ({n / total:.1%} > {share:.0%})"
        for folder, n in sorted(folder_lines(lines).items())
        if n > share * total
    ]


def private_imports(source: str, name: str, is_package: bool, modules) -> list[str]:
    """``line N: from a import _x`` for each private name module ``name`` takes from another
    module of the package: ``from hvdtrack.a import _x`` (relative too), and ``a._x`` on a name
    bound to a module of the package (``import hvdtrack.a as a``, ``from hvdtrack import a``)."""
    package = name if is_package else name.rpartition(".")[0]
    root = name.partition(".")[0]

    def private(attribute: str) -> bool:
        return attribute.startswith("_") and not (
            attribute.startswith("__") and attribute.endswith("__")
        )

    tree = ast.parse(source)
    bound: dict[str, str] = {}  # local name -> module of the package
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.partition(".")[0] == root:
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound[root] = root
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base]).strip(".")
            if base.partition(".")[0] != root:
                continue
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    bound[alias.asname or alias.name] = f"{base}.{alias.name}"
                if private(alias.name) and base != name:
                    line = getattr(alias, "lineno", node.lineno)  # its own line, from 3.10
                    found.append((line, f"from {base} import {alias.name}"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and private(node.attr):
            chain: list[str] = []
            value = node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in bound:
                module = ".".join([bound[value.id], *chain])
                if module in modules and module != name:
                    found.append((node.lineno, f"{module}.{node.attr}"))
    return [f"line {line}: {what}" for line, what in sorted(set(found))]


# ------------------------------------------------------------------------- the measures, by hand


def test_the_measures_by_hand():
    lines = {
        "hvdtrack/cli.py": 100,
        "hvdtrack/a/x.py": 501,
        "hvdtrack/a/y.py": 99,
        "hvdtrack/b/__init__.py": 300,
        "hvdtrack/b/c/deep.py": 0,
    }
    assert modules_over(lines, 500) == ["hvdtrack/a/x.py: 501 lines"]
    assert folder_lines(lines) == {"hvdtrack/a": 600, "hvdtrack/b": 300}
    assert folders_over(lines, 0.5) == ["hvdtrack/a: 600 of 1,000 lines (60.0% > 50%)"]
    assert folders_over(lines, 0.6) == []


def test_the_private_import_finder_by_hand():
    source = (
        "import hvdtrack.a.b\n"
        "import hvdtrack.a.b as ab\n"
        "from hvdtrack.a import _x, y, __version__\n"  # 3: _x
        "from hvdtrack.a import b as bee\n"
        "from . import _sibling\n"  # 5: relative (p.q is hvdtrack.q: hvdtrack._sibling)
        "from .b import _z\n"  # 6
        "from os import _exit\n"  # not the package's
        "def f():\n"
        "    from hvdtrack.q import _mine\n"  # its own module: fine
        "    return (hvdtrack.a.b._p, ab._q, bee._r, bee.__doc__, ab.public, _mine)\n"  # 10: 3
        "class K:\n"
        "    def _own(self):\n"
        "        return self._own, hvdtrack.a.b.c._s\n"  # not a module: fine
    )
    modules = {"hvdtrack", "hvdtrack.a", "hvdtrack.a.b", "hvdtrack.b", "hvdtrack.q"}
    assert private_imports(source, "hvdtrack.q", False, modules) == [
        "line 3: from hvdtrack.a import _x",
        "line 5: from hvdtrack import _sibling",
        "line 6: from hvdtrack.b import _z",
        "line 10: hvdtrack.a.b._p",
        "line 10: hvdtrack.a.b._q",
        "line 10: hvdtrack.a.b._r",
    ]


# ------------------------------------------------------------------------------ the package


def test_the_package_is_read():
    assert len(SOURCES) > 40 and THE_PIPELINE in SOURCES


def test_one_module_named_pipeline():
    named = [path for path in SOURCES if Path(path).name == "pipeline.py"]
    assert named == [THE_PIPELINE], f"modules named pipeline.py: {named}"


def test_no_module_over_500_lines():
    over = modules_over(LINES, MAX_MODULE_LINES)
    assert over == [], f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(over)


def test_training_is_at_most_2000_lines():
    train = {path: n for path, n in LINES.items() if path.startswith("hvdtrack/train/")}
    total = sum(train.values())
    listing = "\n".join(f"{path}: {n}" for path, n in sorted(train.items()))
    assert (
        total <= MAX_TRAIN_LINES
    ), f"hvdtrack/train/: {total:,} lines > {MAX_TRAIN_LINES:,}:\n{listing}"


def test_no_folder_holds_more_than_15_percent_of_the_package():
    over = folders_over(LINES, MAX_FOLDER_SHARE)
    assert over == [], "\n".join(over)


@pytest.mark.parametrize("concern", CONCERNS)
def test_a_package_per_concern(concern):
    folder = PACKAGE / concern
    assert folder.is_dir() and any(folder.glob("*.py")), f"hvdtrack/{concern}/ has no module"


def test_no_module_imports_a_private_name_of_another():
    found = [
        f"{path}: {what}"
        for name, path in MODULES.items()
        for what in private_imports(SOURCES[path], name, path.endswith("__init__.py"), MODULES)
    ]
    assert found == [], "private names taken from another module:\n" + "\n".join(found)
