"""Make ``import neuronxcc.nki`` and ``import nki`` resolve to :mod:`neuroncore.nki` where the real
Neuron packages are not installed, so a kernel file written for the real toolchain runs unchanged.

:func:`install` puts a finder first on ``sys.meta_path``; it claims a name only if no other finder
can import that top-level package (a real install always wins) and then hands out our modules
themselves under the aliased names, so ``nl.float32`` is one object whichever way it was imported.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Sequence

ALIASES = {
    "neuronxcc.nki": "neuroncore.nki",
    "neuronxcc.nki.language": "neuroncore.nki.language",
    "neuronxcc.nki.isa": "neuroncore.nki.isa",
    "neuronxcc.nki.typing": "neuroncore.nki.typing",
    "nki": "neuroncore.nki",
    "nki.language": "neuroncore.nki.language",
    "nki.isa": "neuroncore.nki.isa",
    "nki.typing": "neuroncore.nki.typing",
}
TOP_LEVEL = ("neuronxcc", "nki")


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str | None) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if self.target is None:  # the bare ``neuronxcc`` package: a namespace for ``.nki``
            module = types.ModuleType(spec.name, "neuronscope's stand-in for the Neuron compiler package")
            module.__path__ = []
            return module
        return importlib.import_module(self.target)

    def exec_module(self, module: types.ModuleType) -> None:
        return None


class NkiFinder(importlib.abc.MetaPathFinder):
    """Claims the NKI module names for which no real package is importable."""

    def __init__(self) -> None:
        self._real: dict[str, bool] = {}

    def _has_real(self, top: str) -> bool:
        if top not in self._real:
            others = [f for f in sys.meta_path if f is not self]
            found = False
            for finder in others:
                find = getattr(finder, "find_spec", None)
                if find is None:
                    continue
                try:
                    spec = find(top, None)
                except (ImportError, ValueError):
                    continue
                # a bare directory of that name (a namespace package) is not the real package
                if spec is not None and (
                    spec.origin not in (None, "namespace")
                    or (spec.loader is None and not spec.submodule_search_locations)
                ):
                    found = True
                    break
            self._real[top] = found
        return self._real[top]

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        top = fullname.split(".")[0]
        if top not in TOP_LEVEL or self._has_real(top):
            return None
        if fullname == "neuronxcc":
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(None), is_package=True)
        aliased = ALIASES.get(fullname)
        if aliased is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(aliased), is_package=aliased == "neuroncore.nki"
        )


_FINDER: NkiFinder | None = None


def install() -> NkiFinder:
    """Install the finder once (idempotent)."""
    global _FINDER
    if _FINDER is None:
        _FINDER = NkiFinder()
        sys.meta_path.insert(0, _FINDER)
    return _FINDER


def uninstall() -> None:
    global _FINDER
    if _FINDER is not None:
        if _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        for name in list(sys.modules):
            if name.split(".")[0] in TOP_LEVEL and getattr(sys.modules[name], "__name__", "").startswith(
                ("neuroncore.nki", "neuronxcc")
            ):
                del sys.modules[name]
        _FINDER = None


__all__ = ["ALIASES", "NkiFinder", "install", "uninstall"]
