"""The package's import graph: no import cycle, and the layers of docs/architecture.md.

The graph is read from the source with ``ast``; nothing is imported. It holds every
``import`` and ``from … import`` of every module of ``django_leasejobs``, wherever it
stands (module level, in a function, under ``if TYPE_CHECKING:``), relative ones
resolved. ``from pkg import name`` imports the submodule ``pkg.name`` when there is one,
else the package ``pkg`` itself. An import of ``a.b.c`` also imports the packages ``a.b``
and ``a``, whose ``__init__`` runs first; but not for a module inside ``a.b``: Python
started ``a`` and ``a.b`` before the module itself, so reaching them runs nothing (a
module that takes a name from its own package's ``__init__`` names that package, and
that import counts).
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import django_leasejobs

PACKAGE = django_leasejobs.__name__
PACKAGE_DIR = Path(django_leasejobs.__file__).resolve().parent

MODULE_LEVEL = "module level"
IN_A_FUNCTION = "in a function"
TYPE_CHECKING_ONLY = "TYPE_CHECKING"


@dataclass(frozen=True, slots=True)
class Edge:
    """One import statement of a module that imports another module of the package."""

    source: str
    target: str
    path: str
    line: int
    how: str
    """``MODULE_LEVEL``, ``IN_A_FUNCTION`` or ``TYPE_CHECKING_ONLY``."""

    def __str__(self) -> str:
        return f"{self.source} -> {self.target}  ({self.path}:{self.line}, {self.how})"


Graph = Mapping[str, Mapping[str, Sequence[Edge]]]
"""importer -> imported -> the statements that import it, in source order."""

LAYERS = (
    (
        f"{PACKAGE}.leases",
        (f"{PACKAGE}.worker", f"{PACKAGE}.admin", f"{PACKAGE}.backend", f"{PACKAGE}.management"),
    ),
    (f"{PACKAGE}.worker", (f"{PACKAGE}.admin",)),
    (f"{PACKAGE}.tracing", (f"{PACKAGE}.worker",)),
)
"""DESIGN.md's dependency direction: what each part (a module, or a package and all its
modules) must never import, directly or through another module."""


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    modules = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def ancestors(name: str) -> Iterator[str]:
    """``a.b`` and ``a`` for ``a.b.c``."""
    parts = name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        yield ".".join(parts[:end])


def within(name: str, part: str) -> bool:
    """Whether the module ``name`` is ``part`` or one of its modules."""
    return name == part or name.startswith(f"{part}.")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(
    nodes: Iterable[ast.AST], how: str
) -> Iterator[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement in ``nodes`` and under them, with where it stands."""
    for node in nodes:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node, how
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inner = IN_A_FUNCTION if how == MODULE_LEVEL else how
            yield from _imports(ast.iter_child_nodes(node), inner)
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            yield from _imports(node.body, TYPE_CHECKING_ONLY)
            yield from _imports(node.orelse, how)
        else:
            yield from _imports(ast.iter_child_nodes(node), how)


def _named(
    importer: str, node: ast.Import | ast.ImportFrom, modules: Mapping[str, Path]
) -> Iterator[str]:
    """The package's modules an import statement names (not the packages that run first)."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name.partition(".")[0] == PACKAGE:
                assert alias.name in modules, f"{importer} imports {alias.name}: no such module"
                yield alias.name
        return
    base = node.module or ""
    if node.level:
        package = (
            importer if modules[importer].name == "__init__.py" else importer.rpartition(".")[0]
        )
        parts = package.split(".")
        base = ".".join([*parts[: len(parts) - node.level + 1], *([base] if base else [])])
    if base.partition(".")[0] != PACKAGE:
        return
    assert base in modules, f"{importer} imports from {base}: no such module"
    for alias in node.names:
        submodule = f"{base}.{alias.name}"
        yield submodule if submodule in modules else base


def import_graph() -> dict[str, dict[str, list[Edge]]]:
    """The package's import graph (the module docstring says what counts)."""
    modules = module_files()
    graph: dict[str, dict[str, list[Edge]]] = {name: {} for name in modules}
    for importer, path in modules.items():
        started = {importer, *ancestors(importer)}
        shown = str(path.relative_to(PACKAGE_DIR.parent))
        tree = ast.parse(path.read_text(), filename=shown)
        for node, how in _imports(tree.body, MODULE_LEVEL):
            reached = set()
            for named in _named(importer, node, modules):
                reached.add(named)
                reached.update(a for a in ancestors(named) if a not in started)
            for target in sorted(reached - {importer}):
                edge = Edge(importer, target, shown, node.lineno, how)
                graph[importer].setdefault(target, []).append(edge)
    return graph


