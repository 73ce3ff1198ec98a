"""The folders are layers: no module imports (even lazily, inside a function) from a layer above it.

Lowest first. A module may import its own unit and anything in a lower or equal layer. The
package root `tpsample/__init__.py` is the public facade: it re-exports from every layer (the
engine lazily), so it is checked as an import target (at the sampler's layer) but not as an importer.
"""
from __future__ import annotations

import ast
import pathlib

import tpsample

LAYERS = [
    {"numerics", "noise", "params", "coerce", "validation", "term"},   # leaves
    {"kernels"},
    {"state"},
    {"sampling"},
    {"parallel"},
    {"sampler", "replay", "ops", "__init__"},
    {"model", "testing"},
    {"engine"},
    {"llm"},
    {"serve"},
    {"demo", "bench"},
    {"cli"},
]
RANK = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}
ROOT = pathlib.Path(tpsample.__file__).parent


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: pathlib.Path, module: str, package: str):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            targets = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        yield from (t for t in targets if t == "tpsample" or t.startswith("tpsample."))


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            module = package = ".".join(parts[:-1])
        else:
            module, package = ".".join(parts), ".".join(parts[:-1])
        yield path, module, package


def test_every_unit_of_the_package_has_a_layer():
    units = {_unit(module) for _, module, _ in _modules()}
    assert units - set(RANK) == set(), "place new folders/modules in LAYERS"


def test_no_module_imports_from_a_layer_above_it():
    upward = []
    for path, module, package in _modules():
        unit = _unit(module)
        if unit == "__init__":
            continue
        for target in _imports(path, module, package):
            if RANK[_unit(target)] > RANK[unit]:
                upward.append(f"{module} imports {target}")
    assert upward == []


def _module_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (a `from pkg import name` counts as pkg.name when
    that is a module, else as pkg; a package's parents are not counted)."""
    modules = {module: (path, package) for path, module, package in _modules()}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, (path, package) in modules.items():
        for target in _imports(path, module, package):
            parent = target.rsplit(".", 1)[0]
            hit = target if target in modules else parent if parent in modules else None
            if hit and hit != module and not module.startswith(hit + "."):
                graph[module].add(hit)
    return graph


def test_no_import_cycles_between_modules():
    graph = _module_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v):                                       # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while comp[-1:] != [v]:
                comp.append(stack.pop())
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []
