"""The package's layers hold: no module imports upward or sideways, no import cycle, one home per heavy library.

Every import counts, the ones inside functions included: a lazy import still ties the
importing module to what it imports. The rules are the layer picture of
``docs/architecture.md``; the orchestrator's freedom from torch is checked for real, in a
fresh interpreter, by ``test_importing_the_orchestrator_does_not_import_torch``.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT
from trainopt.contract import boundary

PACKAGE = ROOT / "trainopt"

# layer -> the layers it may import (its own included). ``base`` is errors, atomic and version.
ALLOWED = {
    "base": {"base"},
    "stats": {"base", "stats"},
    "knobs": {"base", "knobs"},
    "contract": {"base", "stats", "knobs", "contract"},
    "decide": {"base", "stats", "knobs", "contract", "decide"},
    "trial": {"base", "stats", "knobs", "contract", "trial"},
    "execute": {"base", "stats", "knobs", "contract", "decide", "execute"},
    "settings": {"base", "stats", "knobs", "contract", "trial", "settings"},
    "search": {"base", "stats", "knobs", "contract", "decide", "execute", "search"},
    "outputs": {"base", "stats", "knobs", "contract", "decide", "settings", "search", "outputs"},
}
BASE = {"errors", "atomic", "version"}
# The entry points on top may import anything.
TOP = {"trainopt", "trainopt.cli", "trainopt.__main__"}

# Heavy libraries and the only places that import them (module names or package prefixes).
HOMES = {
    "torch": ("trainopt.trial", "trainopt.settings.production"),
    "optuna": ("trainopt.search.store",),
    "ray": ("trainopt.execute.ray_executor",),
    "matplotlib": ("trainopt.outputs.report.plots",),
    "jinja2": ("trainopt.outputs.report.html",),
    "pandas": ("trainopt.outputs",),
    "rich": ("trainopt.search.progress",),
}
PURE_LAYERS = {"base", "stats", "knobs", "contract", "decide"}
# What the pure layers may import from outside the standard library.
PURE_THIRD_PARTY = {"numpy", "scipy", "pydantic", "yaml"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def layer_of(module: str) -> str | None:
    if module in TOP:
        return None
    first = module.split(".")[1]
    return "base" if first in BASE else first


def imports_of(module: str) -> list[tuple[str, int]]:
    """Every module this one imports, anywhere in its body, with the line: project modules by full name."""
    path = MODULES[module]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((sub if sub in MODULES else base, node.lineno))
    return found


def project_edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for target, _ in imports_of(module):
            # Importing a module also runs its packages' __init__; the root package's is the public API.
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != "trainopt" and target != module:
                edges[module].add(target)
    return edges


def test_every_module_sits_in_a_known_layer():
    unknown = [m for m in MODULES if m not in TOP and layer_of(m) not in ALLOWED]
    assert not unknown, f"modules outside every layer: {unknown}; put them in a layer or add the layer to ALLOWED"


def test_no_module_imports_upward_or_sideways():
    problems = []
    for module, targets in project_edges().items():
        layer = layer_of(module)
        if layer is None:
            continue
        for target in targets:
            if target in TOP:
                problems.append(f"{module} imports {target} (the entry points are on top)")
            elif layer_of(target) not in ALLOWED[layer]:
                problems.append(f"{module} ({layer}) imports {target} ({layer_of(target)})")
    assert not problems, "\n".join(sorted(problems))


def test_no_import_cycle_between_modules():
    edges = project_edges()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges[node]):
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
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    assert not cycles, f"import cycles (lazy imports included): {cycles}"


def test_heavy_libraries_have_one_home_each():
    problems = []
    for module in MODULES:
        for target, line in imports_of(module):
            root = target.split(".")[0]
            if root in HOMES and not any(module == h or module.startswith(h + ".") for h in HOMES[root]):
                problems.append(f"{module}:{line} imports {target}; only {', '.join(HOMES[root])} may")
    assert not problems, "\n".join(problems)


def test_the_pure_layers_import_only_numeric_and_validation_libraries():
    stdlib = set(sys.stdlib_module_names)
    problems = []
    for module in MODULES:
        if layer_of(module) not in PURE_LAYERS:
            continue
        for target, line in imports_of(module):
            root = target.split(".")[0]
            if root not in stdlib and root != "trainopt" and root not in PURE_THIRD_PARTY:
                problems.append(f"{module}:{line} imports {target}")
    assert not problems, "\n".join(problems)


def test_the_checker_sees_a_violation_and_a_cycle(tmp_path, monkeypatch):
    # The rules above must be able to fail: a planted upward import and a planted cycle.
    fake = {"trainopt.stats.a": "from trainopt.search import b\n", "trainopt.search.b": "import trainopt.stats.a\n"}
    paths = {}
    for name, text in fake.items():
        path = tmp_path / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        paths[name] = path
    monkeypatch.setattr(sys.modules[__name__], "MODULES", paths)
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    with pytest.raises(AssertionError, match=r"trainopt.stats.a \(stats\) imports trainopt.search.b \(search\)"):
        test_no_module_imports_upward_or_sideways()
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycle_between_modules()


def test_the_process_boundary_is_named_in_one_module():
    for name in boundary.ENTRY_MODULES + boundary.ARM_PRELOAD[2:]:
        assert importlib.util.find_spec(name) is not None, f"{name} is named in contract/boundary.py but does not exist"
    names = {boundary.PARENT_PID_VAR, boundary.FORKSERVER_PARENT_VAR, boundary.SLOT_CPUS_VAR,
             boundary.LAUNCH_STATUS_VAR, *boundary.ENTRY_MODULES}
    spelled = []
    for module, path in MODULES.items():
        if module == "trainopt.contract.boundary":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
                spelled.append(f"{module}:{node.lineno} spells {node.value!r}; use trainopt.contract.boundary")
    assert not spelled, "\n".join(spelled)


ORCHESTRATOR = [m for m in MODULES if layer_of(m) in {"stats", "knobs", "contract", "decide", "execute", "search", "outputs"}]


def test_importing_the_orchestrator_does_not_import_torch():
    code = (
        "import sys\n"
        f"for name in {ORCHESTRATOR + ['trainopt.cli', 'trainopt.settings.export']!r}:\n"
        "    __import__(name)\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]", out.stdout[:500]


def test_unit_tests_mirror_the_layers_with_one_basename_each():
    # pytest imports test modules by basename, so two test_x.py files in different folders clash.
    tests = sorted((ROOT / "tests").rglob("test_*.py"))
    names = [p.name for p in tests]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})
    folders = {p.parent.name for p in tests if p.parent.parent == ROOT / "tests" / "unit"}
    assert folders <= set(ALLOWED) - {"base"}, f"unit test folders that are no layer: {folders - set(ALLOWED)}"


def test_no_module_is_over_600_lines():
    # A module past this has more than one job; split it along them.
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text(encoding="utf-8").splitlines())) > 600}
    assert not long, f"modules over 600 lines: {long}"
