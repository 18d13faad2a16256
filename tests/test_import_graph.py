"""The module boundaries of `src/tracerl`, checked on its import graph — every import statement, those
inside functions included, read from the source (nothing is imported to build the graph).

- no import cycle between modules, nor between packages;
- `core` imports nothing else of tracerl; `contracts` imports only `core`; `envs` only `core` and
  `contracts`; `models` only those and `envs`;
- the stage packages (selection, synthesis, training, composition, evaluation, serve, baselines) import only
  `core`, `contracts`, `envs` and `models`, never each other;
- no module outside the environment registry and the domain itself imports a particular domain;
- library modules import at the top: an import inside a function is for the command modules
  (`tracerl.cli`, `tracerl.commands`: start-up time), optional extras, and the τ²-bench and ToolSandBox
  bridges, which run in the benchmark's own interpreter.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

SRC = Path(__file__).parents[1] / "src"
PACKAGE = SRC / "tracerl"
STAGE_PACKAGES = {"selection", "synthesis", "training", "composition", "evaluation", "serve", "baselines"}
ALLOWED = {
    "core": set(),
    "contracts": {"core"},
    "envs": {"core", "contracts"},
    "models": {"core", "contracts", "envs"},
    **{stage: {"core", "contracts", "envs", "models"} for stage in STAGE_PACKAGES},
}
# built-in domains: only the registry and the domain itself import them
DOMAINS = {"tracerl.envs.airline", "tracerl.envs.code", "tracerl.envs.toolsandbox", "tracerl.envs.toolsandbox_bridge"}
REGISTRY = "tracerl.envs.registry"
# Imports inside functions allowed outside the command modules: optional extras, and modules that run in
# another interpreter (the τ²-bench bridge runs in τ²-bench's, the ToolSandBox bridge in ToolSandBox's).
INNER_IMPORT_MODULES = {"tracerl.envs.tau2_bridge", "tracerl.envs.toolsandbox_bridge"}
OPTIONAL_EXTRAS = {"vllm", "trl", "gepa"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def resolve(name: str) -> str | None:
    """The module an imported name lives in (`tracerl.a.b.Name` → `tracerl.a.b`)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str) -> list[tuple[str, int, bool]]:
    """(imported tracerl module, line, inside a function) of every import statement of `module`."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        for name in names:
            target = resolve(name) if name.startswith("tracerl") else None
            if target is not None and target != module:
                found.append((target, node.lineno, id(node) not in top))
    return found


GRAPH = {m: imports(m) for m in MODULES}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_is_read():
    assert len(MODULES) > 80
    assert ("tracerl.core.errors", False) in [(t, inner) for t, _, inner in GRAPH["tracerl.core.io"]]


def test_no_module_cycle():
    assert cycles({m: {t for t, _, _ in edges} for m, edges in GRAPH.items()}) == []


def test_no_package_cycle():
    edges: dict[str, set[str]] = defaultdict(set)
    for module, targets in GRAPH.items():
        for target, _, _ in targets:
            if package_of(target) != package_of(module):
                edges[package_of(module)].add(package_of(target))
    assert cycles(edges) == []


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_a_package_imports_only_the_layers_below_it(package):
    wrong = [f"{module}:{line} imports {target}" for module, targets in GRAPH.items() if package_of(module) == package
             for target, line, _ in targets
             if package_of(target) != package and package_of(target) not in ALLOWED[package]]
    assert wrong == []


def test_only_the_registry_names_a_domain():
    wrong = [f"{module}:{line} imports {target}" for module, targets in GRAPH.items() for target, line, _ in targets
             if any(target == d or target.startswith(d + ".") for d in DOMAINS)
             and module != REGISTRY and not any(module == d or module.startswith(d + ".") for d in DOMAINS)]
    assert wrong == []


def test_library_modules_import_at_the_top():
    wrong = []
    for module, path in MODULES.items():
        if module in ("tracerl.cli",) or module.startswith("tracerl.commands") or module in INNER_IMPORT_MODULES:
            continue
        tree = ast.parse(path.read_text())
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
                name = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
                if (name or "").split(".")[0] not in OPTIONAL_EXTRAS:
                    wrong.append(f"{module}:{node.lineno} imports {name} inside a function")
    assert wrong == []
