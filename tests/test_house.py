"""The house rules: layers between packages, no import circles, small modules and functions, a true map.

Why a test: the layout is what a newcomer reads first, and it decays one convenient import at a
time. These checks make the rules the code's, not a reviewer's memory (docs/architecture.md).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "flight"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    """Every module of the package but the generated protobuf code."""
    return sorted(p for p in PACKAGE.rglob("*.py") if "_proto" not in p.relative_to(PACKAGE).parts)


def test_the_layer_contracts_hold() -> None:
    """``[tool.importlinter]`` in pyproject.toml: each package imports only the packages below it."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout, done.stdout[-3000:]


def test_no_module_imports_itself_back_through_others() -> None:
    """No import circle between any two modules (late imports included; imports for the type checker only aside)."""
    graph = grimp.build_graph("flight", exclude_type_checking_imports=True)
    circles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            if module < imported and graph.chain_exists(importer=imported, imported=module):
                circles.append(f"{module} <-> {imported}: {' -> '.join(graph.find_shortest_chain(importer=imported, imported=module) or ())}")
    assert not circles, "\n".join(circles)


def test_the_sql_translation_has_no_circle_even_for_the_type_checker() -> None:
    """flight/sql: a node handler or a function's builder never imports its caller, not even for a type
    (``flight.sql.rel``'s protocols and handler table stand between them)."""
    graph = grimp.build_graph("flight", exclude_type_checking_imports=False)
    sql = sorted(m for m in graph.modules if m.startswith("flight.sql"))
    circles = [
        f"{a} <-> {b}"
        for a in sql
        for b in graph.find_modules_directly_imported_by(a)
        if b.startswith("flight.sql") and a < b and graph.chain_exists(importer=b, imported=a)
    ]
    assert not circles, "\n".join(circles)


def test_no_private_name_is_imported_from_another_module() -> None:
    found = []
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("flight"):
                found += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, "\n".join(found)


def test_modules_and_functions_are_small() -> None:
    too_long = []
    for path in _modules():
        text = path.read_text()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{path.relative_to(ROOT)}: {lines} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}: {length} lines (at most {MAX_FUNCTION_LINES})")
    assert not too_long, "\n".join(too_long)


def _mapped() -> set[str]:
    """The modules docs/architecture.md's table names (``flight/...py`` in its first column)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    return set(re.findall(r"^\|\s*`(flight/[\w/]+\.py)`\s*\|", text, flags=re.MULTILINE))


def test_the_architecture_table_names_every_module_and_only_modules_that_exist() -> None:
    actual = {str(p.relative_to(ROOT)) for p in _modules()}
    mapped = _mapped()
    assert not actual - mapped, f"modules missing from docs/architecture.md's table: {sorted(actual - mapped)}"
    assert not mapped - actual, f"docs/architecture.md's table names modules that do not exist: {sorted(mapped - actual)}"
