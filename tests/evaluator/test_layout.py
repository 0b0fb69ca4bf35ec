"""The evaluator laid out along its process boundary (DESIGN.md, Layout): no import circles among
its modules, and the harness (what runs inside a child) never imports the host side or `sandbox/`.

The graph is built with `ast` from every import statement in every module, those inside functions
included (a deferred import is still a dependency). Run as a script it prints the circles it finds:
`python tests/evaluator/test_layout.py`.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "services.evaluator"
HOST_ONLY_PREFIXES = (f"{PACKAGE}.sandbox",)


def module_names(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the evaluator: dotted name -> file (a package by its `__init__`)."""
    base = root / PACKAGE.replace(".", "/")
    names = {}
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """module -> the evaluator's modules it imports (anywhere in its body)."""
    names = module_names(root)
    graph: dict[str, set[str]] = {name: set() for name in names}
    for name, path in names.items():
        is_package = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    anchor = name.split(".") if is_package else name.split(".")[:-1]
                    anchor = anchor[:len(anchor) - node.level + 1]
                    module = ".".join([*anchor, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                targets = [f"{module}.{alias.name}" for alias in node.names] + [module]
            for target in targets:
                found = _owning_module(target, names)
                if found is not None and found != name:
                    graph[name].add(found)
    return graph


def _owning_module(dotted: str, names: dict[str, Path]) -> str | None:
    """The evaluator module that `dotted` (a module, or a name inside one) refers to, if any."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in names:
            return candidate
    return None


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's import circles: its strongly connected components of more than one module
    (Tarjan's algorithm), each sorted; a module importing itself counts too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph.get(node, ()):
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def harness_leaks(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(harness module, what it imports) for every import of the host side or `sandbox/`."""
    harness = f"{PACKAGE}.harness"
    # timer/'s plan (the launch plan's models) and replay (the timer child's entry) run in a child;
    # its route is the host's.
    allowed = (harness, f"{PACKAGE}.languages", f"{PACKAGE}.protocol", f"{PACKAGE}.timer.plan",
               f"{PACKAGE}.timer.replay")
    leaks = []
    for module, imported in graph.items():
        if module == harness or module.startswith(harness + "."):
            leaks += [(module, target) for target in sorted(imported)
                      if target != PACKAGE and not any(target == a or target.startswith(a + ".") for a in allowed)]
    return leaks


def test_the_evaluator_has_no_import_circle():
    assert circles(import_graph()) == []


def test_the_harness_imports_neither_the_host_side_nor_the_sandbox():
    graph = import_graph()
    assert f"{PACKAGE}.harness.candidate" in graph  # the layout this test is about
    assert harness_leaks(graph) == []


def test_the_counter_finds_a_circle_and_a_leak(tmp_path):
    """The checks above can fail: a made-up evaluator with one circle and one leak."""
    base = tmp_path / "services" / "evaluator"
    (base / "harness").mkdir(parents=True)
    for path in ("services/__init__.py", "services/evaluator/__init__.py", "services/evaluator/harness/__init__.py"):
        (tmp_path / path).write_text("")
    (base / "evaluate.py").write_text("from services.evaluator.children import run_child\n")
    (base / "children.py").write_text("def f():\n    from services.evaluator import evaluate\n")
    (base / "harness" / "roles.py").write_text("from services.evaluator.evaluate import x\nfrom . import peer\n")
    (base / "harness" / "peer.py").write_text("")
    graph = import_graph(tmp_path)
    assert circles(graph) == [["services.evaluator.children", "services.evaluator.evaluate"]]
    assert harness_leaks(graph) == [("services.evaluator.harness.roles", "services.evaluator.evaluate")]
    assert "services.evaluator.harness.peer" in graph["services.evaluator.harness.roles"]


if __name__ == "__main__":
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT
    graph = import_graph(root)
    found = circles(graph)
    print(f"{len(graph)} modules, {sum(map(len, graph.values()))} imports, {len(found)} import circle(s)")
    for component in found:
        print("  circle:", ", ".join(m.removeprefix(PACKAGE + ".") for m in component))
    for module, target in harness_leaks(graph):
        print(f"  harness leak: {module} imports {target}")
