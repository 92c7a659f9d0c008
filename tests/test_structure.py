"""The code's shape, checked: no module over 400 lines, no function over 60, no import cycle
between the project's modules nor between its packages (imports inside functions count: a lazy
import is still a dependency), and the K-process package imported only where it is wanted."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*ROOT.glob("ppsd/**/*.py"), *ROOT.glob("app/**/*.py"), *ROOT.glob("tools/**/*.py"), ROOT / "app.py"])
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The project modules `path` imports (resolving relative imports; `from x import y` counts
    x.y when that is a module)."""
    name, known = module_name(path), {module_name(p) for p in SOURCES}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(ROOT)): n for p in SOURCES if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long


def test_no_function_is_over_60_lines():
    long = {}
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.lineno} {node.name}"] = lines
    assert not long


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (its nodes in order, the first repeated at the end), or None."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return path[path.index(target):] + [target]
            if target not in state and (found := visit(target, path + [target])):
                return found
        state[node] = "done"
        return None

    return next((found for node in sorted(graph) if node not in state and (found := visit(node, [node]))), None)


def module_graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports; a package's `__init__` re-exporting its own
    modules is no dependency on them (edges parent -> child dropped)."""
    graph = {module_name(p): imports(p) for p in SOURCES}
    return {m: {t for t in targets if not t.startswith(m + ".")} for m, targets in graph.items()}


def test_no_import_cycle():
    found = cycle(module_graph())
    assert found is None, "import cycle: " + " -> ".join(found)


def package_of(module: str, packages: set[str]) -> str:
    """The unit `module` counts in for layering: its package below `ppsd` or `app` (every module of
    `ppsd.executors`, its `distributed` package included, is `ppsd.executors`); a module directly
    in `ppsd` or `app` is a unit of its own."""
    top = ".".join(module.split(".")[:2])
    return top if top != module and top in packages else module


def test_every_arrow_points_down_between_packages():
    """Packages are layers: with each package's modules taken as one (`package_of`), the imports
    still form no cycle, so one order of the packages and top-level modules has every import
    pointing down it. (The executors reaching up to `ppsd.generate` for the warm-up, or the head
    trainer to the CLI, made a cycle here though no two modules formed one.)"""
    modules = module_graph()
    packages = {m for m in modules if any(other.startswith(m + ".") for other in modules)}
    edges: dict[tuple[str, str], list[str]] = {}
    for module, targets in modules.items():
        for target in targets:
            low, high = package_of(module, packages), package_of(target, packages)
            if low != high and not high.startswith(low + "."):
                edges.setdefault((low, high), []).append(f"{module} -> {target}")
    graph: dict[str, set[str]] = {}
    for low, high in edges:
        graph.setdefault(low, set()).add(high)
    found = cycle(graph)
    assert found is None, "packages in a cycle: " + "; ".join(
        ", ".join(edges[pair]) for pair in zip(found, found[1:]))


@pytest.mark.parametrize("module", ["ppsd.compare", "ppsd.generate", "app.request"])
def test_the_k_process_package_is_not_imported_by(module):
    """`ppsd.executors.distributed` brings torch.distributed: a comparison, a decode or the
    page's plain request data must not pull it in (in a fresh interpreter: a test imports it)."""
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith('ppsd.executors.distributed')))"
    found = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]", f"importing {module} imported {found.stdout.strip()}"
