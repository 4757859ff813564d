"""The settings registry (``neuronscope.settings``) is the only reader of ``NEURONSCOPE_*`` variables,
docs/settings.md lists exactly what it declares, and its parsing rules hold for every setting."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from neuronscope import settings

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("neuroncore", "collectors", "formats", "explorer", "neuronscope")
NAME = re.compile(r"\bNEURON(?:SCOPE)?_[A-Z][A-Z0-9_]*\b")
DECLARED = {s.name for s in settings.REGISTRY}


def _sources(*folders: str) -> list[Path]:
    return sorted(p for folder in folders for p in (ROOT / folder).rglob("*.py"))


def _is_environ(node: ast.AST) -> bool:
    """``os.environ`` (or a bare ``environ`` imported from os)."""
    return (isinstance(node, ast.Attribute) and node.attr == "environ") or (
        isinstance(node, ast.Name) and node.id == "environ")


def _env_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Reads of a literal variable name: os.environ.get/[...]/in, os.getenv."""
    found = []
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and (
                    func.attr == "getenv" or (func.attr in ("get", "pop") and _is_environ(func.value))):
                key = node.args[0]
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _is_environ(node.value):
            key = node.slice
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            key = node.left
        if isinstance(key, ast.Constant) and isinstance(key.value, str) and NAME.fullmatch(key.value):
            found.append((node.lineno, key.value))
    return found


def _literal_names(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants that are exactly a variable name (a private copy of the registry's)."""
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and NAME.fullmatch(n.value)]


def test_no_module_reads_a_neuronscope_variable_but_the_registry():
    offenders = []
    for path in _sources(*PACKAGES, "bench"):
        if path == ROOT / "neuronscope" / "settings.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        hits = _env_reads(tree)
        if path.parts[len(ROOT.parts)] in PACKAGES:  # packages keep no copy of a name either
            hits += _literal_names(tree)
        offenders += [f"{path.relative_to(ROOT)}:{line}: {name}" for line, name in hits
                      if name.startswith("NEURONSCOPE_") or name in DECLARED]
    assert offenders == []


def test_every_variable_mentioned_is_declared():
    mentioned: dict[str, str] = {}
    for path in [*_sources(*PACKAGES, "bench"), *sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]:
        for name in NAME.findall(path.read_text()):
            if name.startswith("NEURONSCOPE_"):
                mentioned.setdefault(name, str(path.relative_to(ROOT)))
    assert {n: where for n, where in mentioned.items() if n not in DECLARED} == {}


def test_docs_table_lists_exactly_the_registry():
    text = (ROOT / "docs" / "settings.md").read_text()
    rows = re.findall(r"^\| `([A-Z0-9_]+)` \|", text, flags=re.M)
    assert rows == [s.name for s in settings.REGISTRY]
    assert len(set(rows)) == len(rows)


def test_readers_named_in_the_registry_exist():
    for setting in settings.REGISTRY:
        for module in setting.readers:
            path = ROOT / (module.replace(".", "/") + ".py")
            assert path.is_file(), (setting.name, module)
            assert "settings." in path.read_text(), (setting.name, module)


def test_empty_is_unset_and_bad_values_name_the_variable():
    env = {"NEURONSCOPE_LIVE_DIR": "", "NEURONSCOPE_LIVE_PERIOD": "soon", "NEURONSCOPE_PLUGINS": "off"}
    assert settings.LIVE_DIR.get(env) is None and not settings.LIVE_DIR.is_set(env)
    assert settings.PLUGINS.get(env) is False and settings.IMDS.get(env) is True
    with pytest.raises(settings.SettingError, match=r"^NEURONSCOPE_LIVE_PERIOD='soon' is not a valid float"):
        settings.LIVE_PERIOD.get(env)
    assert settings.ROW_GROUP_ROWS.get({"NEURONSCOPE_ROW_GROUP_ROWS": "4096"}) == 4096
    with pytest.raises(settings.SettingError):
        settings.ROW_GROUP_ROWS.get({"NEURONSCOPE_ROW_GROUP_ROWS": "0"})
    assert settings.LIVE.get({}) is settings.LiveMode.AUTO
    assert settings.LIVE.get({"NEURONSCOPE_LIVE": "1"}) is settings.LiveMode.ON
    assert settings.by_name("NEURONSCOPE_LIVE") is settings.LIVE
