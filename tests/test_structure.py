"""Structure rules of app/: no import circles, SQL only in app/ledger/, SQLAlchemy only where
Alembic needs it.

Imports are read from the source (every ``import`` anywhere in a module, function-local ones
included), so a circle hidden behind a lazy import counts too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "app"

#: SQL the way it is written in string constants: statements, advisory locks, notifications.
SQL = re.compile(
    r"\b(SELECT|INSERT INTO|UPDATE \w+ SET|DELETE FROM|pg_advisory\w*|pg_notify|LISTEN \w|"
    r"FOR UPDATE)\b"
)
#: Modules that may import SQLAlchemy: Alembic's runner and the table metadata it checks.
SQLALCHEMY_ALLOWED = {"app.schema", "app.ledger.tables", "app.db"}


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in APP.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _imports(name: str, path: Path) -> set[str]:
    """Return the app modules ``name`` imports (a package import counts as its __init__)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {m for m in found if m in MODULES and m != name}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Return the strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
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
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _parents(name: str) -> set[str]:
    """Return the packages above ``name`` (importing a module runs their __init__ first)."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))} & MODULES.keys()


def test_no_import_circles() -> None:
    graph = {name: _imports(name, path) - _parents(name) for name, path in MODULES.items()}
    assert _circles(graph) == []


def test_the_circle_check_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _docstrings(tree: ast.AST) -> set[int]:
    out: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = body[0] if body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


@pytest.mark.parametrize(
    "name", sorted(n for n in MODULES if not n.startswith("app.ledger"))
)
def test_sql_lives_in_the_ledger(name: str) -> None:
    tree = ast.parse(MODULES[name].read_text())
    skip = _docstrings(tree)
    found = [
        f"line {node.lineno}: {node.value.strip()[:60]}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in skip
        and SQL.search(node.value)
    ]
    assert found == [], f"SQL outside app/ledger in {name}"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_one_runtime_path_to_the_database(name: str) -> None:
    if name in SQLALCHEMY_ALLOWED:
        return
    tree = ast.parse(MODULES[name].read_text())
    imported = {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(m.split(".")[0] == "sqlalchemy" for m in imported), (
        f"{name} imports SQLAlchemy: runtime statements go through app.db.Database (asyncpg)"
    )


def _bench_imports(tree: ast.Module) -> list[ast.stmt]:
    """Return the import statements of ``tree`` that import the bench package."""
    return [
        node for node in ast.walk(tree)
        if (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "bench"
                                                 for a in node.names))
        or (isinstance(node, ast.ImportFrom) and not node.level
            and (node.module or "").split(".")[0] == "bench")
    ]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_app_never_imports_the_bench_at_module_level(name: str) -> None:
    tree = ast.parse(MODULES[name].read_text())
    found = _bench_imports(tree)
    # Only the CLI's bench dispatch reaches it, by an import inside the function.
    allowed = {id(n) for n in found if name == "app.cli" and n not in tree.body}
    assert [n.lineno for n in found if id(n) not in allowed] == []


def test_app_tests_never_import_the_bench() -> None:
    tests = ROOT / "tests"
    importing = [
        str(path.relative_to(ROOT)) for path in tests.rglob("*.py")
        if "bench" not in path.relative_to(tests).parts[:1]
        and _bench_imports(ast.parse(path.read_text()))
    ]
    assert importing == []
