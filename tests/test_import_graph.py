"""No import circle in counterd, predictor or microbench (issue 30).

The graph is read from the source with the stdlib ``ast``, nothing is imported. Every import
statement counts, wherever it stands: at module level, inside a function (a lazy import kept
out of start-up) and under ``if TYPE_CHECKING:``. A circle through a deferred import does not
break the import order, but it ties the modules together all the same: neither can be read,
tested or moved without the other, and the layering the folder names promise is false. Counting
module-level imports only would pass the six-file circle the issue found in counterd/markers/,
most of whose upward arrows were lazy. The import-linter contracts in pyproject.toml count the
same imports.

An arrow goes to the module an import names (``from counterd.markers import identity`` is an
arrow to ``counterd.markers.identity``), not to the packages Python initialises on the way
(their ``__init__``), as import-linter draws it too: a package's face re-exports what is below
it, and counting it would make every module of a package a circle with its face.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("counterd", "predictor", "microbench")


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom,
             known: dict[str, Path]) -> Iterator[str]:
    """The project modules one import statement names."""

    def resolve(name: str) -> str | None:
        while name and name not in known:  # a name inside a module: the module
            name = name.rpartition(".")[0]
        return name or None

    if isinstance(node, ast.Import):
        for alias in node.names:
            if (target := resolve(alias.name)) is not None:
                yield target
        return
    base = node.module or ""
    if node.level:  # relative: from the importing module's package
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    for alias in node.names:
        full = f"{base}.{alias.name}"
        target = full if full in known else resolve(base)
        if target is not None:
            yield target


@functools.cache
def import_graph() -> dict[str, dict[str, int]]:
    """module -> {imported module: line of the first import of it} (read once per session:
    parsing the three packages is most of this file's time)."""
    known = _modules()
    graph: dict[str, dict[str, int]] = {}
    for module, path in known.items():
        arrows: dict[str, int] = {}
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(module, path.name == "__init__.py", node, known):
                    if target != module:
                        arrows.setdefault(target, node.lineno)
        graph[module] = arrows
    return graph


def circles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def _describe(graph: dict[str, dict[str, int]], circle: list[str]) -> str:
    members = set(circle)
    arrows = [f"    {a} -> {b} (line {line})" for a in circle
              for b, line in sorted(graph[a].items()) if b in members]
    return f"  circle of {len(circle)}: {', '.join(circle)}\n" + "\n".join(arrows)


def test_the_graph_is_read() -> None:
    # The reader itself: arrows it must see, of every kind it claims to count.
    graph = import_graph()
    assert "counterd.data.errors" in graph["counterd.commands.cli"]  # module level, from-import
    assert "counterd.markers.identity" in graph["counterd.markers.api"]  # a submodule by name
    assert "counterd.markers.sinks.socket" in graph["counterd.markers.sinks"]  # in a function
    assert "counterd.markers.sinks.base" in graph["counterd.markers.sinks.memory"]  # type-only
    assert circles({"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}}) \
        == [["a", "b", "c"]]
    assert circles({"a": {"b": 1}, "b": {}}) == []


def test_no_import_circle() -> None:
    graph = import_graph()
    found = circles(graph)
    assert not found, "import circles (each arrow: importer -> imported, at its first " \
        "import line):\n" + "\n".join(_describe(graph, c) for c in found)



MAX_MODULE_LINES = 600  # issue 30: a module a reader can hold in mind
MAX_C_LINES = 700


def test_no_product_module_over_600_lines_and_no_c_file_over_700() -> None:
    """Every module of counterd, predictor and microbench is at most 600 lines, every C source
    of the native extensions at most 700: a concept that outgrows its file is split by concept
    (issue 30), not left to grow."""
    long_py = {str(p.relative_to(ROOT)): n for p in _modules().values()
               if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    c_files = sorted((ROOT / "counterd" / "_native").rglob("*.[ch]"))
    long_c = {str(p.relative_to(ROOT)): n for p in c_files
              if (n := len(p.read_text().splitlines())) > MAX_C_LINES}
    assert len(_modules()) > 100 and c_files
    assert not long_py, long_py
    assert not long_c, long_c
