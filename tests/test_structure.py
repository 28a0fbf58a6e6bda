"""The package's structure stays what the README's code layout says: no import
cycle (lazy imports included), no branch on a format's name outside
``formats/``, readers that never import the store, short functions and
classes, and no pointer to a document outside the repository."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

import windowkit as wk

PACKAGE = Path(wk.__file__).parent
MAX_FUNCTION_LINES = 60  # of code, docstring left out
MAX_CLASS_LINES = 200  # of code: docstrings, comments and blank lines left out


@cache
def _modules() -> dict[str, ast.Module]:
    """Every module of the package, parsed once per process (the per-module
    tests ask for it hundreds of times)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = ast.parse(path.read_text(), str(path))
    return out


def _imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """The windowkit modules a module imports at run time (not under TYPE_CHECKING)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue
            if isinstance(child, ast.ImportFrom) and (child.module or "").startswith("windowkit"):
                for alias in child.names:
                    sub = f"{child.module}.{alias.name}"
                    found.add(sub if sub in modules else str(child.module))
            elif isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name.startswith("windowkit"))
            visit(child)

    visit(tree)
    return found & modules


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, if there is any."""
    state: dict[str, int] = {}
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := walk(nxt)):
                return found
        state[node] = 2
        path.pop()
        return None

    for start in sorted(graph):
        if start not in state and (found := walk(start)):
            return found
    return None


def test_no_import_cycle_lazy_imports_included() -> None:
    modules = _modules()
    graph = {name: _imports(tree, set(modules)) - {name} for name, tree in modules.items()}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_readers_never_import_the_store() -> None:
    modules = _modules()
    for name, tree in modules.items():
        if name.startswith(("windowkit.readers", "windowkit.formats")):
            assert "windowkit.store" not in _imports(tree, set(modules)), name


def test_no_branch_on_a_format_name_outside_formats() -> None:
    names = set(wk.FORMAT_NAMES)
    for name, tree in _modules().items():
        if name.startswith("windowkit.formats"):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                constants = {c.value for c in ast.walk(node) if isinstance(c, ast.Constant)}
                assert not constants & names, f"{name}:{node.lineno} {ast.unparse(node)}"


@pytest.mark.parametrize("name", sorted(_modules()))
def test_functions_are_short(name: str) -> None:
    for node in ast.walk(_modules()[name]):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            has_doc = (isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                       and isinstance(body[0].value.value, str))
            first = body[1].lineno if has_doc and len(body) > 1 else body[0].lineno
            lines = (node.end_lineno or first) - first + 1
            assert lines <= MAX_FUNCTION_LINES, f"{name}.{node.name}: {lines} lines of code"


def _docstring_lines(node: ast.AST) -> set[int]:
    """The lines of every docstring inside ``node``."""
    lines: set[int] = set()
    for inner in ast.walk(node):
        body = getattr(inner, "body", None)
        if (isinstance(inner, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            lines.update(range(body[0].lineno, (body[0].end_lineno or body[0].lineno) + 1))
    return lines


@pytest.mark.parametrize("name", sorted(_modules()))
def test_classes_are_small(name: str) -> None:
    path = PACKAGE.parent / (name.replace(".", "/") + ".py")
    if not path.exists():
        path = PACKAGE.parent / name.replace(".", "/") / "__init__.py"
    source = path.read_text().splitlines()
    for node in ast.walk(_modules()[name]):
        if isinstance(node, ast.ClassDef):
            skip = _docstring_lines(node)
            code = [n for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
                    if n not in skip and source[n - 1].strip()
                    and not source[n - 1].strip().startswith("#")]
            assert len(code) <= MAX_CLASS_LINES, f"{name}.{node.name}: {len(code)} lines of code"


def test_docstrings_point_at_nothing_outside_the_repository() -> None:
    outside = ("DESIGN" + ".md", "DESIGN" + " \u00a7", "../" + "shared")
    for path in [*PACKAGE.rglob("*.py"), *Path(__file__).parent.rglob("*.py")]:
        text = path.read_text()
        assert not any(ref in text for ref in outside), path


READER_METHODS = {"tf_dataset", "keras_dataset", "torch_dataset", "grain_source", "grain_batches"}


def test_the_store_is_a_thin_facade() -> None:
    """``Store`` takes its readers from the readers' modules (which document
    their options once) and stays near 200 lines."""
    store = next(node for node in ast.walk(_modules()["windowkit.store"])
                 if isinstance(node, ast.ClassDef) and node.name == "Store")
    assert (store.end_lineno or store.lineno) - store.lineno + 1 <= 200
    own = {node.name for node in store.body if isinstance(node, ast.FunctionDef)}
    assert not own & READER_METHODS, "a reader's method defined in Store itself"
    import windowkit as wk

    assert set(dir(wk.Store)) >= READER_METHODS
