"""How tests share code, checked (tests/fixtures/__init__.py): shared inputs are ``tests.fixtures``
modules and conftest fixtures; no test module imports another test module or a conftest, nothing in
``tests/`` edits ``sys.path``, no frozen copy of our source sits among the test data, and no two test
modules share a basename."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.fixtures.samples import REPO

TESTS = REPO / "tests"


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def test_no_test_module_imports_a_test_module_or_a_conftest() -> None:
    bad = [
        f"{path.relative_to(REPO)}: {name}"
        for path in sorted(TESTS.rglob("*.py"))
        for name in _imports(path)
        if name.split(".")[-1].startswith("test_") or name.split(".")[-1] == "conftest"
        or (name.startswith("tests.") and not name.startswith("tests.fixtures"))
    ]
    assert bad == []


def _edits_sys_path(path: Path) -> bool:
    """A call of ``sys.path.<anything>`` (insert, append, extend ...) anywhere in the file."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        func = node.func if isinstance(node, ast.Call) else None
        if isinstance(func, ast.Attribute) and ast.unparse(func.value) == "sys.path":
            return True
    return False


def test_nothing_in_tests_edits_sys_path() -> None:
    assert [str(p.relative_to(REPO)) for p in sorted(TESTS.rglob("*.py")) if _edits_sys_path(p)] == []


def test_no_source_file_among_the_test_data() -> None:
    """Source the tests link to is written at test time (tests/fixtures/source_tree.py), not kept as a
    frozen copy that drifts from the file it copies."""
    copies = [p for p in sorted(TESTS.rglob("*.py")) if "data" in p.relative_to(TESTS).parts]
    assert [str(p.relative_to(REPO)) for p in copies] == []


def test_test_module_names_are_unique() -> None:
    """Test folders are not packages, so pytest imports each test module by its basename: two
    ``test_x.py`` in two folders stop the whole run at collection ("import file mismatch")."""
    seen: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