def strongly_connected(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def shortest_cycle(graph: Graph, start: str) -> list[Edge]:
    """A shortest cycle through ``start``, as the first import statement of each step."""
    came_by: dict[str, Edge] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt, edges in sorted(graph[node].items()):
            if nxt == start:
                path = [edges[0]]
                while path[0].source != start:
                    path.insert(0, came_by[path[0].source])
                return path
            if nxt not in came_by:
                came_by[nxt] = edges[0]
                queue.append(nxt)
    raise AssertionError(f"{start} is on no cycle")


def reachable(graph: Graph, start: str) -> dict[str, list[Edge]]:
    """Every module importing ``start`` can import, with a shortest chain of imports, in
    breadth-first order (nearest first)."""
    chains: dict[str, list[Edge]] = {start: []}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt, edges in sorted(graph[node].items()):
            if nxt not in chains:
                chains[nxt] = [*chains[node], edges[0]]
                queue.append(nxt)
    return chains


def _chain(edges: Sequence[Edge]) -> str:
    return "\n".join(f"    {edge}" for edge in edges)


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    cycles = []
    for component in strongly_connected(graph):
        shown: set[frozenset[str]] = set()
        for module in component:
            cycle = shortest_cycle(graph, module)
            if frozenset(edge.source for edge in cycle) not in shown:
                shown.add(frozenset(edge.source for edge in cycle))
                cycles.append(_chain(cycle))
    assert not cycles, f"{len(cycles)} import cycle(s):\n" + "\n\n".join(cycles)


def test_the_layers_import_downwards_only() -> None:
    graph = import_graph()
    wrong = []
    for part, forbidden in LAYERS:
        for module in sorted(m for m in graph if within(m, part)):
            chains = reachable(graph, module)
            for other in forbidden:
                # the nearest module of ``other`` (chains are in breadth-first order)
                hit = next((m for m in chains if within(m, other)), None)
                if hit is not None:
                    wrong.append(f"{module} imports {hit}:\n{_chain(chains[hit])}")
    assert not wrong, "\n\n".join(wrong)


def test_the_graph_sees_every_kind_of_import() -> None:
    """The rules of the module docstring, on imports the package has."""
    graph = import_graph()
    # relative, at module level
    (edge,) = graph[f"{PACKAGE}.backend"][f"{PACKAGE}.results"]
    assert edge.how == MODULE_LEVEL
    # `from .. import leases` is the package leases, `from . import transitions` a module
    assert f"{PACKAGE}.leases" in graph[f"{PACKAGE}.worker.loop"]
    assert f"{PACKAGE}.schedules.transitions" in graph[f"{PACKAGE}.schedules.scheduler"]
    # a module's own packages were started before it: no edge to them
    assert f"{PACKAGE}.schedules" not in graph[f"{PACKAGE}.schedules.scheduler"]
    assert PACKAGE not in graph[f"{PACKAGE}.backend"]
    # importing a submodule from outside runs its package
    assert f"{PACKAGE}.schedules" in graph[f"{PACKAGE}.worker.scheduler"]
    # in a function, and under TYPE_CHECKING
    assert [e.how for e in graph[f"{PACKAGE}.queues"][f"{PACKAGE}.backend"]] == [IN_A_FUNCTION]
    assert {e.how for e in graph[PACKAGE][f"{PACKAGE}.lease_task"]} == {TYPE_CHECKING_ONLY}
