"""The core's shape: every module of memory_app imports only modules of its own layer or of
the layers below it, and there is no import cycle (function-level imports count; imports under
``if TYPE_CHECKING:`` do not)."""

from __future__ import annotations

import ast
from pathlib import Path

import memory_app

ROOT = Path(memory_app.__file__).parent

# Layers from the bottom up, as the README's Layout shows them. A module not named here sits
# with the adapters (the top), which may import everything below.
LAYERS: list[set[str]] = [
    {"types", "exceptions", "conf", "models", "signals", "routers"},
    {"validation", "tokens", "encryption", "importance", "providers", "aio"},
    {"store"},
    {"services"},
    {"memory", "learned"},
]


def layer_of(module: str) -> int:
    head = module.split(".")[1] if "." in module else ""
    for index, names in enumerate(LAYERS):
        if head in names:
            return index
    return len(LAYERS)


def _modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text())
    skipped = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            candidates = [module] + [f"{module}.{alias.name}" for alias in node.names]
        else:
            continue
        for target in candidates:
            while target and target not in modules:
                target = target.rsplit(".", 1)[0] if "." in target else ""
            if target and target != name and not name.startswith(target + "."):
                targets.add(target)
    return targets


def test_no_module_imports_a_layer_above_its_own():
    modules = _modules()
    upward = [
        f"{name} (layer {layer_of(name) + 1}) imports {target} (layer {layer_of(target) + 1})"
        for name, path in modules.items()
        if name != "memory_app"
        for target in _imports(name, path, modules)
        if target != "memory_app" and layer_of(target) > layer_of(name)
    ]
    assert upward == []


def test_there_is_no_import_cycle():
    modules = _modules()
    graph = {name: _imports(name, path, modules) - {"memory_app"} for name, path in modules.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for target in graph[node]:
            if state.get(target) == 1:
                cycles.append(
                    trail[trail.index(target) :] + [target] if target in trail else [node, target]
                )
            elif target not in state:
                visit(target, [*trail, target])
        state[node] = 2

    for name in graph:
        if name not in state:
            visit(name, [name])
    assert cycles == []
