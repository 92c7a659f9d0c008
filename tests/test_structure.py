"""The code's shape, checked: no module over 400 lines, no function over 60, no import cycle
between the project's modules (imports inside functions count: a lazy import is still a
dependency), and the K-process package imported only where it is wanted."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted([*ROOT.glob("ppsd/**/*.py"), *ROOT.glob("app/**/*.py"), *ROOT.glob("tools/*.py"), ROOT / "app.py"])
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


def test_no_import_cycle():
    graph = {module_name(p): imports(p) for p in SOURCES}
    # A package's __init__ re-exporting its own modules is not a cycle: drop edges parent -> child.
    graph = {m: {t for t in targets if not t.startswith(m + ".")} for m, targets in graph.items()}
    state: dict[str, str] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                pytest.fail("import cycle: " + " -> ".join(path[path.index(target):] + [target]))
            if target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize("module", ["ppsd.compare", "ppsd.generate", "app.request"])
def test_the_k_process_package_is_not_imported_by(module):
    """`ppsd.executors.distributed` brings torch.distributed: a comparison, a decode or the
    page's plain request data must not pull it in (in a fresh interpreter: a test imports it)."""
    code = f"import sys, {module}; print(sorted(m for m in sys.modules if m.startswith('ppsd.executors.distributed')))"
    found = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]", f"importing {module} imported {found.stdout.strip()}"
