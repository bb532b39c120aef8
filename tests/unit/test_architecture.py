"""Issue 22: no import circle between calibrun's modules (module-level imports, as Python runs them at import
time; imports inside functions are how a lower layer reaches a higher one lazily, and are allowed)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "calibrun"


def _module_graph() -> dict[str, set[str]]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    edges: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.parse(path.read_text()).body:
            for statement in (node.body if isinstance(node, ast.If) else [node]):  # TYPE_CHECKING blocks too
                if isinstance(statement, ast.Import):
                    edges[name] |= {a.name for a in statement.names if a.name in modules}
                elif isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module in modules:
                    for alias in statement.names:
                        target = f"{statement.module}.{alias.name}"
                        edges[name].add(target if target in modules else statement.module)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    edges = _module_graph()
    assert "calibrun.quant.calibrate" in edges["calibrun.config"]  # the graph is read (config assembles the schema)
    assert _cycles(edges) == []
