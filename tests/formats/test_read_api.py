"""``formats.read_api``: the one read surface both viewers import, and nothing private besides."""

from __future__ import annotations

import ast
import importlib
import weakref
from pathlib import Path

import pytest

from formats import read_api

ROOT = Path(__file__).resolve().parents[2]
# what explorer may import from formats besides the read API: the CLI plumbing (subcommands, exit
# codes), which is not the read side
ALLOWED = {"formats.read_api", "formats.profile_commands"}
PENDING: set[str] = set()  # none left: the hierarchy renderers read through the API too


def _formats_imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "formats":
                found |= {f"formats.{alias.name}" for alias in node.names}
            elif node.module.startswith("formats."):
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name == "formats" or a.name.startswith("formats.")}
    return found


def test_explorer_reads_profiles_through_the_read_api_only() -> None:
    offenders = {}
    for path in sorted((ROOT / "explorer").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        if name in PENDING:
            continue
        extra = _formats_imports(path) - ALLOWED
        if extra:
            offenders[name] = sorted(extra)
    assert not offenders, f"explorer modules importing formats internals: {offenders}"


@pytest.mark.parametrize("name", read_api.__all__)
def test_every_name_of_the_read_api_is_its_home_modules(name: str) -> None:
    value = getattr(read_api, name)
    home = importlib.import_module(read_api._MODULE_OF[name])
    assert value is getattr(home, name)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Viewport'"):
        read_api.Viewport  # noqa: B018  (the old second viewport is gone)


def test_windows_and_levels_of_detail_keep_no_module_state() -> None:
    """Ownership is explicit: a viewer's ``TrackViewport`` holds its connection and levels of detail;
    no module keeps one per profile behind the caller's back (the old ``_VIEWPORTS``)."""
    from formats import lod, tracks

    for module in (lod, tracks):
        kinds = (dict, set, list, weakref.WeakKeyDictionary, weakref.WeakValueDictionary)
        state = [n for n, v in vars(module).items() if not n.startswith("__") and isinstance(v, kinds)]
        assert state == [] or set(state) <= {"ENGINE_LABELS"}, (module.__name__, state)
