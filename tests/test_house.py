"""The house rules that keep trainsim cheap to extend, checked on the source tree itself.

- every source module is under 700 lines;
- no function is over 80 lines (docstring excluded) unless a comment just above it, or on its
  ``def`` line, says why (it names "80 lines" or carries the solver's ``noqa`` with a reason);
- layering: ``hwmodel`` imports nothing from ``workload``, ``scenarios`` or ``plots``; ``workload``
  nothing from ``scenarios`` or ``plots`` at module level; ``plots`` only draws (no ``workload``);
- the scenario layer's module-level imports form no cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("hwmodel", "workload", "scenarios", "plots")
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80


def _modules() -> list[Path]:
    return sorted(p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py"))


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _top_level_imports(tree: ast.Module) -> set[str]:
    """Modules imported at module level (function-local imports defer a heavy import on purpose)."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.If):  # ``if TYPE_CHECKING:`` blocks are not run-time imports
            continue
    return names


def _body_lines(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    first = fn.body[0]
    has_doc = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and \
        isinstance(first.value.value, str)
    start = (first.end_lineno + 1) if has_doc and len(fn.body) > 1 else fn.lineno
    return fn.end_lineno - start + 1


def _says_why(lines: list[str], fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
    above = " ".join(lines[max(0, first - 4):first - 1])
    def_line = lines[fn.lineno - 1]
    return "80 lines" in above or ("noqa" in def_line and "#" in above)


def test_modules_under_700_lines():
    long = {str(p.relative_to(ROOT)): n for p in _modules()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert not long, f"modules over {MAX_MODULE_LINES} lines: {long}"


def test_long_functions_say_why():
    unexplained = []
    for p in _modules():
        text = p.read_text(encoding="utf-8")
        lines = text.splitlines()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    _body_lines(node) > MAX_FUNCTION_LINES and not _says_why(lines, node):
                unexplained.append(f"{p.relative_to(ROOT)}:{node.lineno} {node.name} ({_body_lines(node)} lines)")
    assert not unexplained, "functions over 80 lines with no comment saying why: " + "; ".join(unexplained)


@pytest.mark.parametrize(("package", "forbidden"), [
    ("hwmodel", ("workload", "scenarios", "plots")),
    ("workload", ("scenarios", "plots")),
    ("plots", ("workload",)),
])
def test_layering(package, forbidden):
    bad = []
    for p in sorted((ROOT / package).rglob("*.py")):
        for name in _top_level_imports(ast.parse(p.read_text(encoding="utf-8"))):
            if name.split(".")[0] in forbidden:
                bad.append(f"{p.relative_to(ROOT)} imports {name}")
    assert not bad, "; ".join(bad)


def test_scenario_layer_imports_form_no_cycle():
    graph = nx.DiGraph()
    known = {_module_name(p) for p in _modules()}
    for p in sorted((ROOT / "scenarios").rglob("*.py")):
        me = _module_name(p)
        graph.add_node(me)
        for name in _top_level_imports(ast.parse(p.read_text(encoding="utf-8"))):
            if name.startswith("scenarios") and name in known and name != me:
                graph.add_edge(me, name)
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles in the scenario layer: {cycles}"


def test_the_checks_can_fail(tmp_path):
    """The function-length rule sees a long function without a reason, and accepts one with it."""
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES + 1))
    src = f"def f():\n    \"\"\"Doc.\"\"\"\n{body}\n"
    fn = ast.parse(src).body[0]
    assert _body_lines(fn) == MAX_FUNCTION_LINES + 1
    assert not _says_why(src.splitlines(), fn)
    src2 = "# Over 80 lines: a flat table of cases.\n" + src
    assert _says_why(src2.splitlines(), ast.parse(src2).body[0])
